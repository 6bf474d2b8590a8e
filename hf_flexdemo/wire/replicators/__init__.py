"""The replicators: one module each, registered by name in :data:`REGISTRY`.

Adding a way to exchange means one module with a :class:`~.base.Replicator` subclass, one line in
:data:`REGISTRY` and its name in :data:`hf_flexdemo.knobs.ReplicatorName` (a test checks that the two agree).
"""

from __future__ import annotations

from .base import Exchange, Replicator, ShardTotals
from .demo import DemoReplicator
from .emulated import EmulatedReplicator
from .full import FullReplicator
from .leader import LeaderReplicator
from .owner import OwnerReplicator
from .random_positions import RandomReplicator

REGISTRY: dict[str, type[Replicator]] = {
    DemoReplicator.name: DemoReplicator,
    RandomReplicator.name: RandomReplicator,
    FullReplicator.name: FullReplicator,
    LeaderReplicator.name: LeaderReplicator,
    OwnerReplicator.name: OwnerReplicator,
    EmulatedReplicator.name: EmulatedReplicator,
}

DENSE = FullReplicator.name  # the uncompressed exchange: one replica's dense limit, finish(final="dense")

__all__ = ["DENSE", "REGISTRY", "Exchange", "Replicator", "ShardTotals", "exchange_bytes"]


def exchange_bytes(
    replicator: str, local_shapes: list[tuple[int, ...]], replicas: int, *, rate: float | None, topk: int | None,
    chunk: int, value_dtype: str = "bfloat16", timing: bool = False, rank: int = 0,
) -> int:
    """Bytes one rank (replica ``rank`` of its shards) sends per optimizer step with ``replicator``, from its local
    shard shapes (each replicator's ``step_bytes``; nothing with one replica).

    ``timing``: the payload also carries this rank's step-time fraction (``budget_fraction``). One collective
    per step (``overlap`` ``"none"`` or ``"delayed"``); ``"backward"`` adds the trailer once per bucket.
    """
    if replicas == 1:
        return 0
    totals = ShardTotals.of(local_shapes, rate=rate, topk=topk, chunk=chunk, value_dtype=value_dtype)
    return REGISTRY[replicator].step_bytes(totals, replicas, value_dtype=value_dtype, timing=timing, rank=rank)
