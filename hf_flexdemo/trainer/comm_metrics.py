"""Inter-node traffic in the Trainer logs: ``flexdemo/*`` keys that every ``report_to`` backend records."""

from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..optim.optimizer import FlexDeMo

_SUMMED = ("bytes_sent", "bytes_received", "dense_bytes")


def dense_bf16_bytes(dense_fp32_bytes: int) -> int:
    """A rank's bytes in a bfloat16 ring all-reduce of the shards whose fp32 all-reduce sends ``dense_fp32_bytes``
    (the optimizer's ``comm_stats["dense_bytes"]``): ``replicate.dense_allreduce_bytes(numel, R, 2)`` exactly, since
    ``floor(floor(8 (R - 1) n / R) / 2) = floor(4 (R - 1) n / R)``."""
    return dense_fp32_bytes // 2


def unwrap_optimizer(optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
    """The optimizer inside Accelerate's ``AcceleratedOptimizer`` wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


class CommMetricsCallback(TrainerCallback, ExportableState):
    """Accumulates FlexDeMo's per-step ``comm_stats`` between logging steps.

    :meth:`collect` (a collective: every rank calls it at each logging step) returns job-wide values:
    bytes summed over all ranks per optimizer step, averaged over the steps since the last log;
    ``comm_seconds`` is the mean time a rank's step waited on inter-node collectives (read from the
    optimizer's timer here, at logging time: on CUDA it is measured with events, which must not be read
    inside the step). ``compression_ratio`` is the bytes a dense bfloat16 ring all-reduce of the same shards
    would send (AdamW-HSDP with ``reduce_dtype="bfloat16"``) over the bytes sent; ``compression_ratio_fp32``
    the same against FSDP2's float32 default. ``bits_per_param_sent`` / ``_received`` are a node's inter-node bits per
    optimizer step over the model's trainable parameters (:mod:`hf_flexdemo.wire.estimate` computes them from the
    formulas).
    """

    def __init__(self, total_bytes_sent: float = 0.0) -> None:
        self.total_bytes_sent = total_bytes_sent
        self._window = torch.zeros(len(_SUMMED) + 2, dtype=torch.float64)
        self._checkpoint_total: float | None = None  # set by checkpoint_total() for the checkpoint being saved

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        """A resumed run continues the checkpoint's total (``trainer_state.json``'s ``stateful_callbacks``), whatever
        ``restore_callback_states_from_checkpoint`` says: Trainer restores callbacks only when it is ``True`` (the
        default is ``False``), and the total and the model card's bytes would restart from 0. On a fresh run the
        entry is this callback's own state, so nothing changes."""
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        saved = saved[0] if isinstance(saved, list) and saved else saved
        if isinstance(saved, dict) and "total_bytes_sent" in saved.get("args", {}):
            self.total_bytes_sent = float(saved["args"]["total_bytes_sent"])

    def checkpoint_total(self, device: torch.device) -> None:
        """A collective (every rank calls it before a checkpoint is saved): the total including the optimizer steps
        since the last log, which :meth:`state` then records, so a resume continues the straight run's count even
        when the checkpoint's step is not a logging step. The window itself is left for the next log."""
        pending = self._window[:1].to(device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(pending)
        self._checkpoint_total = self.total_bytes_sent + pending.item()

    def checkpoint_saved(self) -> None:
        self._checkpoint_total = None

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs) -> None:
        inner = unwrap_optimizer(optimizer)
        if isinstance(inner, FlexDeMo):
            stats = inner.comm_stats
            summed = [*(float(stats[k]) for k in _SUMMED), float(dense_bf16_bytes(stats["dense_bytes"])), 1.0]
            self._window += torch.tensor(summed, dtype=torch.float64)  # the bf16 bytes floored per rank and step

    def collect(self, device: torch.device, optimizer: FlexDeMo) -> dict[str, float]:
        window = torch.cat([self._window, torch.tensor([optimizer.pop_exchange_seconds()], dtype=torch.float64)])
        window = window.to(device)
        world = 1
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(window)
            world = dist.get_world_size()
        self._window.zero_()
        sent, received, dense, dense_bf16, steps, seconds = window.tolist()
        steps = max(steps / world, 1.0)  # every rank counted the same steps
        self.total_bytes_sent += sent
        logs = {
            "flexdemo/bytes_sent": sent / steps,
            "flexdemo/bytes_received": received / steps,
            "flexdemo/comm_seconds": seconds / world / steps,
            "flexdemo/total_bytes_sent": self.total_bytes_sent,
        }
        parameters, nodes = optimizer.planner.parameters, optimizer.replicate.size
        if parameters and nodes > 1:  # a node's bits per parameter per step: the figure that carries over to a model
            logs["flexdemo/bits_per_param_sent"] = sent / steps * 8 / nodes / parameters
            logs["flexdemo/bits_per_param_received"] = received / steps * 8 / nodes / parameters
        if sent:  # vs what AdamW-HSDP would send: a bf16 gradient all-reduce (headline), and the fp32 default
            logs["flexdemo/compression_ratio"] = dense_bf16 / sent
            logs["flexdemo/compression_ratio_fp32"] = dense / sent
        if optimizer.rate is not None:
            logs["flexdemo/rate"] = optimizer.rate  # agreed by every rank (a budget moves it)
        return logs

    def state(self) -> dict:
        total = self.total_bytes_sent if self._checkpoint_total is None else self._checkpoint_total
        return {"args": {"total_bytes_sent": total}, "attributes": {}}
