"""Compression as a rate: the density a user sets is the density every shard layout gets."""

import pytest
import torch
from transformers import T5ForConditionalGeneration

from hf_flexdemo import FlexDeMo
from hf_flexdemo.knobs import DEFAULT_CHUNK, DEFAULT_RATE
from hf_flexdemo.policies import CompressionPolicy
from hf_flexdemo.seq2seq.tiny_t5 import T5_VOCAB_SIZE, named_t5_config
from hf_flexdemo.wire.compression import kept_per_block
from hf_flexdemo.wire.dct import BlockLayout


def _t5_small_shapes() -> list[tuple[int, ...]]:
    with torch.device("meta"):
        model = T5ForConditionalGeneration(named_t5_config("t5-small", T5_VOCAB_SIZE))
    return [tuple(p.shape) for p in model.parameters()]


def _density(shapes: list[tuple[int, ...]], shard_size: int, chunk: int, rate: float | None = None,
             topk: int | None = None) -> float:
    """kept / total over every rank's FSDP2 shard (``torch.chunk`` along dim 0, as fully_shard splits)."""
    kept = total = 0
    for shape in shapes:
        for piece in torch.empty(shape, device="meta").chunk(shard_size, dim=0):
            if not piece.numel():
                continue
            layout = BlockLayout.for_shape(tuple(piece.shape), chunk)
            kept += layout.num_blocks * kept_per_block(layout.block_numel, rate, topk)
            total += piece.numel()
    return kept / total


@pytest.mark.parametrize("rate", [DEFAULT_RATE, 1 / 4, 1 / 16, 1 / 32])
def test_density_equals_rate_at_any_shard_size(rate):
    shapes = _t5_small_shapes()
    for shard_size in (1, 2, 4, 8):
        density = _density(shapes, shard_size, DEFAULT_CHUNK, rate=rate)
        assert density == pytest.approx(rate, rel=0.01), (shard_size, density)


def test_fixed_topk_density_moves_with_the_shard_size():
    """Why the rate exists: DeMo's fixed top-k per 64 x 64 block changes density with the shard shape."""
    shapes = _t5_small_shapes()
    assert _density(shapes, 8, 64, topk=4) > 1.2 * _density(shapes, 2, 64, topk=4)


def test_rate_and_topk_together_are_refused():
    with pytest.raises(ValueError, match=r"compression_rate=0.125 and compression_topk=4 are both set; accepted: one"):
        FlexDeMo(torch.nn.Linear(4, 4).parameters(), compression=CompressionPolicy(rate=0.125, topk=4))


@pytest.mark.parametrize("rate", [0.0, 1.5, -0.1])
def test_rate_out_of_range_is_refused(rate):
    with pytest.raises(ValueError, match=r"compression_rate=.*accepted: a float in \(0, 1\]"):
        FlexDeMo(torch.nn.Linear(4, 4).parameters(), compression=CompressionPolicy(rate=rate))
