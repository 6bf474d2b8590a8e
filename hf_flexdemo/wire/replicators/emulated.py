"""``replicator="none"``: DeMo's compression with nothing exchanged, for a single node (replicate size 1).

A replica decodes its own payload, so the update is what the same replica would apply in a job of one
node with ``replicator="demo"``; with more than one replica it would let them drift, and the optimizer
refuses it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from ...knobs import check
from ..collectives import CommStats, ReplicateGroup
from .base import Exchange, ShardTotals
from .demo import DemoReplicator

if TYPE_CHECKING:
    from ...optim.plan import Stack  # the wire works on the optimizer's stacks; it imports nothing of the core


class EmulatedReplicator(DemoReplicator):
    name = "none"
    emulates = True

    def __init__(self, group: ReplicateGroup, **kwargs: object) -> None:
        check(group.size == 1, "replicator", self.name, "'demo' | 'random' | 'full' when the replicate group has "
              "more than one rank ('none' lets replicas drift)")
        super().__init__(group, **kwargs)

    def start(self, stacks: list[Stack], trailer: list[Tensor], stats: CommStats) -> Exchange:
        return Exchange(stacks, None, trailer)

    def finish(self, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
        own = [[t.unsqueeze(0) for t in stack.wire] for stack in exchange.stacks]
        return own, [t.reshape(1, -1) for t in exchange.like]

    @classmethod
    def step_bytes(cls, totals: ShardTotals, replicas: int, *, value_dtype: str, timing: bool,
                   rank: int = 0) -> int:
        return 0
