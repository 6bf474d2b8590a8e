"""Issue 21 §1: a block's float8 scale is never zero, subnormal or so large that a decoded value overflows, so
finite coefficients decode to finite values at any magnitude, through the decode the optimizer runs; and what the
receivers decode is exactly what the sender's error feedback subtracts."""


import pytest
import torch

from hf_flexdemo import FlexDeMo
from hf_flexdemo.policies import from_knobs
from hf_flexdemo.wire import compression
from hf_flexdemo.wire.dct import BlockLayout


# FlexDeMo in its step-wise mode (an exchange every step), which these tests pin; a local_steps= argument
# overrides it.
def step_wise(params, **knobs):
    """FlexDeMo in the step-wise mode, its knobs spelt flat (FlexDeMoConfig's names)."""
    return FlexDeMo(params, **from_knobs({"local_steps": 1, **knobs}))

MAGNITUDES = {"1e-45": 1e-45, "1e-39": 1e-39, "1e-30": 1e-30, "1": 1.0, "1e30": 1e30}
# (shape, chunk, kept per block): indices and bitmasks, and a shard smaller than a block (3 x 5 < 8 x 8)
LAYOUTS = [((16, 24), 8, 4), ((16, 24), 8, 16), ((3, 5), 8, 1), ((3, 5), 8, 4)]
REPLICAS, COUNT = 3, 2


def _values(blocks: int, k: int, case: str, generator: torch.Generator) -> torch.Tensor:
    """``(blocks, k)`` float32 values: every block at one magnitude, all zeros, or (``"mixed"``) the blocks cycling
    through the magnitudes and zero; every block keeps some exact zeros (kept zeros were what decoded to 0/0)."""
    values = torch.randn(blocks, k, generator=generator, dtype=torch.float64)
    if case == "zero":
        return torch.zeros(blocks, k)
    scales = list(MAGNITUDES.values()) + [0.0] if case == "mixed" else [MAGNITUDES[case]]
    values *= torch.tensor([scales[b % len(scales)] for b in range(blocks)], dtype=torch.float64).unsqueeze(1)
    values[:, ::3] = 0.0
    return values.float()


def _payload(layout: BlockLayout, k: int, value_dtype: str, case: str, seed: int) -> tuple[list, torch.Tensor]:
    """One replica's wire pieces (positions first) and its flat positions, as ``FlexDeMo._select`` and
    ``_feedback`` build them: values in the transform dtype, positions in wire order."""
    generator = torch.Generator().manual_seed(seed)
    blocks = COUNT * layout.num_blocks
    indices = torch.rand(blocks, layout.block_numel, generator=generator).topk(k, dim=1).indices
    wire, order = compression.encode_positions(indices, layout.block_numel)
    values = _values(blocks, k, case, generator).to(compression.transform_dtype(value_dtype))
    return [wire, *compression.encode_values(values, value_dtype)], layout.flat_positions(COUNT, order).view(-1)


def _dense(layout: BlockLayout) -> torch.Tensor:
    return torch.empty(COUNT, *layout.shape)


def _sent(layout: BlockLayout, wire: list, positions: torch.Tensor) -> torch.Tensor:
    """The coefficients the sender's error feedback subtracts (``FlexDeMo._feedback``)."""
    values = compression.decode_values(wire[1:]).view(1, -1)
    return compression.scatter_mean(positions.unsqueeze(0), values, out=_dense(layout), counts=None)


def _received(layout: BlockLayout, k: int, wires: list[list], consensus: str) -> torch.Tensor:
    """The consensus coefficients every receiver decodes from the gathered wires (``FlexDeMo._decode``)."""
    where, *pieces = [torch.stack(piece) for piece in zip(*wires)]
    counts = _dense(layout) if consensus == "choosers" and len(wires) > 1 else None
    return compression.decode(where, pieces, layout, out=_dense(layout), scratch=_dense(layout), counts=counts,
                              consensus=consensus)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


@pytest.mark.parametrize("consensus", ["choosers", "replicas"])
@pytest.mark.parametrize("value_dtype", ["bfloat16", "float32", "float8", "int4", "int2"])
@pytest.mark.parametrize("case", [*MAGNITUDES, "zero", "mixed"])
@pytest.mark.parametrize(("shape", "chunk", "k"), LAYOUTS)
def test_every_magnitude_decodes_finite_and_as_the_sender_subtracted(shape, chunk, k, case, value_dtype, consensus):
    layout = BlockLayout.for_shape(shape, chunk)
    payloads = [_payload(layout, k, value_dtype, case, seed) for seed in range(REPLICAS)]
    wires = [wire for wire, _ in payloads]
    sent = [_sent(layout, wire, positions) for wire, positions in payloads]
    for replica, (wire, _) in enumerate(payloads):
        # A single replica's payload decodes, on the receiving side, to exactly what its sender subtracted:
        # the same bits, and after the inverse DCT the same signal.
        alone = _received(layout, k, [wire], consensus)
        assert torch.isfinite(alone).all()
        assert torch.equal(_bits(alone), _bits(sent[replica]))
        signals = [layout.idct(x, out=_dense(layout), scratch=_dense(layout)) for x in (alone, sent[replica])]
        assert torch.isfinite(signals[0]).all() and torch.equal(_bits(signals[0]), _bits(signals[1]))
    combined = _received(layout, k, wires, consensus)
    assert torch.isfinite(combined).all()
    # The consensus is the senders' subtracted coefficients combined: their sum over the choosers or over R.
    total = sent[0].clone()
    for other in sent[1:]:
        total.add_(other)
    if consensus == "replicas":
        expected = total / REPLICAS
    else:
        chosen = torch.zeros(_dense(layout).numel())
        for _, positions in payloads:
            chosen.index_add_(0, positions, torch.ones(positions.numel()))
        expected = total / chosen.clamp(min=1).view_as(total)
    assert torch.equal(combined, expected)


@pytest.mark.parametrize("largest", [0.0, 1e-45, 1e-39, 2e-38, 5e-36, 1e-30, 1.0, 1e30, 1e37, 3.0e38,
                                     torch.finfo(torch.float32).max])
def test_float8_scale_is_normal_and_decodes_finite(largest):
    """The scale is a normal bfloat16 no larger than ``146 * 2**112`` (448 times it stays below float32's max), so
    a block ``[largest, -largest, 0, largest / 3, ...]`` decodes finite, its zeros exact zeros, at either end."""
    values = torch.tensor([[largest, -largest, 0.0, largest / 3, largest * 1e-3, -0.0, largest / 448, 0.0]])
    wire, scale = compression.encode_values(values, "float8")
    assert 2.0**-126 <= scale.float().item() <= 146 * 2.0**112
    assert torch.isfinite(wire.float()).all()
    decoded = compression.decode_values([wire, scale])
    assert torch.isfinite(decoded).all()
    assert decoded[0, 2] == 0 and decoded[0, 5] == 0 and decoded[0, 7] == 0
    # e4m3's rounding: 1/16 relative, and half its smallest step (2**-9) times the scale below its normals
    error = (decoded.double() - values.double()).abs()
    assert torch.all(error <= values.double().abs() / 16 + scale.double() * 2.0**-10)


def test_scale_bounds_are_bfloat16_values():
    assert torch.tensor(compression._SCALE_MAX).bfloat16().float().item() == compression._SCALE_MAX
    assert compression._SCALE_MAX * compression._FP8_MAX <= torch.finfo(torch.float32).max
    assert torch.tensor(compression._SCALE_MIN).bfloat16().float().item() == compression._SCALE_MIN == 2.0**-126


@pytest.mark.parametrize("consensus", ["choosers", "replicas"])
@pytest.mark.parametrize("value_dtype", ["bfloat16", "float32", "float8", "int4", "int2"])
def test_a_momentum_block_near_1e_39_keeps_parameters_finite(value_dtype, consensus):
    """End to end on one process: the momentum of one 8 x 8 block is ~1e-39 (momentum="lr" adds lr * g, no decay),
    the other block's is ~1. Its kept coefficients include exact zeros; with a zero scale they decoded to 0/0."""
    weight = torch.nn.Parameter(torch.zeros(16, 8))
    opt = step_wise([weight], lr=1.0, replicator="none", value_dtype=value_dtype, consensus=consensus,
                   momentum="lr", update="sgd", momentum_decay=0.0, compression_chunk=8, compression_rate=0.25,
                   drift_check_every=0)
    for step in range(3):
        grad = torch.zeros(16, 8)
        grad[:8] = torch.randn(8, 8, generator=torch.Generator().manual_seed(step))
        grad[8:] = 1e-39  # a constant block: its DCT is the DC coefficient, the other 15 kept are zeros
        weight.grad = grad
        opt.step()
        assert opt.skipped_steps == 0
        assert torch.isfinite(weight).all(), weight
    assert weight[:8].abs().sum() > 0
