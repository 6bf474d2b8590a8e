"""``replicator="demo"`` (the default): DeMo's exchange. Each replica keeps the largest share of each block (of its
values with local steps, of its DCT coefficients step-wise) and all-gathers their positions (indices, or a bitmask of
the block when smaller) and values (int2 with local steps, float8 step-wise, with a per-block scale); every replica
decodes all payloads in a fixed order.

The traffic grows with the number of replicas ``R``: an all-gather puts ``(R - 1) * payload`` on each
rank's link (``replicator="random"`` stays flat in ``R``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from .. import compression
from ..collectives import CommStats, pack, unpack
from ..workspace import Workspace
from .base import BlockReplicator, Exchange, ShardTotals

if TYPE_CHECKING:
    from ...optim.plan import Stack  # the wire works on the optimizer's stacks; it imports nothing of the core


class DemoReplicator(BlockReplicator):
    name = "demo"

    def choose(self, stack: Stack, coefficients: Tensor, *, k: int, step: int, scratch: Tensor) -> Tensor:
        indices = compression.select_topk(coefficients, stack.layout, k, scratch)
        wire, indices = compression.encode_positions(indices, stack.layout.block_numel)  # the values' wire order
        stack.wire = [wire]
        return indices

    def start(self, stacks: list[Stack], trailer: list[Tensor], stats: CommStats) -> Exchange:
        like = [t for s in stacks for t in s.wire] + trailer
        stats.coefficients += sum(s.values.numel() for s in stacks)
        return Exchange(stacks, self.group.all_gather(pack(like), stats), like)

    def finish(self, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
        parts = unpack(exchange.pending.wait(), exchange.like)
        received = []
        for stack in exchange.stacks:
            received.append(parts[: len(stack.wire)])
            parts = parts[len(stack.wire):]
        return received, parts

    def decode(self, stack: Stack, received: Any, *, workspace: Workspace) -> Tensor:
        """Every replica's coefficients, averaged over the replicas that chose each (``consensus="choosers"``,
        DeMo) or over all replicas (``"replicas"``)."""
        momentum = stack.momentum
        where, *pieces = received
        replicas = pieces[0].shape[0]
        counts = workspace("counts", momentum) if self.consensus == "choosers" and replicas > 1 else None
        # this replica's positions are known: its row needs no bitmask decode
        dense = compression.decode(where, pieces, stack.layout, out=workspace("dense", momentum),
                                   scratch=workspace("replica", momentum), counts=counts, consensus=self.consensus,
                                   own=(self.group.rank, stack.positions))
        return self.inverse(stack, dense, workspace)

    @classmethod
    def step_bytes(cls, totals: ShardTotals, replicas: int, *, value_dtype: str, timing: bool,
                   rank: int = 0) -> int:
        """All-gather of every block's positions and values and the 1-byte flag (+ 4 timing bytes)."""
        return (replicas - 1) * (totals.payload + 1 + 4 * int(timing))
