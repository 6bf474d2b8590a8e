"""DeMo's momentum compression: which coefficients of each DCT block travel, and how replicas' payloads decode.

A payload is, per block, ``k`` flat positions and their coefficients. ``k`` follows from a rate (the
fraction of each block that travels, the same at any shard shape) or from DeMo's fixed top-``k``.

* ``select_topk`` picks the ``k`` coefficients of largest magnitude in every block (``replicator="demo"``);
* ``select_random`` picks ``k`` positions per block from a generator every replica seeds identically, so
  only the values need to travel (``replicator="random"``);
* ``scatter_mean`` turns the payloads of all replicas into one dense coefficient tensor: with DeMo's
  semantics (``over="choosers"``) a coefficient chosen by some replicas takes the mean over those that chose
  it (``scatter_reduce(mean, include_self=False)``); with ``over="replicas"`` it takes the sum over all ``R``
  replicas' payloads divided by ``R``, each replica counting 0 where it kept the coefficient back. Error
  feedback sends what a replica held back later, so the second is the replicas' mean momentum spread over
  time, where the first counts a coefficient that one replica of ``R`` sends ``R`` times. Replicas are
  added one at a time in a fixed order, so every replica computes bit-identical results from the same
  gathered payload, and the memory is that of the dense coefficients plus the payload: ``O(numel + R * blocks * k)``.

Everything stays in the matrix layout of :class:`~hf_flexdemo.dct.BlockLayout`: a dense coefficient
tensor goes back to a signal with :meth:`BlockLayout.idct` (two GEMMs).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from .dct import BlockLayout

Consensus = Literal["choosers", "replicas"]
CONSENSUSES: tuple[str, ...] = get_args(Consensus)


def index_dtype(block_numel: int) -> torch.dtype:
    """Smallest integer type that holds a flat position inside a block (int16 up to 181 x 181)."""
    return torch.int16 if block_numel <= torch.iinfo(torch.int16).max + 1 else torch.int32


def kept_per_block(block_numel: int, rate: float | None, topk: int | None) -> int:
    """Coefficients kept in a block of ``block_numel``: ``topk``, or ``rate * block_numel`` rounded, at least 1."""
    k = topk if topk is not None else round(rate * block_numel)
    return max(1, min(k, block_numel))


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def select_topk(coefficients: Tensor, layout: BlockLayout, k: int, magnitude: Tensor) -> Tensor:
    """``(N, k)`` flat in-block positions of the ``k`` largest ``|C|`` of every block of ``(P, *shape)``.

    ``magnitude`` is a scratch buffer of the coefficients' size and dtype (blocks are copied into it
    contiguously). The ranking runs on the bit patterns with the sign bit cleared: for IEEE floats of one
    sign the integer order is the magnitude order (NaN above inf, as in a float ranking), and ``topk`` over
    integers is about 1.6x faster on CPU than over bfloat16 (``benchmarks/selection.py``).
    """
    bits = _SAME_WIDTH_INT[coefficients.element_size()]
    blocks = layout.blocks(coefficients).view(bits)
    magnitude = magnitude.view(bits).view(blocks.shape)
    torch.bitwise_and(blocks, torch.iinfo(bits).max, out=magnitude)
    return magnitude.view(-1, layout.block_numel).topk(k, dim=1, sorted=False).indices


def select_random(layout: BlockLayout, count: int, k: int, generator: torch.Generator) -> Tensor:
    """``(N, k)`` distinct random in-block positions for ``count`` stacked tensors, from ``generator``."""
    scores = torch.rand(count * layout.num_blocks, layout.block_numel, generator=generator,
                        device=generator.device)
    return scores.topk(k, dim=1, sorted=False).indices


def gather(
    coefficients: Tensor, layout: BlockLayout, indices: Tensor, value_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``(positions, values)``: flat positions in ``coefficients`` of in-block ``indices``, and the
    coefficients there, rounded to ``value_dtype`` as they travel."""
    positions = layout.flat_positions(coefficients.shape[0], indices).view(-1)
    return positions, coefficients.reshape(-1)[positions].to(value_dtype)


def scatter_mean(
    positions: Tensor, values: Tensor, out: Tensor, counts: Tensor | None, over: Consensus = "choosers"
) -> Tensor:
    """Dense ``out`` holding, at every position some replica chose, the mean of the chosen values over the
    replicas that chose it (``over="choosers"``) or over all of them (``"replicas"``).

    ``positions``/``values`` are ``(R, M)``: each row one replica's flat positions (unique within the
    row) and values. ``counts`` is a scratch buffer of ``out``'s size (unused, may be ``None``, when
    ``R == 1`` or ``over="replicas"``). Rows are added in order, so the result does not depend on the
    device's scheduling.
    """
    flat = out.view(-1).zero_()
    for where, value in zip(positions, values):
        flat.index_add_(0, where, value.to(out.dtype))
    if over == "replicas":
        return out.div_(positions.shape[0])
    if positions.shape[0] > 1:
        chooser = counts.view(-1).zero_()
        ones = torch.ones(positions.shape[1], dtype=out.dtype, device=out.device)
        for where in positions:
            chooser.index_add_(0, where, ones)
        flat.div_(chooser.clamp_(min=1))
    return out
