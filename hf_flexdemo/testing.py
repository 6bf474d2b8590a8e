"""Tiny models and tasks for tests, as ``transformers.testing_utils`` is for transformers' own: what the
single-process tests, the worker scripts the multi-process tests launch and the benchmarks share, imported from the
installed package (a worker runs as a script and sees only its own folder, so a helper in ``tests/`` is out of its
reach without a path trick). ``import hf_flexdemo`` does not load it; transformers and datasets load on first call.

* :func:`tiny_t5`: the one tiny T5 the tests and workers train (vocabulary :data:`VOCAB_SIZE`).
* :func:`reverse_task`, :func:`fixed_batch`: a learnable toy task for it (output the input reversed), and 4 of its
  examples as one batch.
* :func:`unlike_inverse_dct`: inside it, this process's inverse DCT rounds like another GPU model's (one ulp off):
  a node of unlike hardware, emulated on CPU.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .wire.dct import BlockLayout

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import T5ForConditionalGeneration

__all__ = ["VOCAB_SIZE", "fixed_batch", "reverse_task", "tiny_t5", "unlike_inverse_dct"]

VOCAB_SIZE = 32


def tiny_t5() -> T5ForConditionalGeneration:
    """A 2 + 2-layer T5 of width 32 without dropout, initialised identically on every call and rank.

    Declared not to consume the Trainer's loss kwargs (T5's loss is a token mean that ignores
    ``num_items_in_batch``), the arithmetic the distributed tests' runs were written with;
    ``FlexDeMoTrainer.compute_loss`` gives the same loss without the declaration
    (tests/integration/test_trainer_options.py).
    """
    from transformers import T5ForConditionalGeneration

    from .seq2seq.tiny_t5 import tiny_t5_config

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(tiny_t5_config(VOCAB_SIZE, d_model=32, num_layers=2, num_heads=4, d_ff=64))
    model.accepts_loss_kwargs = False
    return model


def reverse_task(n: int) -> Dataset:
    """Learnable toy task: output the input tokens reversed (``n`` examples of 8 tokens, the same on every call)."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB_SIZE, (n, 8), generator=g)
    return Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.flip(1).tolist()})


def fixed_batch() -> dict[str, torch.Tensor]:
    """The first 4 examples of :func:`reverse_task` as one batch."""
    ids = torch.tensor(reverse_task(4)["input_ids"])
    return {"input_ids": ids, "labels": ids.flip(1)}


@contextlib.contextmanager
def unlike_inverse_dct(fraction: float, seed: int) -> Iterator[None]:
    """Inside, this process's blockwise inverse DCT (the decode of the consensus and the error feedback's estimate)
    rounds as another GPU model's GEMMs do: ``fraction`` of its non-zero outputs move one ulp up or down at random
    (``torch.nextafter``); an exact zero, where nothing was sent, stays zero on any hardware. Enter it on the ranks
    of the node that is to differ."""
    original = BlockLayout.idct
    generator = torch.Generator().manual_seed(seed)

    def idct(self: BlockLayout, c: Tensor, out: Tensor, scratch: Tensor) -> Tensor:
        result = original(self, c, out, scratch)
        draw = torch.rand(result.shape, generator=generator)
        direction = torch.where(draw < fraction / 2, -math.inf, math.inf).to(result.dtype)
        return result.copy_(torch.where((draw < fraction) & (result != 0), torch.nextafter(result, direction), result))

    BlockLayout.idct = idct
    try:
        yield
    finally:
        BlockLayout.idct = original
