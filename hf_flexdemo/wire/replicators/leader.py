"""``replicator="leader"``: received bytes flat in the number of nodes ``R``.

Every node sends its values at the same positions, which one node, the leader, chose in the exchange before from
what its error feedback holds (ScaleCom's cyclic local top-k, NeurIPS 2020; the leader is drawn anew for each
exchange from the shared seed). So only values travel, and one all-reduce sums them: 2-bit (or 4-bit) codes on a
per-block scale every node shares, in int32 fields wide enough for the sum (:mod:`hf_flexdemo.wire.lanes`). The
leader's positions and scale for the next exchange ride in the same all-reduce (its lanes, the others' zeros), so
an exchange is one collective and nothing waits for the positions. They are per-parameter state
(:data:`STATE_KEYS`), so ``state_dict`` resumes exactly.

The first exchange has no positions agreed: it draws them from the shared seed at scale 0, so it sends nothing and
every value stays in the error feedback for the next. A rank sends and receives ``2 (R - 1) / R`` of a buffer of
``ceil(k / fields) + ceil((positions + 2) / 4)`` int32 lanes per block, which tends to twice the buffer as ``R``
grows, where the all-gather of ``replicator="demo"`` receives ``R - 1`` payloads.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .. import compression, lanes, quantize
from ..collectives import CommStats, ReplicateGroup, dense_allreduce_bytes
from ..workspace import Workspace
from .base import BlockReplicator, Exchange, ShardTotals, finish_reduce, reduce_payload

if TYPE_CHECKING:
    from ...optim.plan import Stack  # the wire works on the optimizer's stacks; it imports nothing of the core

INDICES, SCALE = STATE_KEYS = ("leader_indices", "leader_scale")  # per parameter: (blocks, k) and (blocks, 1)
_SCALE_BYTES = quantize.SCALE_DTYPE.itemsize


def proposal_bytes(block_numel: int, k: int) -> int:
    """Bytes of one block's next positions (bitmask or packed indices, as the all-gather sends them) and scale."""
    return compression.position_bytes(block_numel, k) + _SCALE_BYTES


class LeaderReplicator(BlockReplicator):
    name = "leader"

    def __init__(self, group: ReplicateGroup, **kwargs: Any) -> None:
        super().__init__(group, **kwargs)
        self.bits = quantize.WIDTHS[self.value_dtype]
        # per stack, from its selection to its decode: whether this replica leads the exchange, and the agreed scale
        self._rounds: dict[int, tuple[bool, Tensor]] = {}

    def leader(self, step: int, stack: Stack) -> int:
        """The replica that chooses the next positions of ``stack`` in the exchange launched at ``step``."""
        return random.Random(self.shared_seed(step, stack)).randrange(self.group.size)

    def agreed(self, stack: Stack, k: int) -> tuple[Tensor, Tensor] | None:
        """The ``(N, k)`` positions and ``(N, 1)`` float32 scale every replica agreed on for ``stack``'s next
        exchange, or ``None`` before the first (or after a change of ``k``)."""
        states = stack.states
        if not all(INDICES in state for state in states) or states[0][INDICES].shape[-1] != k:
            return None
        return torch.cat([s[INDICES] for s in states]).long(), torch.cat([s[SCALE] for s in states])

    def choose(self, stack: Stack, coefficients: Tensor, *, k: int, step: int, scratch: Tensor) -> Tensor:
        """The agreed positions (before the first agreement: drawn from the shared seed, at scale 0)."""
        leads = self.leader(step, stack) == self.group.rank
        agreed = self.agreed(stack, k)
        if agreed is not None:
            self._rounds[stack.index] = (leads, agreed[1])
            return agreed[0]
        count = stack.momentum.shape[0] * stack.layout.num_blocks
        self._rounds[stack.index] = (leads, torch.zeros((count, 1), device=coefficients.device))
        return compression.select_random(stack.layout, stack.momentum.shape[0], k,
                                         self.shared_generator(step, stack, coefficients.device))

    def encode(self, stack: Stack, *, feedback: float, workspace: Workspace) -> None:
        """The values' codes on the agreed scale (0 before the first agreement: nothing is sent); error feedback
        subtracts what they decode to. The leader then proposes the next positions from what is left."""
        momentum, values = stack.momentum, stack.values
        scale = self._rounds[stack.index][1]
        codes = quantize.codes_at(values, scale, self.bits)
        sent = compression.scatter_mean(stack.positions.unsqueeze(0),
                                        quantize.levels(codes, scale, self.bits).view(1, -1),
                                        out=workspace("dense", momentum), counts=None)
        momentum.sub_(self.inverse(stack, sent, workspace), alpha=feedback)
        stack.wire = [lanes.pack(codes, self.bits, self.group.size), self._proposal(stack, values.shape[1], workspace)]

    def _proposal(self, stack: Stack, k: int, workspace: Workspace) -> Tensor:
        """``(N, lanes)``: the leader's next positions (the top ``k`` of each block of its error feedback) and their
        scale (their largest magnitude at the outermost level), as bytes in lanes; zeros on the other replicas."""
        layout, momentum = stack.layout, stack.momentum
        size = lanes.byte_lanes(proposal_bytes(layout.block_numel, k))
        if not self._rounds[stack.index][0]:
            return torch.zeros((stack.values.shape[0], size), dtype=torch.int32, device=momentum.device)
        held = momentum
        if layout.transform != "none":
            dtype = compression.transform_dtype(self.value_dtype)
            source = workspace("source", momentum, dtype)
            source.copy_(momentum)
            held = layout.dct(source, out=workspace("coefficients", momentum, dtype),
                              scratch=workspace("scratch", momentum, dtype))
        indices = compression.select_topk(held, layout, k, workspace("leader_scratch", held))
        where, order = compression.encode_positions(indices, layout.block_numel)
        scale = quantize.scale_of(compression.gather(held, layout, order)[1], self.bits)
        return lanes.from_bytes(torch.cat([where, scale.view(torch.uint8)], dim=1))

    def start(self, stacks: list[Stack], trailer: list[Tensor], stats: CommStats) -> Exchange:
        payload = [torch.cat([t.reshape(-1) for t in s.wire]) for s in stacks]
        stats.coefficients += sum(s.values.numel() for s in stacks)
        return reduce_payload(self, stacks, payload, trailer, torch.int32, stats)

    def finish(self, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
        return finish_reduce(self, exchange)

    def decode(self, stack: Stack, received: Any, *, workspace: Workspace) -> Tensor:
        """The replicas' mean at the agreed positions; the leader's proposal becomes the next agreement."""
        layout, (count, k), replicas = stack.layout, stack.values.shape, self.group.size
        codes, proposal = received.split([count * lanes.lanes_for(k, self.bits, replicas),
                                          count * lanes.byte_lanes(proposal_bytes(layout.block_numel, k))])
        scale = self._rounds.pop(stack.index)[1]
        mean = lanes.unpack(codes.view(count, -1), k, self.bits, replicas).float().div_(replicas)
        dense = compression.scatter_mean(stack.positions.unsqueeze(0),
                                         quantize.levels(mean, scale, self.bits).view(1, -1),
                                         out=workspace("dense", stack.momentum), counts=None)
        self._agree(stack, proposal.view(count, -1), k)
        return self.inverse(stack, dense, workspace)

    @staticmethod
    def _agree(stack: Stack, proposal: Tensor, k: int) -> None:
        """Store the summed ``proposal`` (the leader's bytes) as every parameter's next positions and scale."""
        block_numel = stack.layout.block_numel
        data = lanes.to_bytes(proposal, proposal_bytes(block_numel, k))
        where, scale = data[:, :-_SCALE_BYTES], data[:, -_SCALE_BYTES:].clone().view(quantize.SCALE_DTYPE)
        indices = compression.decode_positions(where, block_numel, k)
        indices = indices.to(torch.int16 if block_numel <= 2**15 else torch.int32)
        rows = proposal.shape[0] // len(stack.states)
        for state, chosen, shared in zip(stack.states, indices.split(rows), scale.float().split(rows)):
            state[INDICES], state[SCALE] = chosen, shared

    @classmethod
    def step_bytes(cls, totals: ShardTotals, replicas: int, *, value_dtype: str, timing: bool,
                   rank: int = 0) -> int:
        """All-reduce of every block's code lanes and proposal lanes and the trailer (the flag), in int32."""
        bits = quantize.WIDTHS[value_dtype]
        lanes_per_rank = sum(blocks * (lanes.lanes_for(k, bits, replicas)
                                       + lanes.byte_lanes(proposal_bytes(block_numel, k)))
                             for blocks, block_numel, k in totals.blocks)
        return dense_allreduce_bytes(lanes_per_rank + 1 + int(timing), replicas, 4)
