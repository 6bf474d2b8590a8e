"""``replicator="random"``: positions every replica draws from the same seed, so only values travel, and
they are summed by an all-reduce whose traffic per rank stays flat in the number of replicas
(``2 (R - 1) / R * kept * value bytes``). The values travel in bfloat16 or float32: an all-reduce adds
them, and float8's per-block scales do not add up."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from .. import compression
from ..collectives import CommStats, dense_allreduce_bytes
from ..workspace import Workspace
from .base import BlockReplicator, Exchange, ShardTotals, finish_reduce, reduce_payload

if TYPE_CHECKING:
    from ...optim.plan import Stack  # the wire works on the optimizer's stacks; it imports nothing of the core


class RandomReplicator(BlockReplicator):
    name = "random"

    def choose(self, stack: Stack, coefficients: Tensor, *, k: int, step: int, scratch: Tensor) -> Tensor:
        stack.wire = []  # every replica draws the positions: only values travel
        return compression.select_random(stack.layout, stack.momentum.shape[0], k,
                                         self.shared_generator(step, stack, coefficients.device))

    def start(self, stacks: list[Stack], trailer: list[Tensor], stats: CommStats) -> Exchange:
        payload = [s.wire[0].reshape(-1) for s in stacks]
        stats.coefficients += sum(t.numel() for t in payload)
        return reduce_payload(self, stacks, payload, trailer, compression.VALUE_DTYPES[self.value_dtype], stats)

    def finish(self, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
        return finish_reduce(self, exchange)

    def decode(self, stack: Stack, received: Any, *, workspace: Workspace) -> Tensor:
        """The replicas' mean at the shared positions."""
        values = received.float().div_(self.group.size).unsqueeze(0)
        dense = compression.scatter_mean(stack.positions.unsqueeze(0), values, out=workspace("dense", stack.momentum),
                                         counts=None)
        return self.inverse(stack, dense, workspace)

    @classmethod
    def step_bytes(cls, totals: ShardTotals, replicas: int, *, value_dtype: str, timing: bool,
                   rank: int = 0) -> int:
        """All-reduce of the kept values and the trailer (the flag, the timing) in the wire's type."""
        return dense_allreduce_bytes(totals.kept + 1 + int(timing), replicas,
                                     compression.VALUE_DTYPES[value_dtype].itemsize)
