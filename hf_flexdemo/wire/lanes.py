"""Small unsigned codes that an all-reduce sums: fields of int32 lanes with headroom for the sum.

Each of ``R`` replicas writes its codes below ``2**bits`` into fields :func:`field_width` bits wide, wide enough
for the sum of ``R`` codes, so a field's sum never carries into the next and an int32 all-reduce (sum) of the
lanes is the code-wise sum. ``31 // width`` fields fill a lane and its sign bit stays clear, so no lane's sum
overflows. At 2-bit codes a field is 3 bits wide at ``R = 2``, 4 at 4 and 5 at 8: 10, 7 and 6 codes per lane.

Bytes that one replica alone writes (the others writing zeros) travel in the same lanes: their sum is the bytes.
"""

from __future__ import annotations

import torch
from torch import Tensor


def field_width(bits: int, replicas: int) -> int:
    """Bits of a field that holds the sum of ``replicas`` codes below ``2**bits``."""
    return ((2**bits - 1) * replicas).bit_length()


def fields_per_lane(bits: int, replicas: int) -> int:
    """Codes one int32 lane carries for ``replicas`` (the sign bit left clear)."""
    fields = 31 // field_width(bits, replicas)
    if fields < 1:
        raise ValueError(f"{replicas} replicas of {bits}-bit codes need fields wider than an int32 lane.")
    return fields


def lanes_for(count: int, bits: int, replicas: int) -> int:
    """Lanes of ``count`` codes."""
    return -(-count // fields_per_lane(bits, replicas))


def pack(codes: Tensor, bits: int, replicas: int) -> Tensor:
    """``(N, lanes_for(k))`` int32 lanes of ``(N, k)`` codes, the first code in the lowest field."""
    count, k = codes.shape
    fields, width = fields_per_lane(bits, replicas), field_width(bits, replicas)
    padded = codes.new_zeros((count, lanes_for(k, bits, replicas) * fields), dtype=torch.int32)
    padded[:, :k] = codes
    fielded = padded.view(count, -1, fields)
    lanes = fielded[..., 0].clone()
    for field in range(1, fields):
        lanes.bitwise_or_(fielded[..., field].bitwise_left_shift(width * field))
    return lanes


def unpack(lanes: Tensor, k: int, bits: int, replicas: int) -> Tensor:
    """The ``(N, k)`` int32 code sums that summed ``lanes`` of :func:`pack` hold."""
    fields, width = fields_per_lane(bits, replicas), field_width(bits, replicas)
    shifts = torch.arange(0, width * fields, width, dtype=torch.int32, device=lanes.device)
    sums = lanes.unsqueeze(-1).bitwise_right_shift(shifts).bitwise_and_(2**width - 1)
    return sums.view(lanes.shape[0], -1)[:, :k]


def byte_lanes(count: int) -> int:
    """Lanes of ``count`` bytes."""
    return -(-count // 4)


def from_bytes(data: Tensor) -> Tensor:
    """``(N, byte_lanes(b))`` int32 lanes holding ``(N, b)`` uint8 bytes (zero-padded)."""
    padded = data.new_zeros((data.shape[0], byte_lanes(data.shape[1]) * 4))
    padded[:, : data.shape[1]] = data
    return padded.view(torch.int32)


def to_bytes(lanes: Tensor, count: int) -> Tensor:
    """The first ``count`` bytes of each row of ``lanes`` (:func:`from_bytes`' inverse)."""
    return lanes.contiguous().view(torch.uint8)[:, :count]
