"""Chunked orthonormal DCT-II on 2-D blocks.

A tensor is viewed as a matrix (a vector is a ``1 x n`` matrix, higher ranks fold their trailing
dimensions) and cut into ``n1 x n2`` blocks, ``n1``/``n2`` being the largest divisors of each
dimension not above the chunk size. Each block is transformed with ``C = D1 X D2^T`` where ``D`` is
the orthonormal DCT-II matrix, so the inverse is ``X = D1^T C D2`` and a sparse set of coefficients
is the same two GEMMs with transposed bases.

Coefficients stay in the matrix layout (block ``(i, j)`` occupies the same rows and columns as its
signal), so the forward and the inverse transform are two GEMMs each over the stacked shards and no
copy into a block layout is needed; :meth:`BlockLayout.blocks` is a strided view of the blocks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor


@functools.lru_cache(maxsize=64)
def dct_basis(n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """Orthonormal DCT-II matrix ``D`` (``n x n``): row ``k`` is the ``k``-th basis vector."""
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    basis[0] /= math.sqrt(2.0)
    return basis.to(device=device, dtype=dtype)


def largest_divisor(n: int, limit: int) -> int:
    """Largest divisor of ``n`` that is at most ``limit`` (1 when ``n`` is 0)."""
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


def as_matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The 2-D view used for blocking: vectors become ``1 x n``, trailing dims are folded."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    return shape[0], math.prod(shape[1:])


@dataclass(frozen=True)
class BlockLayout:
    """How tensors of ``shape`` are cut into ``block = (n1, n2)`` chunks for the transform."""

    shape: tuple[int, ...]
    block: tuple[int, int]
    transform: str = "dct"  # "none": the blocks' values themselves are the coefficients (no DCT)

    @classmethod
    def for_shape(cls, shape: tuple[int, ...], chunk: int, transform: str = "dct") -> BlockLayout:
        rows, cols = as_matrix_shape(tuple(shape))
        return cls(tuple(shape), (largest_divisor(rows, chunk), largest_divisor(cols, chunk)), transform)

    @property
    def matrix(self) -> tuple[int, int]:
        return as_matrix_shape(self.shape)

    @property
    def grid(self) -> tuple[int, int]:
        """Number of blocks along the rows and along the columns."""
        rows, cols = self.matrix
        return rows // self.block[0], cols // self.block[1]

    @property
    def block_numel(self) -> int:
        return self.block[0] * self.block[1]

    @property
    def num_blocks(self) -> int:
        return self.grid[0] * self.grid[1]

    def blocks(self, x: Tensor) -> Tensor:
        """Strided view ``(P, g1, g2, n1, n2)`` of the blocks of a contiguous ``(P, *shape)`` tensor."""
        (g1, g2), (n1, n2) = self.grid, self.block
        return x.view(-1, g1, n1, g2, n2).transpose(2, 3)

    def flat_positions(self, count: int, indices: Tensor) -> Tensor:
        """Positions in a flattened ``(count, *shape)`` tensor of per-block flat ``indices`` ``(N, k)``."""
        corners, offsets = _position_tables(self, count, indices.device)
        # index_select, not offsets[indices]: advanced indexing is ~3x slower on CPU
        return offsets.index_select(0, indices.reshape(-1).long()).view(indices.shape).add_(corners)

    def dct(self, x: Tensor, out: Tensor, scratch: Tensor) -> Tensor:
        """Blockwise forward DCT ``C = D1 X D2^T`` of a contiguous ``(P, *shape)`` tensor into ``out`` (``x`` itself
        for ``transform="none"``: the values are the coefficients, no copy).

        ``out`` and ``scratch`` are contiguous buffers of ``x``'s shape and dtype; ``scratch`` is clobbered.
        """
        return self._transform(x, out, scratch, inverse=False)

    def idct(self, c: Tensor, out: Tensor, scratch: Tensor) -> Tensor:
        """Blockwise inverse DCT ``X = D1^T C D2`` of ``(P, *shape)`` coefficients (matrix layout) into ``out``
        (``c`` itself for ``transform="none"``)."""
        return self._transform(c, out, scratch, inverse=True)

    def _transform(self, x: Tensor, out: Tensor, scratch: Tensor, inverse: bool) -> Tensor:
        """Two GEMMs: every row against ``D2`` (or ``D2^T``), then ``D1`` (or ``D1^T``) against every block row;
        ``x`` as it is for ``transform="none"`` (callers read the result, never ``out``)."""
        if self.transform == "none":
            return x
        (n1, n2), cols = self.block, self.matrix[1]
        right, left = dct_basis(n2, x.device, x.dtype), dct_basis(n1, x.device, x.dtype)
        right, left = (right, left.T) if inverse else (right.T, left)
        target = out if n1 == 1 else scratch
        torch.matmul(x.reshape(-1, n2), right, out=target.view(-1, n2))
        if n1 > 1:
            rows = scratch.view(-1, n1, cols)
            torch.bmm(left.expand(rows.shape[0], n1, n1), rows, out=out.view(-1, n1, cols))  # bmm: no broadcast copy
        return out


@functools.lru_cache(maxsize=256)
def _position_tables(layout: BlockLayout, count: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(N, 1)`` flat position of every block's first element, and ``(n1 * n2,)`` in-block offsets."""
    (g1, g2), (n1, n2) = layout.grid, layout.block
    cols = layout.matrix[1]
    block = torch.arange(count * g1 * g2, device=device).unsqueeze(1)
    corners = (block // g2) * n1 * cols + (block % g2) * n2
    inside = torch.arange(n1 * n2, device=device)
    return corners, (inside // n2) * cols + inside % n2
