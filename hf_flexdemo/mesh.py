"""The hybrid topology: a ``(dp_replicate, dp_shard)`` device mesh and FSDP2 on its shard dimension.

Ranks are laid out node-major (as ``torchrun``/``accelerate launch`` number them), so each row of
the mesh is one node: FSDP2 shards inside the row, and the columns are the replicate groups
FlexDeMo exchanges over. FSDP never communicates across nodes. What a node is (its number of
processes) has one rule, :func:`resolve_shard_size`, which the Trainer's topology uses too.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

MESH_DIMS = ("dp_replicate", "dp_shard")


def default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@contextlib.contextmanager
def group_timeout(timeout: datetime.timedelta | None) -> Iterator[None]:
    """Make process groups created inside (device-mesh sub-groups too) use ``timeout``.

    ``new_group`` falls back to torch's module-level default (30 min for gloo, 10 for NCCL), not to
    the world group's timeout, and ``init_device_mesh`` has no timeout argument.
    """
    if timeout is None:
        yield
        return
    saved = c10d.default_pg_timeout, c10d.default_pg_nccl_timeout
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    try:
        yield
    finally:
        c10d.default_pg_timeout, c10d.default_pg_nccl_timeout = saved


def init_process_group(device_type: str, timeout: datetime.timedelta | None = None) -> None:
    """Initialise the default process group (gloo on CPU, NCCL on CUDA) if nobody did yet."""
    if dist.is_initialized():
        return
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=timeout)


def validate_shard_size(shard_size: int, world_size: int) -> None:
    """Raise unless ``shard_size`` divides ``world_size``."""
    if not isinstance(shard_size, int) or shard_size < 1 or world_size % shard_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"shard_size={shard_size!r} must divide the world size {world_size}; accepted: {divisors}."
        )


# Where launchers say how many processes form a node, in order of precedence: accelerate's
# ``parallelism_config_dp_shard_size`` (from the YAML), then torchrun's ``--nproc_per_node``.
SHARD_SIZE_ENV = ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "LOCAL_WORLD_SIZE")


def resolve_shard_size(world_size: int, shard_size: int | None = None) -> int:
    """Processes per node: ``shard_size`` if given, else the launcher's (``SHARD_SIZE_ENV``), else the world.

    Raises ``ValueError`` listing the accepted values unless the result divides ``world_size``.
    """
    if shard_size is None:
        launcher = next((os.environ[name] for name in SHARD_SIZE_ENV if os.environ.get(name)), None)
        shard_size = int(launcher) if launcher else world_size
    validate_shard_size(shard_size, world_size)
    return shard_size


def build_hybrid_mesh(
    shard_size: int | None = None,
    device_type: str | None = None,
    timeout: datetime.timedelta | None = None,
) -> DeviceMesh:
    """A 2-D mesh ``("dp_replicate", "dp_shard")`` of ``world / shard_size`` nodes x ``shard_size`` ranks.

    ``shard_size`` defaults to the launcher's processes per node (:func:`resolve_shard_size`).
    """
    device_type = device_type or default_device_type()
    init_process_group(device_type, timeout)
    world_size = dist.get_world_size()
    shard_size = resolve_shard_size(world_size, shard_size)
    with group_timeout(timeout):
        return init_device_mesh(device_type, (world_size // shard_size, shard_size), mesh_dim_names=MESH_DIMS)


def block_classes(model: nn.Module) -> tuple[type[nn.Module], ...]:
    """The transformer block classes of a Transformers model (its ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return tuple({type(m) for m in model.modules() if type(m).__name__ in names})


def shard_model(model: nn.Module, mesh: DeviceMesh, *, hsdp: bool = False, **fully_shard_kwargs) -> nn.Module:
    """FSDP2-shard each transformer block, then the root (which keeps tied embeddings together).

    Shards over ``mesh["dp_shard"]`` only, so FSDP never talks across nodes. ``hsdp=True`` gives the
    stock HSDP baseline instead: sharded within, replicated (dense all-reduce) across nodes.
    """
    names = mesh.mesh_dim_names or ()
    shard_mesh = mesh[MESH_DIMS] if hsdp and "dp_replicate" in names else mesh["dp_shard"]
    classes = block_classes(model)
    for module in list(model.modules()):
        if classes and isinstance(module, classes):
            fully_shard(module, mesh=shard_mesh, **fully_shard_kwargs)
    fully_shard(model, mesh=shard_mesh, **fully_shard_kwargs)
    return model
