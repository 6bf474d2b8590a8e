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
# `accelerate launch` exports the YAML's parallelism_config as PARALLELISM_CONFIG_<FIELD> (accelerate.utils.launch.
# prepare_extend_env_parallelism_config): the number of nodes, and the parallelisms the trainer does not run.
REPLICATE_SIZE_ENV = "PARALLELISM_CONFIG_DP_REPLICATE_SIZE"
UNSUPPORTED_SIZE_ENV = ("PARALLELISM_CONFIG_TP_SIZE", "PARALLELISM_CONFIG_CP_SIZE", "PARALLELISM_CONFIG_SP_SIZE")


def launcher_shard_size() -> tuple[str, int] | None:
    """The launcher's processes per node and the variable that says it (the first of ``SHARD_SIZE_ENV`` set)."""
    name = next((name for name in SHARD_SIZE_ENV if os.environ.get(name)), None)
    return None if name is None else (name, int(os.environ[name]))


def _check_accelerate_config(world_size: int, shard_size: int | None) -> None:
    """Refuse an accelerate YAML that asks for a parallelism this package does not run (the trainer builds its own
    parallelism config), or, when it says the shard size (``shard_size``), whose ``dp_replicate_size x
    dp_shard_size`` is not the number of processes."""
    for name in UNSUPPORTED_SIZE_ENV:
        if os.environ.get(name, "1") not in ("", "1"):
            field = name.lower()
            raise ValueError(f"FlexDeMo: invalid {field}={os.environ[name]} (the accelerate config's "
                             f"parallelism_config); accepted: 1: FSDP2 inside each node and FlexDeMo between nodes "
                             f"are data parallelism only; set {field}: 1 in the YAML.")
    replicate = os.environ.get(REPLICATE_SIZE_ENV)
    if shard_size is None or not replicate or int(replicate) * shard_size == world_size:
        return
    nodes = world_size // shard_size if world_size % shard_size == 0 else None
    fix = (f"parallelism_config_dp_replicate_size: {nodes} (nodes) with parallelism_config_dp_shard_size: {shard_size} "
           "(processes per node)" if nodes else "a parallelism_config_dp_shard_size that divides num_processes")
    raise ValueError(f"FlexDeMo: invalid parallelism_config_dp_replicate_size x parallelism_config_dp_shard_size = "
                     f"{replicate} x {shard_size} = {int(replicate) * shard_size} (the accelerate config's "
                     f"parallelism_config); accepted: a product equal to the {world_size} processes launched "
                     f"(num_processes); set {fix} in the YAML, or launch {int(replicate) * shard_size} processes.")


def resolve_shard_size(world_size: int, shard_size: int | None = None) -> int:
    """Processes per node: ``shard_size`` if given, else the launcher's (``SHARD_SIZE_ENV``), else the world.

    Raises ``ValueError`` listing the accepted values unless the result divides ``world_size``; and, when the
    value comes from an accelerate YAML, unless its ``dp_replicate_size x dp_shard_size`` is ``world_size``.
    An accelerate YAML asking for tensor, context or sequence parallelism is refused either way.
    """
    from_yaml = None
    if shard_size is None:
        launcher = launcher_shard_size()
        shard_size = launcher[1] if launcher else world_size
        from_yaml = shard_size if launcher and launcher[0] == SHARD_SIZE_ENV[0] else None
    _check_accelerate_config(world_size, from_yaml)
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
