"""FSDP2 through Accelerate on CPU (gloo).

torch runs FSDP2 on CPU, but Accelerate only switches to ``DistributedType.FSDP`` for GPU-like
devices: on ``MULTI_CPU`` it drops the FSDP plugin (and would wrap the model in DDP) and refuses a
``ParallelismConfig``. This is the one place that adapts it: after the ``Accelerator`` is built
without them, set the state Accelerate would have set on a GPU.
"""

from __future__ import annotations

from accelerate import Accelerator, ParallelismConfig
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin


def enable_fsdp_on_cpu(
    accelerator: Accelerator, fsdp_plugin: FullyShardedDataParallelPlugin, config: ParallelismConfig | None
) -> None:
    """Turn a ``MULTI_CPU`` accelerator into an FSDP2 one with ``config``'s device mesh."""
    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        raise RuntimeError(f"expected a MULTI_CPU accelerator, got {state.distributed_type}")
    if state.mixed_precision != "no":
        fsdp_plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    # AcceleratorState() re-reads the type from PartialState: without this, full state-dict saves break.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.fsdp_plugin = fsdp_plugin
    state.parallelism_config = config
    state.device_mesh = None if config is None else config.get_device_mesh("cpu")
