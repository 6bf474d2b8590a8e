"""The blockwise DCT: orthonormal, equal to scipy per block, its inverse the identity; block positions."""

import pytest
import scipy.fft
import torch

from hf_flexdemo.wire.dct import BlockLayout, dct_basis, largest_divisor


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


@pytest.mark.parametrize(("shape", "chunk"), [((96, 40), 32), ((130,), 64), ((3, 64, 10), 8), ((5, 7), 8)])
def test_inverse_of_forward_is_identity(shape, chunk):
    torch.manual_seed(0)
    x = torch.randn(4, *shape, dtype=torch.float64)
    layout = BlockLayout.for_shape(shape, chunk)
    restored = layout.idct(_dct(x, layout), out=torch.empty_like(x), scratch=torch.empty_like(x))
    torch.testing.assert_close(restored, x)


def test_inverse_matches_scipy_per_block():
    torch.manual_seed(0)
    c = torch.randn(2, 16, 24, dtype=torch.float64)
    layout = BlockLayout.for_shape((16, 24), 8)
    signal = layout.blocks(layout.idct(c, out=torch.empty_like(c), scratch=torch.empty_like(c)))
    blocks = layout.blocks(c)
    for index in [(0, 0, 0), (1, 1, 2)]:
        expected = scipy.fft.idctn(blocks[index].numpy(), type=2, norm="ortho")
        torch.testing.assert_close(signal[index], torch.from_numpy(expected))


def test_flat_positions_address_the_blocks():
    torch.manual_seed(0)
    layout = BlockLayout.for_shape((16, 24), 8)
    x = torch.randn(3, 16, 24)
    indices = torch.randint(0, 64, (3 * layout.num_blocks, 5))
    blocks = layout.blocks(x).reshape(-1, layout.block_numel)
    assert torch.equal(x.reshape(-1)[layout.flat_positions(3, indices)], blocks.gather(1, indices))


def test_no_transform_is_the_identity():
    x = torch.randn(2, 96, 40, dtype=torch.float64)
    layout = BlockLayout.for_shape((96, 40), 32, "none")
    assert torch.equal(_dct(x, layout), x)
    assert torch.equal(layout.idct(x, out=torch.empty_like(x), scratch=torch.empty_like(x)), x)
