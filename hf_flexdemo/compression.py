"""DeMo's momentum compression: per-block DCT top-k selection and the decode of several replicas.

``compress`` picks, in every block, the ``k`` DCT coefficients of largest magnitude and returns the
signal they represent (what leaves the local momentum by error feedback). ``decode`` turns the
payloads of all replicas into one update with DeMo's semantics: a coefficient chosen by some
replicas takes the mean over those that chose it. The sum runs in a fixed replica order, so every
replica computes bit-identical results from the same gathered payload.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .dct import BlockLayout, idct2, synthesize


def index_dtype(block_numel: int) -> torch.dtype:
    """Smallest integer type that holds a flat position inside a block (int16 up to 181 x 181)."""
    return torch.int16 if block_numel <= torch.iinfo(torch.int16).max + 1 else torch.int32


def inverse_sparse(
    indices: Tensor, values: Tensor, block: tuple[int, int], out: Tensor | None = None
) -> Tensor:
    """Signal of ``(N, R, k)`` sparse coefficients summed over ``R`` (positions unique per ``R`` row).

    Small ``R * k`` synthesises the basis functions directly; large ``R * k`` scatters into a dense
    coefficient block (one replica at a time, so no two writes race) and runs :func:`idct2`.
    The result lands in ``out`` (``(N, n1, n2)``) when given.
    """
    num_blocks, replicas, k = indices.shape
    n1, n2 = block
    if replicas * k < n1 + n2:
        return synthesize(indices.reshape(num_blocks, -1), values.reshape(num_blocks, -1), block, out)
    coefficients = values.new_zeros(num_blocks, n1 * n2)
    indices = indices.long()
    for r in range(replicas):
        coefficients.scatter_add_(1, indices[:, r], values[:, r])
    signal = idct2(coefficients.view(num_blocks, n1, n2))
    return signal if out is None else out.copy_(signal)


def compress(
    coefficients: Tensor, layout: BlockLayout, k: int, value_dtype: torch.dtype, magnitude: Tensor, estimate: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``k`` coefficients of each block of ``(P, *shape)`` DCT coefficients (matrix layout).

    Returns ``(indices, values, estimate)``: ``(N, k)`` flat positions inside each block
    (``index_dtype``), the coefficients rounded to ``value_dtype`` as they travel, and the
    ``(N, n1, n2)`` signal those rounded values represent, in ``estimate``'s dtype (float32:
    error feedback subtracts exactly what the receivers decode). ``magnitude`` and ``estimate`` are
    scratch buffers of the coefficients' size.
    """
    blocks = layout.blocks(coefficients)
    magnitude = magnitude.view(blocks.shape)
    torch.abs(blocks, out=magnitude)
    indices = magnitude.view(-1, layout.block_numel).topk(k, dim=1, sorted=False).indices
    positions = layout.flat_positions(coefficients.shape[0], indices)
    values = coefficients.reshape(-1)[positions].to(value_dtype)
    estimate = inverse_sparse(
        indices.unsqueeze(1), values.unsqueeze(1).to(estimate.dtype), layout.block,
        out=estimate.view(-1, *layout.block),
    )
    return indices.to(index_dtype(layout.block_numel)), values, estimate


def decode(indices: Tensor, values: Tensor, block: tuple[int, int], out: Tensor | None = None) -> Tensor:
    """Mean-over-choosers signal of ``(R, N, k)`` payloads from ``R`` replicas -> ``(N, n1, n2)``."""
    indices = indices.long().transpose(0, 1)
    values = values.float().transpose(0, 1)
    flat = indices.flatten(1)
    choosers = (flat.unsqueeze(2) == flat.unsqueeze(1)).sum(-1).view_as(values)
    return inverse_sparse(indices, values / choosers, block, out)
