"""Which ranks form a node, and the Accelerate parallelism setup each training method needs."""

from __future__ import annotations

from dataclasses import dataclass

from accelerate import ParallelismConfig

from ..optim.mesh import resolve_shard_size


class ShardOnlyParallelismConfig(ParallelismConfig):
    """A ``(dp_replicate, dp_shard)`` mesh on which FSDP2 shards over ``dp_shard`` only.

    Accelerate applies FSDP to ``mesh[fsdp_dim_names]``; leaving out ``dp_replicate`` means FSDP
    never communicates across nodes and the gradient FlexDeMo sees is the node average.
    """

    @property
    def fsdp_dim_names(self) -> list[str]:
        return ["dp_shard_cp"]


@dataclass(frozen=True)
class Topology:
    """``replicate_size`` nodes of ``shard_size`` processes each, ranks numbered node-major."""

    world_size: int
    shard_size: int

    @property
    def replicate_size(self) -> int:
        return self.world_size // self.shard_size

    @classmethod
    def resolve(cls, world_size: int, shard_size: int | None = None) -> Topology:
        """``shard_size`` if given, else the launcher's (:func:`hf_flexdemo.optim.mesh.resolve_shard_size`)."""
        return cls(world_size, resolve_shard_size(world_size, shard_size))

    def as_dict(self) -> dict[str, int]:
        return {"world_size": self.world_size, "shard_size": self.shard_size, "replicate_size": self.replicate_size}


def parallelism_config(method: str, topology: Topology) -> ParallelismConfig | None:
    """The Accelerate parallelism config of a training method (``None``: no FSDP, plain data parallel)."""
    if method == "demo" or topology.shard_size == 1:
        return None
    cls = ShardOnlyParallelismConfig if method == "flexdemo" else ParallelismConfig
    return cls(dp_replicate_size=topology.replicate_size, dp_shard_size=topology.shard_size)
