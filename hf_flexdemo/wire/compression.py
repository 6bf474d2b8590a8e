"""Which share of each block travels (its values, or its DCT coefficients), and how replicas' payloads decode.

A payload is, per block, the positions of ``k`` coefficients and their values. ``k`` follows from a rate (the
fraction of each block that travels, the same at any shard shape) or from DeMo's fixed top-``k``.

On the wire (``replicator="demo"``), a block's positions are ``k`` in-block indices packed at
``ceil(log2(block_numel))`` bits each (6 in an 8 x 8 block, 10 in 32 x 32, 12 in 64 x 64) or, when smaller, a
bitmask of the block (one bit per coefficient): at the default 1/4 of 32 x 32 the bitmask is 128 bytes against
320 of indices; at 64 of a 64 x 64 block the indices are 96 bytes against the bitmask's 512, so 64 int2 values
with their scale cost 0.22 bits per element in all. Values are ``bfloat16``, ``float32``, or
``float8``: e4m3 with one bfloat16 scale per block that maps the block's largest magnitude to e4m3's largest (a
normal number at any magnitude, so finite values decode finite), so a coefficient costs one byte; ``int4``/``int2``
pack 2 or 4 values per byte with a scale per block (:mod:`hf_flexdemo.wire.quantize`). The sender's error feedback
subtracts the values as they arrive, so what rounding loses is sent later.

* ``select_topk`` picks the ``k`` coefficients of largest magnitude in every block (``replicator="demo"``);
* ``select_random`` picks ``k`` positions per block from a generator every replica seeds identically, so
  only the values need to travel (``replicator="random"``);
* ``scatter_mean`` turns the payloads of all replicas into one dense coefficient tensor: with DeMo's
  semantics (``consensus="choosers"``) a coefficient chosen by some replicas takes the mean over those that chose
  it (``scatter_reduce(mean, include_self=False)``); with ``consensus="replicas"`` it takes the sum over all ``R``
  replicas' payloads divided by ``R``, each replica counting 0 where it kept the coefficient back. Error
  feedback sends what a replica held back later, so the second is the replicas' mean momentum spread over
  time, where the first counts a coefficient that one replica of ``R`` sends ``R`` times. Replicas are
  added one at a time in a fixed order, so every replica computes bit-identical results from the same
  gathered payload, and the memory is that of the dense coefficients plus the payload: ``O(numel + R * blocks * k)``;
* ``scatter_masked`` is the same decode for positions that travel as bitmasks.

Everything stays in the matrix layout of :class:`~hf_flexdemo.wire.dct.BlockLayout`: a dense coefficient
tensor goes back to a signal with :meth:`BlockLayout.idct` (two GEMMs).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..knobs import Consensus
from . import quantize
from .dct import BlockLayout

VALUE_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32,
                                        "float8": torch.float8_e4m3fn}
_FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
_SCALE_DTYPE = torch.bfloat16  # float8's per-block scale


def _bfloat16_floor(x: float) -> float:
    """The largest bfloat16 value not above positive normal ``x`` (bfloat16 keeps 8 significant bits)."""
    mantissa, exponent = math.frexp(x)  # x = mantissa * 2**exponent, 0.5 <= mantissa < 1
    return math.ldexp(math.floor(math.ldexp(mantissa, 8)), exponent - 8)


# float8's per-block scale lies in [_SCALE_MIN, _SCALE_MAX]: never zero or subnormal (a block of zeros or of
# magnitudes below ~2e-38 would otherwise divide 0 by 0), and never so large that e4m3's 448 times it
# overflows float32 (both bounds are bfloat16 values, so rounding the scale to bfloat16 keeps it inside).
_SCALE_MIN = torch.finfo(_SCALE_DTYPE).tiny  # 2**-126, bfloat16's (and float32's) smallest normal
_SCALE_MAX = _bfloat16_floor(torch.finfo(torch.float32).max / _FP8_MAX)  # 146 * 2**112: 448 * it < float32's max


def index_bits(block_numel: int) -> int:
    """Bits of a flat position inside a block: ``ceil(log2(block_numel))``, at least 1 (10 in 32 x 32)."""
    return max(1, (block_numel - 1).bit_length())


def _index_bytes(block_numel: int, k: int) -> int:
    """Bytes of a block's ``k`` packed indices: ``ceil(k * index_bits / 8)``."""
    return -(-k * index_bits(block_numel) // 8)


def _bitmask_bytes(block_numel: int) -> int:
    """Bytes of a block's bitmask: one bit per coefficient, ``ceil(block_numel / 8)``."""
    return -(-block_numel // 8)


def uses_bitmask(block_numel: int, k: int) -> bool:
    """Whether a block's positions travel as a bitmask: when its bytes beat ``k`` packed indices'."""
    return _bitmask_bytes(block_numel) < _index_bytes(block_numel, k)


def position_bytes(block_numel: int, k: int) -> int:
    """Wire bytes of one block's positions: the smaller of its bitmask and its ``k`` packed indices."""
    return min(_bitmask_bytes(block_numel), _index_bytes(block_numel, k))


def block_payload_bytes(block_numel: int, k: int, value_dtype: str) -> int:
    """Wire bytes of one block: positions (indices or bitmask), ``k`` values and float8's scale."""
    positions = position_bytes(block_numel, k)
    if value_dtype in quantize.WIDTHS:
        return positions + quantize.payload_bytes(k, value_dtype)
    scale = _SCALE_DTYPE.itemsize if value_dtype == "float8" else 0
    return positions + k * VALUE_DTYPES[value_dtype].itemsize + scale


def transform_dtype(value_dtype: str) -> torch.dtype:
    """The dtype the DCT and the selection run in: the wire's, bfloat16 for float8, int4 and int2 (scaled as they are
    encoded)."""
    return VALUE_DTYPES[value_dtype] if value_dtype in ("bfloat16", "float32") else torch.bfloat16


def kept_per_block(block_numel: int, rate: float | None, topk: int | None) -> int:
    """Coefficients kept in a block of ``block_numel``: ``topk``, or ``rate * block_numel`` rounded, at least 1."""
    k = topk if topk is not None else round(rate * block_numel)
    return max(1, min(k, block_numel))


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def select_topk(coefficients: Tensor, layout: BlockLayout, k: int, magnitude: Tensor) -> Tensor:
    """``(N, k)`` flat in-block positions of the ``k`` largest ``|C|`` of every block of ``(P, *shape)``.

    ``magnitude`` is a scratch buffer of the coefficients' size and dtype (blocks are copied into it
    contiguously). The ranking runs on the bit patterns with the sign bit cleared: for IEEE floats of one
    sign the integer order is the magnitude order (NaN above inf, as in a float ranking), and ``topk`` over
    integers is faster on CPU than over bfloat16 (``benchmarks/studies/selection.py``).
    """
    bits = _SAME_WIDTH_INT[coefficients.element_size()]
    blocks = layout.blocks(coefficients).view(bits)
    magnitude = magnitude.view(bits).view(blocks.shape)
    torch.bitwise_and(blocks, torch.iinfo(bits).max, out=magnitude)
    return magnitude.view(-1, layout.block_numel).topk(k, dim=1, sorted=False).indices


def select_random(layout: BlockLayout, count: int, k: int, generator: torch.Generator) -> Tensor:
    """``(N, k)`` distinct random in-block positions for ``count`` stacked tensors, from ``generator``."""
    scores = torch.rand(count * layout.num_blocks, layout.block_numel, generator=generator,
                        device=generator.device)
    return scores.topk(k, dim=1, sorted=False).indices


def gather(coefficients: Tensor, layout: BlockLayout, indices: Tensor) -> tuple[Tensor, Tensor]:
    """``(positions, values)``: flat positions in ``coefficients`` of in-block ``indices``, and the
    coefficients there, ``(N, k)`` like ``indices``."""
    positions = layout.flat_positions(coefficients.shape[0], indices).view(-1)
    return positions, coefficients.reshape(-1).index_select(0, positions).view(indices.shape)


def pack_indices(indices: Tensor, block_numel: int) -> Tensor:
    """``(N, ceil(k * bits / 8))`` uint8: every row's ``k`` in-block indices at :func:`index_bits` bits each, the
    first index in the lowest bits (at 8 bits, the indices as bytes). One bit plane at a time, so the scratch is a
    byte per bit, not an integer."""
    bits = index_bits(block_numel)
    if bits == 8:
        return indices.to(torch.uint8)
    count, k = indices.shape
    lanes = indices.new_zeros((count, k * bits + -(k * bits) % 8), dtype=torch.uint8)
    planes = lanes[:, : k * bits].view(count, k, bits)
    for bit in range(bits):
        planes[..., bit] = indices.bitwise_right_shift(bit).bitwise_and_(1)
    return quantize.pack(lanes, 1)


def unpack_indices(packed: Tensor, block_numel: int, k: int) -> Tensor:
    """The ``(..., k)`` int64 indices of :func:`pack_indices`' ``(..., bytes)`` rows."""
    bits = index_bits(block_numel)
    if bits == 8:
        return packed.long()
    planes = quantize.unpack(packed, 1)[..., : k * bits].reshape(*packed.shape[:-1], k, bits)
    indices = planes[..., 0].long()
    for bit in range(1, bits):
        indices.bitwise_or_(planes[..., bit].long().bitwise_left_shift_(bit))
    return indices


def encode_positions(indices: Tensor, block_numel: int) -> tuple[Tensor, Tensor]:
    """``(wire, order)``: the wire form of ``(N, k)`` in-block ``indices`` and the indices in the order the wire
    carries their values.

    As indices (:func:`pack_indices`), the order is ``indices``' own. As a bitmask (see :func:`uses_bitmask`:
    ``(N, ceil(block_numel / 8))`` uint8, bit ``i % 8`` of byte ``i // 8`` for index ``i``) the receiver reads a
    block's values in ascending index order; each index's place there is the count of set bits up to it, from
    the mask the bitmask is packed from (cheaper than a sort for large blocks, and free of host syncs).
    """
    count, k = indices.shape
    if not uses_bitmask(block_numel, k):
        return pack_indices(indices, block_numel), indices
    width = _bitmask_bytes(block_numel)
    mask = torch.zeros(count, width * 8, dtype=torch.bool, device=indices.device)
    true = torch.ones((), dtype=torch.bool, device=indices.device).expand_as(indices)
    mask.scatter_(1, indices, true)  # a tensor source: on CPU about twice as fast as scattering the value True
    place = mask.cumsum(1, dtype=torch.int16 if width * 8 < 2**15 else torch.int32).gather(1, indices).sub_(1).long()
    ascending = torch.empty_like(indices).scatter_(1, place, indices)
    return quantize.pack(mask.view(torch.uint8), 1), ascending


def decode_positions(where: Tensor, block_numel: int, k: int) -> Tensor:
    """The ``(N, k)`` int64 in-block indices of :func:`encode_positions`' wire ``where``, in the order its values
    travel (a bitmask's set bits ascending)."""
    if uses_bitmask(block_numel, k):
        mask = decode_mask(where, block_numel).view(torch.uint8)
        return mask.argsort(dim=1, descending=True, stable=True)[:, :k]
    return unpack_indices(where, block_numel, k)


def decode_mask(packed: Tensor, block_numel: int) -> Tensor:
    """The ``(..., block_numel)`` bool mask of a bitmask from :func:`encode_positions` (the unpacked bits are 0 or 1,
    so they are viewed as bool rather than copied)."""
    return quantize.unpack(packed, 1)[..., :block_numel].view(torch.bool)


def encode_values(values: Tensor, value_dtype: str) -> list[Tensor]:
    """The wire pieces of ``(N, k)`` values: the values in ``value_dtype``; for ``"float8"`` the e4m3 values and
    the ``(N, 1)`` per-block scale (the block's largest magnitude maps to e4m3's largest); ``"int4"``/``"int2"``:
    :func:`hf_flexdemo.wire.quantize.encode`'s pieces.

    The float8 scale is ``bf16(clamp(largest / 448, 2**-126, 146 * 2**112))``: a normal number, so no value divides
    by zero (a block whose largest magnitude is below ``448 * 2**-126`` ~ 5e-36 is sent at the smallest scale, and
    what falls below half e4m3's smallest step there, ``2**-136``, becomes an exact zero that error feedback keeps
    for later), and small enough that every e4m3 value times it is a finite float32. Finite values therefore
    always decode to finite values; a value the rounded scale pushes past 448 is clamped to it (the sender
    subtracts what arrives, so that too is sent later).
    """
    if value_dtype in quantize.WIDTHS:
        return quantize.encode(values, value_dtype)
    if value_dtype != "float8":
        return [values.to(VALUE_DTYPES[value_dtype])]
    largest = values.abs().amax(dim=1, keepdim=True).float()
    scale = largest.div_(_FP8_MAX).clamp_(_SCALE_MIN, _SCALE_MAX).to(_SCALE_DTYPE)
    scaled = values.to(torch.float32, copy=True).div_(scale.float()).clamp_(-_FP8_MAX, _FP8_MAX)  # values kept
    return [scaled.to(torch.float8_e4m3fn), scale]


def decode_values(pieces: list[Tensor]) -> Tensor:
    """The values that :func:`encode_values`'s ``pieces`` carry (any leading dimensions): float32 for float8, int4 and
    int2, else
    the wire's type (the decode converts them one replica at a time)."""
    if len(pieces) == 1:
        return pieces[0]
    if len(pieces) == 3:
        return quantize.decode(pieces)
    values, scale = pieces
    return values.float().mul_(scale.float())


def scatter_mean(
    positions: Tensor, values: Tensor, out: Tensor, counts: Tensor | None, consensus: Consensus = "choosers"
) -> Tensor:
    """Dense ``out`` holding, at every position some replica chose, the mean of the chosen values over the
    replicas that chose it (``consensus="choosers"``) or over all of them (``"replicas"``).

    ``positions``/``values`` are ``(R, M)``: each row one replica's flat positions (unique within the
    row) and values. ``counts`` is a scratch buffer of ``out``'s size (unused, may be ``None``, when
    ``R == 1`` or ``consensus="replicas"``). Rows are added in order, so the result does not depend on the
    device's scheduling.
    """
    flat = out.view(-1).zero_()
    for where, value in zip(positions, values):
        flat.index_add_(0, where, value.to(out.dtype))
    if consensus == "replicas":
        return out.div_(positions.shape[0])
    if positions.shape[0] > 1:
        chooser = counts.view(-1).zero_()
        ones = torch.ones(positions.shape[1], dtype=out.dtype, device=out.device)
        for where in positions:
            chooser.index_add_(0, where, ones)
        flat.div_(chooser.clamp_(min=1))
    return out


def scatter_masked(
    bitmasks: Tensor, pieces: list[Tensor], layout: BlockLayout, out: Tensor, scratch: Tensor, counts: Tensor | None,
    consensus: Consensus = "choosers", own: tuple[int, Tensor] | None = None,
) -> Tensor:
    """:func:`scatter_mean` for positions that travel as bitmasks: ``bitmasks`` ``(R, N, ceil(block_numel / 8))``
    and the :func:`encode_values` pieces with a leading ``R``, each block's values in ascending in-block order.

    ``own``: ``(row, positions)``, this replica's row and its flat positions in wire order (:func:`gather`'s): that
    row is added by index, skipping the bitmask decode and ``masked_scatter_`` (the costliest part of a decode on
    CPU). A replica's mask and values are decoded when it is added, so beyond the payload the memory is ``out``,
    ``scratch`` (``out``'s size: each bitmask row after the first), ``counts`` (as in
    :func:`scatter_mean`) and one replica's mask and values.

    Rows are summed in order with one freedom: the first two in either order (``a + b == b + a`` exactly), so
    the first bitmask row goes straight into ``out``. A position a row does not choose adds ``+0``, and no sum
    of rows holds ``-0`` (values enter as ``v + 0.0``, or are added by index to ``+0`` or to a sum), so adding a
    row by index gives the bits of adding its dense scatter: every replica gets the same bits, whichever row is
    its own.
    """
    replicas, (own_row, positions) = bitmasks.shape[0], own or (-1, None)
    order = [1, 0, *range(2, replicas)] if own_row == 0 and replicas > 1 else range(replicas)
    shape = layout.blocks(out).shape
    chooser = counts.zero_() if counts is not None else None
    for added, row in enumerate(order):
        values = decode_values([piece[row] for piece in pieces]).to(out.dtype)
        if row == own_row:
            if not added:
                out.zero_()
            out.view(-1).index_add_(0, positions, values.view(-1))
            if chooser is not None:
                chooser.view(-1).index_add_(0, positions, torch.ones_like(values).view(-1))
            continue
        mask = decode_mask(bitmasks[row], layout.block_numel).reshape(shape)
        target = (scratch if added else out).zero_()
        layout.blocks(target).masked_scatter_(mask, values + 0.0)  # + 0.0: -0 becomes +0, as an add into zeros does
        if added:
            out.add_(target)
        if chooser is not None:
            layout.blocks(chooser).add_(mask)
    if consensus == "replicas":
        return out.div_(replicas)
    if replicas > 1:
        out.div_(counts.clamp_(min=1))
    return out


def decode(
    where: Tensor, pieces: list[Tensor], layout: BlockLayout, out: Tensor, scratch: Tensor, counts: Tensor | None,
    consensus: Consensus = "choosers", own: tuple[int, Tensor] | None = None,
) -> Tensor:
    """The dense coefficients of ``R`` replicas' payloads, as they travel: ``where`` ``(R, N, ...)`` holds each
    block's positions (indices or bitmasks, as :func:`encode_positions` wrote them) and ``pieces`` the
    :func:`encode_values` pieces with a leading ``R``. Dispatches to :func:`scatter_masked` (with ``own``, this
    replica's row and flat positions, if given) or :func:`scatter_mean`; ``scratch`` and ``counts`` are buffers of
    ``out``'s size (``counts`` only for ``consensus="choosers"`` with ``R > 1``)."""
    k = quantize.count(pieces) if len(pieces) == 3 else pieces[0].shape[-1]
    if uses_bitmask(layout.block_numel, k):
        return scatter_masked(where, pieces, layout, out=out, scratch=scratch, counts=counts, consensus=consensus,
                              own=own)
    positions = torch.stack([layout.flat_positions(out.shape[0], unpack_indices(i, layout.block_numel, k)).view(-1)
                             for i in where])
    return scatter_mean(positions, decode_values(pieces).flatten(1), out=out, counts=counts, consensus=consensus)
