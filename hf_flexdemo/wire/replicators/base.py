"""What a replicator is: the one axis along which FlexDeMo's cross-node exchange varies.

The optimizer runs the same transaction for every replicator (compress, exchange, decide, decode, apply);
a replicator says, for a :class:`~hf_flexdemo.optim.plan.Stack` of local shards:

* what it selects from the candidate momentum (:meth:`Replicator.select`) and what the sender keeps
  (:meth:`Replicator.encode`: error feedback);
* its payload layout and its collective on the replicate group (:meth:`Replicator.start`,
  :meth:`Replicator.finish`);
* how every replica turns the received payloads into the same consensus ``Q`` (:meth:`Replicator.decode`);
* its byte formula (:meth:`Replicator.step_bytes`), which the counters of a real step equal.

A payload's trailer (the non-finite flag, a time budget's measured fraction) rides in the same collective,
so a step crosses nodes once. :class:`BlockReplicator` holds what the compressing replicators share: the
DCT of the momentum in blocks, the kept coefficients and error feedback.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from .. import compression
from ..collectives import CommStats, Pending, ReplicateGroup
from ..dct import BlockLayout
from ..workspace import Workspace

if TYPE_CHECKING:
    from ...optim.plan import Stack  # the wire works on the optimizer's stacks; it imports nothing of the core


@dataclass
class Exchange:
    """One collective in flight and the stacks whose payload it carries (``like``: what it holds)."""

    stacks: list[Stack]
    pending: Pending | None
    like: list[Tensor]


@dataclass(frozen=True)
class ShardTotals:
    """What one rank's local shards amount to at a rate: kept coefficients, elements and block payload bytes, and
    per shard ``(blocks, block size, kept per block)`` for formulas that are not linear in the kept count."""

    kept: int
    numel: int
    payload: int
    blocks: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def of(cls, local_shapes: list[tuple[int, ...]], *, rate: float | None, topk: int | None, chunk: int,
           value_dtype: str) -> ShardTotals:
        kept = numel = payload = 0
        blocks = []
        for shape in local_shapes:
            if not math.prod(shape):
                continue
            layout = BlockLayout.for_shape(tuple(shape), chunk)
            k = compression.kept_per_block(layout.block_numel, rate, topk)
            kept += layout.num_blocks * k
            numel += math.prod(shape)
            payload += layout.num_blocks * compression.block_payload_bytes(layout.block_numel, k, value_dtype)
            blocks.append((layout.num_blocks, layout.block_numel, k))
        return cls(kept, numel, payload, tuple(blocks))


class Replicator(ABC):
    """One way of exchanging momentum between the replicas of a shard (see the module docstring)."""

    name: ClassVar[str]
    compresses: ClassVar[bool] = True  # selects a rate's share of each block: the rate and budgets apply
    spends_momentum: ClassVar[bool] = False  # the whole momentum is sent, so it is zeroed once applied
    emulates: ClassVar[bool] = False  # sends nothing: a single replica's stand-in for the wire, chosen explicitly
    lag: ClassVar[int] = 0  # exchanges between sending a round and landing its consensus

    def __init__(self, group: ReplicateGroup, *, value_dtype: str, consensus: str, seed: int) -> None:
        self.group, self.value_dtype, self.consensus, self.seed = group, value_dtype, consensus, seed

    def shared_seed(self, step: int, stack: Stack) -> int:
        """A seed every replica derives alike for ``stack``'s exchange launched at ``step``."""
        return self.seed * 2**40 + step * 2**16 + stack.index

    def shared_generator(self, step: int, stack: Stack, device: torch.device) -> torch.Generator:
        """A generator on ``device`` seeded with :meth:`shared_seed`: the same draws on every replica."""
        generator = torch.Generator(device=device)
        generator.manual_seed(self.shared_seed(step, stack))
        return generator

    @abstractmethod
    def select(self, stack: Stack, *, k: int, step: int, workspace: Workspace) -> Tensor:
        """Choose what of ``stack.momentum`` travels (``k`` per block); returns the tensor whose finiteness
        decides the step (it is zeroed where non-finite before :meth:`encode`)."""

    @abstractmethod
    def encode(self, stack: Stack, *, feedback: float, workspace: Workspace) -> None:
        """Write the selection to ``stack.wire`` and subtract what was sent from the momentum (error feedback)."""

    @abstractmethod
    def start(self, stacks: list[Stack], trailer: list[Tensor], stats: CommStats) -> Exchange:
        """Start the one collective carrying ``stacks``' payloads and ``trailer``."""

    @abstractmethod
    def finish(self, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
        """Wait for ``exchange``: what each stack received, and the trailer's tensors as ``(rows, n)``: one row per
        replica, or one row holding the replicas' mean."""

    @abstractmethod
    def decode(self, stack: Stack, received: Any, *, workspace: Workspace) -> Tensor:
        """The consensus ``Q`` of ``stack``, ``(P, *shape)`` in float32, bit-identical on every replica."""

    def release(self, stack: Stack, workspace: Workspace, *, k: int) -> None:
        """Before a final round on another wire: add to ``stack.delta`` what this replica holds of the consensus
        still to land (``k`` per block), so that a mean over the replicas carries it once, and forget it (nothing held:
        nothing)."""
        return None

    @classmethod
    @abstractmethod
    def step_bytes(cls, totals: ShardTotals, replicas: int, *, value_dtype: str, timing: bool,
                   rank: int = 0) -> int:
        """Bytes replica ``rank`` sends per step for ``totals`` over ``replicas > 1`` (with a timing trailer or not);
        every replica sends alike except where a replicator says otherwise."""


class BlockReplicator(Replicator):
    """A replicator that sends a share of each DCT block of the momentum, with error feedback."""

    @abstractmethod
    def choose(self, stack: Stack, coefficients: Tensor, *, k: int, step: int, scratch: Tensor) -> Tensor:
        """``(N, k)`` in-block indices of the kept coefficients, in the order their values travel; sets the
        positions' part of ``stack.wire``."""

    def select(self, stack: Stack, *, k: int, step: int, workspace: Workspace) -> Tensor:
        layout, momentum = stack.layout, stack.momentum
        # Coefficients travel rounded to the wire's type, so the transform runs in it too (bf16 GEMMs are ~3x
        # faster); error feedback still subtracts exactly the values as they arrive, synthesised in float32.
        dtype = compression.transform_dtype(self.value_dtype)
        source = momentum if dtype == momentum.dtype else workspace("source", momentum, dtype)
        if source is not momentum:
            source.copy_(momentum)
        # without a transform the values are the coefficients: no buffers for the GEMMs
        coefficients = source if layout.transform == "none" else layout.dct(
            source, out=workspace("coefficients", momentum, dtype), scratch=workspace("scratch", momentum, dtype))
        indices = self.choose(stack, coefficients, k=k, step=step, scratch=workspace("scratch", momentum, dtype))
        stack.positions, stack.values = compression.gather(coefficients, layout, indices)
        return stack.values

    def encode(self, stack: Stack, *, feedback: float, workspace: Workspace) -> None:
        """Encode the values for the wire; error feedback subtracts them as every replica decodes them."""
        momentum = stack.momentum
        pieces = compression.encode_values(stack.values, self.value_dtype)
        stack.wire += pieces
        sent = compression.scatter_mean(stack.positions.unsqueeze(0), compression.decode_values(pieces).view(1, -1),
                                        out=workspace("dense", momentum), counts=None)
        momentum.sub_(self.inverse(stack, sent, workspace), alpha=feedback)

    @staticmethod
    def inverse(stack: Stack, dense: Tensor, workspace: Workspace) -> Tensor:
        """The momentum-space signal of ``dense`` coefficients (``dense`` itself without a transform: no buffers)."""
        if stack.layout.transform == "none":
            return dense
        return stack.layout.idct(dense, out=workspace("spatial", dense), scratch=workspace("dense_scratch", dense))


def reduce_payload(replicator: Replicator, stacks: list[Stack], payload: list[Tensor], trailer: list[Tensor],
                   dtype: torch.dtype, stats: CommStats) -> Exchange:
    """Start an all-reduce (sum) of ``payload`` and ``trailer`` (cast to the payload's ``dtype``) in one buffer."""
    like = payload + [t.to(dtype) for t in trailer]
    return Exchange(stacks, replicator.group.all_reduce(torch.cat(like), stats), like)


def finish_reduce(replicator: Replicator, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
    """The summed payloads of :func:`reduce_payload`, one per stack, and the trailer's replica means."""
    count = len(exchange.stacks)
    parts = list(exchange.pending.wait().split([t.numel() for t in exchange.like]))
    return parts[:count], [(p / replicator.group.size).reshape(1, -1) for p in parts[count:]]
