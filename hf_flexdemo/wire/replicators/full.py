"""``replicator="full"``: no compression. The float32 momentum is averaged by an all-reduce and spent
entirely (zeroed once applied): the dense limit the compressing replicators approach as their rate
goes to 1."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..collectives import CommStats, dense_allreduce_bytes
from ..workspace import Workspace
from .base import Exchange, Replicator, ShardTotals, finish_reduce, reduce_payload

if TYPE_CHECKING:
    from ...optim.plan import Stack  # the wire works on the optimizer's stacks; it imports nothing of the core


class FullReplicator(Replicator):
    name = "full"
    compresses = False
    spends_momentum = True

    def select(self, stack: Stack, *, k: int, step: int, workspace: Workspace) -> Tensor:
        return stack.momentum

    def encode(self, stack: Stack, *, feedback: float, workspace: Workspace) -> None:
        """Nothing to encode and nothing held back: the whole momentum travels and is spent."""

    def start(self, stacks: list[Stack], trailer: list[Tensor], stats: CommStats) -> Exchange:
        return reduce_payload(self, stacks, [s.momentum.reshape(-1) for s in stacks], trailer, torch.float32, stats)

    def finish(self, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
        return finish_reduce(self, exchange)

    def decode(self, stack: Stack, received: Any, *, workspace: Workspace) -> Tensor:
        return received.view_as(stack.momentum).div_(self.group.size)

    @classmethod
    def step_bytes(cls, totals: ShardTotals, replicas: int, *, value_dtype: str, timing: bool,
                   rank: int = 0) -> int:
        """All-reduce of the float32 momentum and the trailer."""
        return dense_allreduce_bytes(totals.numel + 1 + int(timing), replicas, 4)
