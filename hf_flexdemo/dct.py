"""Chunked orthonormal DCT-II on 2-D blocks.

A tensor is viewed as a matrix (a vector is a ``1 x n`` matrix, higher ranks fold their trailing
dimensions) and cut into ``n1 x n2`` blocks, ``n1``/``n2`` being the largest divisors of each
dimension not above the chunk size. Each block is transformed with ``C = D1 X D2^T`` where ``D`` is
the orthonormal DCT-II matrix, so the inverse is ``X = D1^T C D2`` and a sparse set of coefficients
can be synthesised without a dense inverse transform.

Coefficients stay in the matrix layout (block ``(i, j)`` occupies the same rows and columns as its
signal), so the forward transform is two GEMMs over the stacked shards and no copy into a block
layout is needed; :meth:`BlockLayout.blocks` is a strided view of the blocks.
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

    @classmethod
    def for_shape(cls, shape: tuple[int, ...], chunk: int) -> BlockLayout:
        rows, cols = as_matrix_shape(tuple(shape))
        return cls(tuple(shape), (largest_divisor(rows, chunk), largest_divisor(cols, chunk)))

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
        (g1, g2), (n1, n2) = self.grid, self.block
        cols = self.matrix[1]
        block = torch.arange(count * g1 * g2, device=indices.device).unsqueeze(1)
        row = (block // g2) * n1 + indices // n2  # (stacked) matrix row
        return row * cols + (block % g2) * n2 + indices % n2

    def dct(self, x: Tensor, out: Tensor, scratch: Tensor) -> Tensor:
        """Blockwise forward DCT of a contiguous ``(P, *shape)`` tensor into ``out`` (matrix layout).

        ``out`` and ``scratch`` are contiguous buffers of ``x``'s shape and dtype; ``scratch`` is
        clobbered. Two GEMMs: every row against ``D2``, then ``D1`` against every block row.
        """
        (n1, n2), cols = self.block, self.matrix[1]
        target = out if n1 == 1 else scratch
        torch.matmul(x.reshape(-1, n2), dct_basis(n2, x.device, x.dtype).T, out=target.view(-1, n2))
        if n1 > 1:
            rows = scratch.view(-1, n1, cols)
            left = dct_basis(n1, x.device, x.dtype).expand(rows.shape[0], n1, n1)  # bmm: no broadcast copy
            torch.bmm(left, rows, out=out.view(-1, n1, cols))
        return out


def idct2(coefficients: Tensor) -> Tensor:
    """Inverse DCT of every block of ``(N, n1, n2)`` dense coefficients."""
    n1, n2 = coefficients.shape[-2:]
    out = coefficients @ dct_basis(n2, coefficients.device, coefficients.dtype)
    if n1 > 1:
        out = dct_basis(n1, coefficients.device, coefficients.dtype).T @ out
    return out


def synthesize(indices: Tensor, values: Tensor, block: tuple[int, int], out: Tensor | None = None) -> Tensor:
    """Inverse transform of sparse coefficients without materialising the dense coefficient block.

    ``indices``/``values`` are ``(N, m)``: flat positions inside each ``n1 x n2`` block and their
    coefficients. Duplicate positions add up. Costs ``N * n1 * n2 * m`` multiply-adds, against
    ``N * n1 * n2 * (n1 + n2)`` for scatter plus a dense :func:`idct2`. Writes into ``out`` if given.
    """
    n1, n2 = block
    indices = indices.long()
    rows = dct_basis(n1, values.device, values.dtype)[indices // n2]  # (N, m, n1)
    cols = dct_basis(n2, values.device, values.dtype)[indices % n2]  # (N, m, n2)
    return torch.matmul((rows * values.unsqueeze(-1)).transpose(1, 2), cols, out=out)
