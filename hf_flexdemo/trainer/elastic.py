"""Elastic runs: a training script that an elastic launcher restarts resumes on its own.

Under ``torchrun --nnodes MIN:MAX --max-restarts K --rdzv-backend c10d``, a node that dies ends the survivors'
workers at their next collective, and their agents restart them after a new rendezvous; a node that comes back
joins at the next restart. With ``FlexDeMoConfig.elastic=True`` the restarted script needs nothing new:
``FlexDeMoTrainer.train()`` resumes from the last complete checkpoint in ``output_dir`` (none: from scratch), on
the topology it now has, under ``resume_policy`` (``"average"`` unless set).

Every resume on another topology (elastic or not) is a :class:`TopologyChange`: logged once with what it cost (the
steps since the checkpoint, the old and new topology, the policy), carried from checkpoint to checkpoint in the
topology record, and listed in the model card. The steps lost are counted from a progress file that the main
process rewrites after every optimizer step of an elastic run (:class:`ProgressCallback`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from . import checkpoint

logger = hf_logging.get_logger("transformers.trainer")

PROGRESS_FILE = "flexdemo_progress.json"
# What an elastic launcher's environment needs for a node to join a running job: torchrun's c10d rendezvous shares its
# store with the workers and keeps the first round's address for it, so an agent that joins later waits for an
# address no one publishes again (torch 2.13); without the sharing every round publishes its own.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
CHANGES_KEY = "topology_changes"  # in a checkpoint's topology record: the run's changes so far


@dataclass(frozen=True)
class TopologyChange:
    """A resume on another topology: from the checkpoint at ``step``, written on ``saved`` (nodes, processes per
    node), onto ``now``, under ``policy``; ``steps_lost``: steps the run had taken past that checkpoint (``None``
    where unknown)."""

    step: int
    saved: tuple[int, int]
    now: tuple[int, int]
    policy: str | None
    steps_lost: int | None = None

    def describe(self) -> str:
        lost = "unknown" if self.steps_lost is None else str(self.steps_lost)
        return (f"step {self.step}: {self.saved[0]} x {self.saved[1]} -> {self.now[0]} x {self.now[1]} "
                f"(nodes x processes), resume_policy={self.policy!r}, {lost} step(s) lost")

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> TopologyChange:
        return cls(**{**record, "saved": tuple(record["saved"]), "now": tuple(record["now"])})


def read_progress(output_dir: str | os.PathLike) -> dict[str, int] | None:
    """An elastic run's progress file in ``output_dir``: ``global_step``, the last optimizer step finished, and
    ``pid``, the main process's (a new one after every restart); ``None``: none yet."""
    try:
        record = json.loads(Path(output_dir, PROGRESS_FILE).read_text())
        return {"global_step": int(record["global_step"]), "pid": int(record["pid"])}
    except (FileNotFoundError, ValueError, KeyError):
        return None


def last_progress(output_dir: str | os.PathLike) -> int | None:
    """The last optimizer step an elastic run in ``output_dir`` finished (``None``: none)."""
    record = read_progress(output_dir)
    return None if record is None else record["global_step"]


def steps_lost(step: int, output_dir: str | os.PathLike) -> int | None:
    """The steps an elastic run in ``output_dir`` took past the checkpoint of ``step`` (``None``: unknown)."""
    reached = last_progress(output_dir)
    return None if reached is None or reached < step else reached - step


def resume_record(resume_from_checkpoint: str, now: dict[str, int], policy: str | None,
                  output_dir: str | os.PathLike) -> tuple[list[TopologyChange], TopologyChange | None]:
    """The run's topology changes up to a resume from ``resume_from_checkpoint`` onto ``now`` (a topology record),
    and the resume's own change (``None``: the same topology, or no FlexDeMo record in the checkpoint)."""
    saved = checkpoint.read_topology(resume_from_checkpoint)
    if saved is None:
        return [], None
    changes = [TopologyChange.from_dict(c) for c in saved.get(CHANGES_KEY, [])]
    shape = (saved["replicate_size"], saved["shard_size"])
    if shape == (now["replicate_size"], now["shard_size"]):
        return changes, None
    step = checkpoint.checkpoint_step(resume_from_checkpoint)
    change = TopologyChange(step, shape, (now["replicate_size"], now["shard_size"]), policy,
                            steps_lost(step, output_dir))
    return [*changes, change], change


def log_resume(resume_from_checkpoint: str, change: TopologyChange | None, output_dir: str | os.PathLike) -> None:
    """Once, on the main process: where an elastic run resumed and what it lost (a topology change: a warning)."""
    if change is not None:
        logger.warning(f"FlexDeMo: resuming {resume_from_checkpoint} on another topology: {change.describe()}.")
        return
    step = checkpoint.checkpoint_step(resume_from_checkpoint)
    lost = steps_lost(step, output_dir)
    logger.info(f"FlexDeMo: resuming {resume_from_checkpoint} (step {step}) on the same topology"
                + ("" if lost is None else f"; {lost} step(s) lost") + ".")


def as_records(changes: list[TopologyChange]) -> list[dict[str, Any]]:
    return [asdict(change) for change in changes]


class ProgressCallback(TrainerCallback):
    """Rewrites ``output_dir/flexdemo_progress.json`` with the global step and the process id after every optimizer
    step (main process): what a restart counts the steps it lost from, and what tells a watcher that it restarted."""

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.is_world_process_zero:
            record = {"global_step": state.global_step, "pid": os.getpid()}
            checkpoint.atomic_write(Path(args.output_dir, PROGRESS_FILE), lambda p: p.write_text(json.dumps(record)))
