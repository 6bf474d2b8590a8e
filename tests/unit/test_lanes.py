"""Codes in int32 lanes with headroom: an all-reduce's sum of the lanes is the code-wise sum, exactly, at any number
of replicas; bytes travel in lanes unchanged."""

from __future__ import annotations

import pytest
import torch

from hf_flexdemo.wire import lanes


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 8, 64, 1000])
@pytest.mark.parametrize("k", [1, 5, 64, 257])
def test_the_sum_of_packed_lanes_is_the_sum_of_the_codes(bits, replicas, k):
    g = torch.Generator().manual_seed(replicas * 1000 + k)
    codes = torch.randint(0, 2**bits, (replicas, 7, k), generator=g, dtype=torch.uint8)
    codes[0, 0] = 2**bits - 1  # one row at the largest sum every replica can make
    codes[:, 0] = 2**bits - 1
    summed = sum(lanes.pack(c, bits, replicas).long() for c in codes)  # int64: what int32 would hold, unclipped
    assert summed.max() < 2**31  # the sign bit stays clear: no replica count overflows a lane
    got = lanes.unpack(summed.to(torch.int32), k, bits, replicas)
    assert torch.equal(got, codes.int().sum(0))
    assert got.shape == (7, k) and lanes.pack(codes[0], bits, replicas).shape == (7, lanes.lanes_for(k, bits, replicas))


@pytest.mark.parametrize(("replicas", "width", "fields"), [(2, 3, 10), (4, 4, 7), (8, 5, 6), (64, 8, 3)])
def test_fields_are_as_wide_as_the_sum(replicas, width, fields):
    """2-bit codes: R codes sum to at most 3R, bit_length(3R) bits."""
    assert lanes.field_width(2, replicas) == width and lanes.fields_per_lane(2, replicas) == fields


def test_too_many_replicas_for_a_lane_is_refused():
    with pytest.raises(ValueError, match="wider than an int32 lane"):
        lanes.fields_per_lane(4, 2**28)


@pytest.mark.parametrize("count", [1, 4, 130])
def test_bytes_travel_in_lanes_unchanged(count):
    data = torch.randint(0, 256, (3, count), dtype=torch.uint8, generator=torch.Generator().manual_seed(count))
    lanes_of = lanes.from_bytes(data)
    assert lanes_of.dtype == torch.int32 and lanes_of.shape == (3, lanes.byte_lanes(count))
    others = torch.zeros_like(lanes_of)
    assert torch.equal(lanes.to_bytes(lanes_of + others + others, count), data)  # one writer, the rest zeros
