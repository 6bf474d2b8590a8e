"""Low-bit wire values: ``value_dtype="int4"`` and ``"int2"``, uniform and symmetric with one scale per block.

A block's ``k`` values become codes ``c`` in ``[0, 2**bits)`` standing for ``(c - offset) * scale``, where
``offset = (2**bits - 1) / 2``: a mid-rise grid (+-0.5, +-1.5 scales at 2 bits; +-0.5 ... +-7.5 at 4 bits)
that spends every code on a magnitude, since the values sent are each block's largest. The scale maps the
block's largest magnitude to the outermost level and travels in bfloat16; it is never below bfloat16's
smallest normal, so no block decodes to 0 * inf or a subnormal, and never so large that the outermost level
overflows float32, so finite values always decode finite. Codes are packed ``8 / bits`` to a byte.

The wire pieces are ``[codes, scale, shape]``: ``shape`` is an empty ``(0, bits, k)`` tensor (zero bytes on the
wire) that tells :func:`decode` the width and the count of values, as the pieces of the other value types
tell theirs by their own dtype and shape. The sender's error feedback subtracts :func:`decode` of its own
pieces, the function every receiver runs, so what is sent and what is subtracted are the same bits.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

WIDTHS: dict[str, int] = {"int4": 4, "int2": 2}
SCALE_DTYPE = torch.bfloat16
_SMALLEST_SCALE = torch.finfo(SCALE_DTYPE).tiny  # bfloat16's smallest normal
# Below float32's largest by more than bfloat16's rounding (2**-8), so the outermost level times the rounded scale
# stays finite.
_LARGEST_LEVEL = torch.finfo(torch.float32).max * (1 - 2**-7)


def _offset(bits: int) -> float:
    return (2**bits - 1) / 2


def pack(codes: Tensor, bits: int) -> Tensor:
    """``(..., n)`` uint8 codes below ``2**bits`` packed ``8 // bits`` to a byte, the first in the low bits (``n`` a
    multiple of ``8 // bits``): the int4/int2 values here and the positions' bitmask (``bits=1``)."""
    lanes = codes.view(*codes.shape[:-1], -1, 8 // bits)
    packed = lanes[..., 0].clone()
    for lane in range(1, 8 // bits):
        packed.bitwise_or_(lanes[..., lane] << (bits * lane))
    return packed


# The 8 // bits codes of one byte, their bytes read as one integer.
_LANES_AS: dict[int, torch.dtype] = {1: torch.int64, 2: torch.int32, 4: torch.int16}


@functools.lru_cache(maxsize=16)
def _unpack_table(bits: int, device: torch.device) -> Tensor:
    """``(256,)``: for each byte value, its ``8 // bits`` codes (uint8, the first from the low bits) as one integer."""
    codes = (torch.arange(256).unsqueeze(1) >> torch.arange(0, 8, bits)) & (2**bits - 1)
    return codes.to(torch.uint8).view(_LANES_AS[bits]).view(256).to(device)


def unpack(packed: Tensor, bits: int) -> Tensor:
    """The ``(..., 8 // bits * bytes)`` uint8 codes of :func:`pack`: one table lookup per byte (on CPU ~4x faster
    for bitmasks than shifting every code out)."""
    codes = _unpack_table(bits, packed.device).index_select(0, packed.reshape(-1).int())
    return codes.view(torch.uint8).view(*packed.shape[:-1], packed.shape[-1] * (8 // bits))


def payload_bytes(k: int, value_dtype: str) -> int:
    """Wire bytes of one block's ``k`` values and its scale."""
    per_byte = 8 // WIDTHS[value_dtype]
    return -(-k // per_byte) + SCALE_DTYPE.itemsize


def scale_of(values: Tensor, bits: int) -> Tensor:
    """The ``(N, 1)`` bfloat16 scale of ``(N, k)`` values: each row's largest magnitude at the outermost level."""
    offset = _offset(bits)
    largest = values.abs().amax(dim=1, keepdim=True).float()
    return (largest / offset).clamp_(min=_SMALLEST_SCALE, max=_LARGEST_LEVEL / offset).to(SCALE_DTYPE)


def codes_at(values: Tensor, scale: Tensor, bits: int) -> Tensor:
    """``(N, k)`` uint8 codes of ``values`` on the grid of the ``(N, 1)`` ``scale``; a value past the outermost level
    takes it. A zero scale (nothing agreed yet) gives codes that :func:`levels` decodes to zeros."""
    # float32 division: a bfloat16 ``values`` is promoted as it is read, without a float32 copy first
    step = scale.float().clamp(min=_SMALLEST_SCALE)
    return torch.div(values, step).add_(_offset(bits)).round_().clamp_(0, 2**bits - 1).to(torch.uint8)


def levels(codes: Tensor, scale: Tensor, bits: int) -> Tensor:
    """The float32 values that ``codes`` (any integer type, or a mean of codes) stand for at ``scale``."""
    return codes.float().sub_(_offset(bits)).mul_(scale.float())


def encode(values: Tensor, value_dtype: str) -> list[Tensor]:
    """The wire pieces (``[codes, scale, shape]``, see the module docstring) of ``(N, k)`` values."""
    bits = WIDTHS[value_dtype]
    count, k = values.shape
    per_byte = 8 // bits
    scale = scale_of(values, bits)
    codes = codes_at(values, scale, bits)
    if k % per_byte:
        codes = torch.cat([codes, codes.new_zeros(count, per_byte - k % per_byte)], dim=1)
    return [pack(codes, bits), scale, values.new_empty((0, bits, k), dtype=torch.uint8)]


def decode(pieces: list[Tensor]) -> Tensor:
    """The float32 values of :func:`encode`'s pieces, ``(..., N, k)`` for any leading dimensions."""
    packed, scale, shape = pieces
    bits, k = shape.shape[-2:]
    return levels(unpack(packed, bits)[..., :k], scale, bits)


def count(pieces: list[Tensor]) -> int:
    """Values per block that ``pieces`` carry."""
    return pieces[2].shape[-1]
