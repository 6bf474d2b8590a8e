"""The blockwise DCT: orthonormal, equal to scipy per block, sparse synthesis equal to the dense inverse."""

import pytest
import scipy.fft
import torch

from hf_flexdemo.dct import BlockLayout, dct_basis, idct2, largest_divisor, synthesize


def _dct(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    return layout.dct(x, out=torch.empty_like(x), scratch=torch.empty_like(x))


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_basis_is_orthonormal(n):
    d = dct_basis(n, torch.device("cpu"), torch.float64)
    torch.testing.assert_close(d @ d.T, torch.eye(n, dtype=torch.float64))


@pytest.mark.parametrize(
    ("shape", "chunk", "block"),
    [((96, 40), 32, (32, 20)), ((7, 5), 64, (7, 5)), ((130,), 64, (1, 26)), ((509, 3), 64, (1, 3)),
     ((6, 4, 4), 8, (6, 8))],
)
def test_layout_picks_largest_divisors(shape, chunk, block):
    layout = BlockLayout.for_shape(shape, chunk)
    assert layout.block == block
    assert largest_divisor(509, 64) == 1


@pytest.mark.parametrize("shape", [(96, 40), (3, 64, 10), (130,)])
def test_matches_scipy_per_block(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64)
    layout = BlockLayout.for_shape(shape, 32)
    coefficients = layout.blocks(_dct(x.unsqueeze(0).contiguous(), layout))
    signal = layout.blocks(x.unsqueeze(0).contiguous())
    for i in range(layout.grid[0]):
        for j in range(layout.grid[1]):
            expected = scipy.fft.dctn(signal[0, i, j].numpy(), type=2, norm="ortho")
            torch.testing.assert_close(coefficients[0, i, j], torch.from_numpy(expected))


def test_inverse_of_forward_is_identity():
    torch.manual_seed(0)
    x = torch.randn(4, 96, 40)
    layout = BlockLayout.for_shape((96, 40), 32)
    blocks = layout.blocks(_dct(x, layout)).reshape(-1, *layout.block)
    restored = idct2(blocks).view(4, *layout.grid, *layout.block).transpose(2, 3).reshape(x.shape)
    torch.testing.assert_close(restored, x, atol=1e-5, rtol=1e-5)


def test_sparse_synthesis_equals_dense_inverse():
    torch.manual_seed(0)
    indices = torch.stack([torch.randperm(12 * 10)[:5] for _ in range(6)])
    values = torch.randn(6, 5, dtype=torch.float64)
    dense = torch.zeros(6, 120, dtype=torch.float64).scatter_(1, indices, values).view(6, 12, 10)
    torch.testing.assert_close(synthesize(indices, values, (12, 10)), idct2(dense))
