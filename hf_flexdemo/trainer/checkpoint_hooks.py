"""``FlexDeMoTrainer``'s checkpoint hooks: what ``Trainer`` saves and resumes, with FlexDeMo's per-rank state.

``Trainer`` saves one optimizer state for all ranks; FlexDeMo's differs per node, so each rank writes its own, with the
topology and, once every rank is done, a completion marker (:mod:`hf_flexdemo.trainer.checkpoint`). With
``FlexDeMoConfig.async_save`` the rank files land in the background (:mod:`hf_flexdemo.trainer.background_writer`),
after the marker; rotation keeps ``save_total_limit`` checkpoints whose every file has landed. FSDP's own copy of the
weights is not written: ``model.safetensors`` holds them once, and resumes and the best model load from it.
A resume picks the last *complete* checkpoint for ``True``/``"last"``, is checked against the topology before any
step, and crosses the FSDP2 / plain-replica boundary (one process per node) for the weights; with
``FlexDeMoConfig.elastic`` a plain ``train()`` resumes too (:mod:`hf_flexdemo.trainer.elastic`).
A mixin of :class:`~hf_flexdemo.trainer.trainer.FlexDeMoTrainer`, on the trainer's own attributes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from accelerate.utils.constants import FSDP_MODEL_NAME
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers.trainer import SCHEDULER_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from transformers.utils import SAFE_WEIGHTS_NAME, logging

from . import checkpoint, elastic
from .background_writer import BackgroundWriter

logger = logging.get_logger(__name__)


class CheckpointHooks:
    """``Trainer``'s checkpoint methods for FlexDeMo (see the module docstring)."""

    def _init_checkpoint_writer(self) -> None:
        """``FlexDeMoConfig.async_save`` (``None``: on, but for ``method="adamw"``): each rank's optimizer state is
        written by a :class:`BackgroundWriter` while training goes on."""
        config = self.flexdemo_config
        on = config.async_save is not False and config.method != "adamw"
        self._checkpoint_writer = BackgroundWriter(checkpoint.write_state) if on else None

    def _setup_record(self) -> dict[str, Any]:
        return {**self.topology.as_dict(), "method": self.flexdemo_config.method}

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs: Any):
        """As ``Trainer.train``; ``True``/``"last"`` resumes from the last *complete* checkpoint, and so does ``None``
        with ``FlexDeMoConfig.elastic`` (from scratch where there is none: an elastic launcher's first start)."""
        auto = resume_from_checkpoint is None and self.flexdemo_config.elastic
        if auto or resume_from_checkpoint is True or resume_from_checkpoint == "last":
            resume_from_checkpoint = checkpoint.last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None and not auto:
                raise ValueError(f"No complete checkpoint to resume from in {self.args.output_dir}.")
        self._reshard = isinstance(resume_from_checkpoint, str) and checkpoint.check_resumable(
            resume_from_checkpoint, self._setup_record(), self.flexdemo_config.resume_policy)
        if isinstance(resume_from_checkpoint, str):
            self.topology_changes, change = elastic.resume_record(
                resume_from_checkpoint, self._setup_record(), self.flexdemo_config.resume_policy, self.args.output_dir)
            if self.is_world_process_zero():
                elastic.log_resume(resume_from_checkpoint, change, self.args.output_dir)
        output = super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
        self._finish_checkpoint_writes()
        return output

    def _finish_checkpoint_writes(self) -> None:
        """At the end of ``train()``: every rank's last optimizer state has landed, and the checkpoint kept beyond
        ``save_total_limit`` while it was in flight is rotated away."""
        if self._checkpoint_writer is None:
            return
        self._checkpoint_writer.wait()
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self._rotate(self._get_output_dir(trial=None), self.args.save_total_limit)

    def _rotate(self, run_dir: str, limit: int | None) -> None:
        rotate_checkpoints(output_dir=run_dir, save_total_limit=limit,
                           best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        """As ``Trainer``, from the weights a FlexDeMo checkpoint holds once: ``model.safetensors`` (the consensus,
        what ``from_pretrained`` reads), into FSDP2 shards or a plain replica alike. A checkpoint with FSDP's own
        weights file (``method="adamw"``, or saved by an earlier release) loads from that file."""
        fsdp_weights = Path(resume_from_checkpoint, f"{FSDP_MODEL_NAME}.bin")
        if fsdp_weights.is_file() == self.is_fsdp_enabled:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            return
        model = model or self.model
        if self.is_fsdp_enabled:  # the full state dict into FSDP2 shards (tied weights are saved once)
            full = safetensors.torch.load_file(Path(resume_from_checkpoint, SAFE_WEIGHTS_NAME), device="cpu")
            set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, strict=False))
        else:  # FSDP's full state dict into a plain model
            model.load_state_dict(torch.load(fsdp_weights, map_location="cpu", weights_only=True))

    def _load_best_model(self) -> None:
        """As ``Trainer``, which under FSDP reads FSDP's weights file only: :meth:`_load_from_checkpoint` reads
        whichever file the checkpoint holds (a FlexDeMo checkpoint's weights are in ``model.safetensors``)."""
        if not self.is_fsdp_enabled:
            super()._load_best_model()
            return
        best = self.state.best_model_checkpoint
        logger.info(f"Loading best model from {best} (score: {self.state.best_metric}).")
        self._load_from_checkpoint(best)

    def _save_checkpoint(self, model: torch.nn.Module, trial) -> None:
        limit = self.args.save_total_limit
        self.args.save_total_limit = None  # rotate only once the new checkpoint is complete
        if self.flexdemo_optimizer is not None:  # trainer_state.json records the total, unlogged steps included
            self.comm_metrics.checkpoint_total(self.accelerator.device)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
            self.comm_metrics.checkpoint_saved()
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.accelerator.wait_for_everyone()  # every rank's part written, or its optimizer state in flight
        if self.args.should_save:
            checkpoint.mark_complete(folder, self.state.global_step)
            # In flight, this checkpoint is not yet one to resume: keep the `limit` before it (each rank waited for
            # its previous write before this one, so they are whole) until the next save or the end of train().
            in_flight = limit is not None and self._checkpoint_writer is not None
            self._rotate(run_dir, limit + 1 if in_flight else limit)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        optimizer = self.flexdemo_optimizer
        if optimizer is None:
            super()._save_optimizer_and_scheduler(output_dir)
            return
        # The weights are `save_model`'s model.safetensors alone (FSDP's copy of them is not written): the consensus;
        # mid-round, each rank's local values travel in its optimizer state.
        checkpoint.save_optimizer(optimizer, output_dir, self.args.process_index, self._checkpoint_writer)
        if self.args.should_save:
            checkpoint.write_topology(output_dir, {**self._setup_record(),
                                                   **checkpoint.describe_state(optimizer, self.topology.world_size),
                                                   elastic.CHANGES_KEY: elastic.as_records(self.topology_changes)})
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint_dir: str | None) -> None:
        optimizer = self.flexdemo_optimizer
        if checkpoint_dir is None or optimizer is None:
            super()._load_optimizer_and_scheduler(checkpoint_dir)
            return
        if self._reshard:
            checkpoint.load_resharded(optimizer, checkpoint_dir, self.args.process_index, self.topology.shard_size,
                                      self.topology.replicate_size, self.flexdemo_config.resume_policy)
        else:
            checkpoint.load_optimizer(optimizer, checkpoint_dir, self.args.process_index)
        self.lr_scheduler.load_state_dict(
            torch.load(os.path.join(checkpoint_dir, SCHEDULER_NAME), weights_only=True)
        )
