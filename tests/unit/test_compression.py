"""Selection of the kept coefficients, the rate, and DeMo's mean-over-choosers decode."""

import subprocess
import sys

import pytest
import torch

from hf_flexdemo.wire import compression
from hf_flexdemo.wire.dct import BlockLayout


def _coefficients(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    return layout.dct(x, out=torch.empty_like(x), scratch=torch.empty_like(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_topk_selects_largest_magnitudes_of_every_block(dtype):
    torch.manual_seed(0)
    layout = BlockLayout.for_shape((16, 24), 8)
    c = _coefficients(torch.randn(3, 16, 24, dtype=torch.float64), layout).to(dtype)
    c[0, 0, :3] = torch.tensor([-float("inf"), -1e3, -0.0])  # the ranking is by magnitude, the sign is ignored
    blocks = layout.blocks(c).reshape(-1, layout.block_numel)
    indices = compression.select_topk(c, layout, 5, magnitude=torch.empty_like(c))
    assert indices.shape == (3 * 6, 5)
    assert torch.equal(indices.sort(dim=1).values, blocks.abs().topk(5, dim=1).indices.sort(dim=1).values)
    assert {0, 1} <= set(indices[0].tolist())
    positions, values = compression.gather(c, layout, indices)
    assert torch.equal(values, blocks.gather(1, indices))
    assert positions.shape == (3 * 6 * 5,)


def test_random_positions_are_distinct_and_reproducible():
    layout = BlockLayout.for_shape((16, 24), 8)
    draw = [compression.select_random(layout, 2, 8, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(draw[0], draw[1])
    assert all(len(set(row.tolist())) == 8 for row in draw[0])
    other = compression.select_random(layout, 2, 8, torch.Generator().manual_seed(8))
    assert not torch.equal(draw[0], other)


@pytest.mark.parametrize(("numel", "rate", "topk", "kept"),
                         [(64, 1 / 8, None, 8), (64, 1 / 1024, None, 1), (6, 1 / 16, None, 1), (64, None, 4, 4),
                          (4, None, 9, 4), (256, 1 / 16, None, 16)])
def test_kept_per_block(numel, rate, topk, kept):
    assert compression.kept_per_block(numel, rate, topk) == kept


@pytest.mark.parametrize("replicas", [1, 3])
def test_decode_is_mean_over_choosers(replicas):
    """Reference: DeMo's scatter_reduce(mean, include_self=False) over all replicas, then the inverse DCT."""
    torch.manual_seed(0)
    layout = BlockLayout.for_shape((16, 24), 8)
    k, count = 6, 2
    blocks = count * layout.num_blocks
    indices = [torch.stack([torch.randperm(64)[:k] for _ in range(blocks)]) for _ in range(replicas)]
    values = torch.randn(replicas, blocks * k)
    positions = torch.stack([layout.flat_positions(count, i).view(-1) for i in indices])
    out = torch.empty(count, 16, 24)
    dense = compression.scatter_mean(positions, values, out=out, counts=torch.empty_like(out))
    expected = torch.zeros(count * 16 * 24).scatter_reduce(
        0, positions.view(-1), values.view(-1), reduce="mean", include_self=False)
    torch.testing.assert_close(dense.view(-1), expected)


def test_decode_over_replicas_is_the_sum_over_all_replicas_divided_by_their_count():
    """``consensus="replicas"``: a replica that kept a coefficient back counts as 0, so a coefficient one replica of R
    sends enters Q with 1/R of its value (DeMo's mean over choosers gives it all of it)."""
    torch.manual_seed(0)
    layout = BlockLayout.for_shape((16, 24), 8)
    k, count, replicas = 6, 2, 3
    blocks = count * layout.num_blocks
    indices = [torch.stack([torch.randperm(64)[:k] for _ in range(blocks)]) for _ in range(replicas)]
    values = torch.randn(replicas, blocks * k)
    positions = torch.stack([layout.flat_positions(count, i).view(-1) for i in indices])
    dense = compression.scatter_mean(positions, values, out=torch.empty(count, 16, 24), counts=None,
                                     consensus="replicas")
    expected = torch.zeros(count * 16 * 24).index_add_(0, positions.view(-1), values.view(-1)) / replicas
    torch.testing.assert_close(dense.view(-1), expected)
    once = positions[0][~torch.isin(positions[0], positions[1:].reshape(-1))][:1]  # chosen by replica 0 alone
    assert once.numel() == 1
    assert dense.view(-1)[once].item() == pytest.approx(values[0][positions[0] == once].item() / replicas)


def test_index_bits():
    assert [compression.index_bits(n) for n in (1, 2, 6, 64, 65, 256, 257, 1024, 4096, 4097)] == \
        [1, 1, 3, 6, 7, 8, 9, 10, 12, 13]


@pytest.mark.parametrize(("block_numel", "k", "bitmask"),
                         [(64, 10, False), (64, 11, True), (64, 64, True), (4096, 4, False), (4096, 64, False),
                          (1024, 64, False), (1024, 256, True), (4096, 1024, True), (6, 1, False), (6, 3, True),
                          (33, 5, False), (65536, 3, False)])
def test_positions_travel_in_the_smaller_form_and_round_trip(block_numel, k, bitmask):
    """Indices pack at ceil(log2(block)) bits (64 of 64 x 64: 96 bytes, not the bitmask's 512), a bitmask when
    smaller; both decode to the positions sent."""
    torch.manual_seed(0)
    indices = torch.rand(50, block_numel).topk(k, dim=1, sorted=False).indices
    wire, order = compression.encode_positions(indices, block_numel)
    assert compression.uses_bitmask(block_numel, k) is bitmask
    bits = (block_numel - 1).bit_length()
    assert wire.nbytes == 50 * min(-(-block_numel // 8), -(-k * bits // 8)) == 50 * compression.position_bytes(
        block_numel, k)
    if bitmask:  # a bitmask carries the values in ascending index order
        mask = compression.decode_mask(wire.unsqueeze(0), block_numel)[0]
        assert torch.equal(mask, torch.zeros(50, block_numel, dtype=torch.bool).scatter_(1, indices, True))
        assert torch.equal(order, indices.sort(dim=1).values)
    else:
        assert torch.equal(compression.unpack_indices(wire.unsqueeze(0), block_numel, k)[0], indices)
        assert order is indices


def test_sixty_four_of_a_64_by_64_block_in_int2_cost_under_a_quarter_bit_per_element():
    """12-bit indices, 64 two-bit values and a bfloat16 scale: 96 + 16 + 2 bytes per 4,096 elements."""
    assert compression.block_payload_bytes(4096, 64, "int2") == 114
    assert compression.block_payload_bytes(4096, 64, "int2") * 8 / 4096 == pytest.approx(0.2227, abs=1e-4)


@pytest.mark.parametrize("value_dtype", ["bfloat16", "float32", "float8"])
def test_values_on_the_wire(value_dtype):
    """The wire's bytes equal ``block_payload_bytes``; float8 keeps every value within e4m3's rounding (3 mantissa
    bits: 1/16 relative) of the block's scale, and an all-zero block stays zero."""
    torch.manual_seed(0)
    values = (torch.randn(40, 16) * torch.logspace(-6, 2, 40).unsqueeze(1)).bfloat16()
    values[3] = 0
    pieces = compression.encode_values(values, value_dtype)
    positions, _ = compression.encode_positions(torch.arange(16).expand(40, 16), 64)
    assert positions.nbytes + sum(p.nbytes for p in pieces) == 40 * compression.block_payload_bytes(64, 16, value_dtype)
    decoded = compression.decode_values([p.unsqueeze(0) for p in pieces])[0].float()
    assert decoded.shape == values.shape
    if value_dtype != "float8":
        assert torch.equal(decoded, values.float())
        return
    largest = values.float().abs().amax(dim=1, keepdim=True)
    assert torch.all((decoded - values.float()).abs() <= values.float().abs() / 16 + largest * 2.0**-9 / 448 * 1.01)
    assert torch.equal(decoded[3], torch.zeros(16))


@pytest.mark.parametrize("consensus", ["choosers", "replicas"])
def test_bitmask_decode_equals_the_index_decode(consensus):
    torch.manual_seed(0)
    layout = BlockLayout.for_shape((16, 24), 8)
    k, count, replicas = 20, 2, 3
    blocks = count * layout.num_blocks
    wire = [compression.encode_positions(torch.rand(blocks, 64).topk(k, dim=1).indices, 64) for _ in range(replicas)]
    indices = torch.stack([order for _, order in wire])
    values = torch.randn(replicas, blocks, k)
    positions = torch.stack([layout.flat_positions(count, i).view(-1) for i in indices])
    expected = compression.scatter_mean(positions, values.flatten(1), out=torch.empty(count, 16, 24),
                                        counts=torch.empty(count, 16, 24), consensus=consensus)
    bitmasks = torch.stack([bitmask for bitmask, _ in wire])
    dense = compression.scatter_masked(bitmasks, [values], layout, out=torch.empty(count, 16, 24),
                                       scratch=torch.empty(count, 16, 24), counts=torch.empty(count, 16, 24),
                                       consensus=consensus)
    torch.testing.assert_close(dense, expected, rtol=0, atol=0)


@pytest.mark.parametrize("consensus", ["choosers", "replicas"])
@pytest.mark.parametrize(("replicas", "own"), [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)])
def test_own_row_added_by_index_gives_the_bits_of_its_bitmask(consensus, replicas, own):
    """A replica adds its own row from the positions it holds: the same bits as decoding its bitmask, whichever
    row it is, with zeros of both signs among the values (a -0 must decode as the bitmask's +0)."""
    torch.manual_seed(0)
    layout = BlockLayout.for_shape((16, 24), 8)
    k, count = 20, 2
    blocks = count * layout.num_blocks
    wire = [compression.encode_positions(torch.rand(blocks, 64).topk(k, dim=1).indices, 64) for _ in range(replicas)]
    bitmasks = torch.stack([bitmask for bitmask, _ in wire])
    values = torch.randn(replicas, blocks, k)
    values[:, :, ::5], values[:, :, 1::7] = -0.0, 0.0
    positions = layout.flat_positions(count, wire[own][1]).view(-1)

    def decode(own_row: tuple[int, torch.Tensor] | None) -> torch.Tensor:
        return compression.decode(bitmasks, [values], layout, out=torch.empty(count, 16, 24),
                                  scratch=torch.empty(count, 16, 24), counts=torch.empty(count, 16, 24),
                                  consensus=consensus, own=own_row)

    assert torch.equal(decode((own, positions)).view(torch.int32), decode(None).view(torch.int32))


_DECODE_64 = """
import resource, sys, torch
from hf_flexdemo.wire import compression
from hf_flexdemo.wire.dct import BlockLayout
torch.manual_seed(0)
chunk, rate, value_dtype, replicas = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], 64
layout = BlockLayout.for_shape((512, 2048), chunk)  # 1M elements
k = compression.kept_per_block(layout.block_numel, rate, None)
wire = []
for _ in range(replicas):
    indices = torch.rand(layout.num_blocks, layout.block_numel).topk(k, dim=1).indices
    wire.append([compression.encode_positions(indices, layout.block_numel)[0],
                 *compression.encode_values(torch.randn(layout.num_blocks, k), value_dtype)])
where, *pieces = [torch.stack(piece) for piece in zip(*wire)]
del wire
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = torch.empty(1, 512, 2048)
compression.decode(where, pieces, layout, out=out, scratch=torch.empty_like(out), counts=torch.empty_like(out))
layout.idct(out, out=torch.empty_like(out), scratch=torch.empty_like(out))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, sum(t.nbytes for t in (where, *pieces)))
"""


@pytest.mark.parametrize(("chunk", "rate", "value_dtype"),
                         [(32, 5 / 16, "float8"), (8, 1 / 4, "bfloat16"), (64, 1 / 16, "bfloat16")])
def test_decode_memory_is_linear_in_replicas_times_k(chunk, rate, value_dtype):
    """R = 64 replicas at the densest swept setting (5/16 of 32 x 32, float8: bitmask positions), 1/4 of 8 x 8
    (bitmasks too) and 1/16 of 64 x 64 (12-bit indices): the decode's peak memory beyond the received payload stays a
    few dense buffers plus a few payloads (O(numel + R * blocks * k)), where a pairwise comparison of chosen indices
    would need blocks * (R * k)^2 bytes of booleans (1.07e10 at 1/4 of 8 x 8)."""
    numel = 512 * 2048
    script = [sys.executable, "-c", _DECODE_64, str(chunk), str(rate), value_dtype]
    peak, payload = map(int, subprocess.run(script, capture_output=True, text=True, check=True).stdout.split())
    assert peak < 6 * numel * 4 + 4 * payload, f"decode peak {peak / 2**20:.1f} MiB, payload {payload / 2**20:.1f} MiB"
