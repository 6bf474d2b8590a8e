"""Top-k selection, error feedback and DeMo's mean-over-choosers decode."""

import pytest
import torch

from hf_flexdemo import compression
from hf_flexdemo.dct import BlockLayout, idct2


def _compress(x, layout, k, dtype=torch.float32):
    coefficients = layout.dct(x, out=torch.empty_like(x), scratch=torch.empty_like(x))
    blocks = layout.blocks(coefficients).reshape(-1, layout.block_numel).clone()
    indices, values, estimate = compression.compress(
        coefficients, layout, k, dtype, magnitude=torch.empty_like(x), estimate=torch.empty_like(x)
    )
    return blocks, indices, values, estimate.clone()


def test_selects_largest_magnitudes_and_estimates_them():
    torch.manual_seed(0)
    layout = BlockLayout.for_shape((16, 24), 8)
    x = torch.randn(3, 16, 24)
    blocks, indices, values, estimate = _compress(x, layout, 5)
    assert indices.dtype == torch.int16 and indices.shape == (3 * 6, 5)
    expected = blocks.abs().topk(5, dim=1).indices.sort(dim=1).values
    assert torch.equal(indices.long().sort(dim=1).values, expected)
    torch.testing.assert_close(values, blocks.gather(1, indices.long()))
    dense = torch.zeros_like(blocks).scatter_(1, indices.long(), values).view(-1, 8, 8)
    torch.testing.assert_close(estimate, idct2(dense), atol=1e-6, rtol=1e-5)


def test_full_topk_estimate_is_the_signal():
    layout = BlockLayout.for_shape((16, 24), 8)
    x = torch.randn(2, 16, 24)
    _, _, _, estimate = _compress(x, layout, 64)
    restored = estimate.view(2, *layout.grid, 8, 8).transpose(2, 3).reshape(x.shape)
    torch.testing.assert_close(restored, x, atol=1e-5, rtol=1e-5)


def test_bfloat16_values_travel_rounded_and_estimate_uses_rounded_values():
    layout = BlockLayout.for_shape((8, 8), 8)
    x = torch.randn(1, 8, 8)
    _, indices, values, estimate = _compress(x, layout, 3, torch.bfloat16)
    assert values.dtype == torch.bfloat16
    dense = torch.zeros(1, 64).scatter_(1, indices.long(), values.float()).view(1, 8, 8)
    torch.testing.assert_close(estimate, idct2(dense), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("k", [2, 40])  # sparse synthesis path and dense scatter + IDCT path
def test_decode_is_mean_over_choosers(k):
    """Reference: DeMo's scatter_reduce(mean, include_self=False) over all replicas, then IDCT."""
    torch.manual_seed(0)
    replicas, blocks, block = 3, 5, (8, 8)
    indices = torch.stack([torch.stack([torch.randperm(64)[:k] for _ in range(blocks)]) for _ in range(replicas)])
    values = torch.randn(replicas, blocks, k)
    dense = torch.zeros(blocks, 64).scatter_reduce(
        1, indices.transpose(0, 1).reshape(blocks, -1), values.transpose(0, 1).reshape(blocks, -1),
        reduce="mean", include_self=False,
    )
    expected = idct2(dense.view(blocks, *block))
    torch.testing.assert_close(compression.decode(indices.short(), values, block), expected, atol=1e-6, rtol=1e-5)


def test_index_dtype_boundary():
    assert compression.index_dtype(181 * 181) == torch.int16
    assert compression.index_dtype(32768) == torch.int16
    assert compression.index_dtype(32769) == torch.int32
