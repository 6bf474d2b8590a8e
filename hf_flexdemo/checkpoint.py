"""FlexDeMo's additions to a Trainer checkpoint.

* Per-rank optimizer state: each node's error-feedback momentum differs, so DCP (which
  de-duplicates state across replicas) would silently swap it; every rank writes its own file.
* The topology the checkpoint was written with, checked before a resume.
* A completion marker written after every rank finished: a checkpoint without it is never resumed.
Files are written to a temporary name and renamed, so a crash never leaves a truncated file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from .optimizer import FlexDeMo

OPTIMIZER_DIR = "flexdemo_optimizer"
TOPOLOGY_FILE = "flexdemo_topology.json"
COMPLETE_FILE = "flexdemo_complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_optimizer(optimizer: FlexDeMo, checkpoint: str | os.PathLike, rank: int) -> None:
    """Write this rank's optimizer state to ``checkpoint/flexdemo_optimizer/rank{rank}.pt``."""
    directory = Path(checkpoint, OPTIMIZER_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    state = optimizer.state_dict()
    _atomic_write(directory / f"rank{rank:05d}.pt", lambda p: torch.save(state, p))


def load_optimizer(optimizer: FlexDeMo, checkpoint: str | os.PathLike, rank: int) -> None:
    """Load this rank's optimizer state (tensors only: ``weights_only=True``)."""
    path = Path(checkpoint, OPTIMIZER_DIR, f"rank{rank:05d}.pt")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the checkpoint was not written by FlexDeMo on this topology.")
    optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def write_topology(checkpoint: str | os.PathLike, record: dict[str, Any]) -> None:
    path = Path(checkpoint, TOPOLOGY_FILE)
    _atomic_write(path, lambda p: p.write_text(json.dumps(record, indent=2, sort_keys=True)))


def check_resumable(checkpoint: str | os.PathLike, record: dict[str, Any]) -> None:
    """Raise unless ``checkpoint`` is complete and was written with the same topology and method."""
    checkpoint = Path(checkpoint)
    if not is_complete(checkpoint):
        raise ValueError(f"{checkpoint} is incomplete (no {COMPLETE_FILE}): a save was interrupted. "
                         "Resume from an earlier checkpoint, or pass resume_from_checkpoint=True to pick the "
                         "last complete one.")
    path = checkpoint / TOPOLOGY_FILE
    if not path.is_file():
        return  # written without FlexDeMo state (method="adamw"): Trainer's own checks apply
    saved = json.loads(path.read_text())
    if saved != record:
        keys = sorted(set(saved) | set(record))
        diff = {k: (saved.get(k), record.get(k)) for k in keys if saved.get(k) != record.get(k)}
        raise ValueError(f"{checkpoint} was written with a different setup; (saved, now) = {diff}. "
                         "FlexDeMo keeps per-rank momentum, so resume on the same nodes x processes and method.")


def mark_complete(checkpoint: str | os.PathLike, step: int) -> None:
    """Record that every rank finished writing ``checkpoint`` (call after a barrier, on one rank)."""
    _atomic_write(Path(checkpoint, COMPLETE_FILE), lambda p: p.write_text(json.dumps({"global_step": step})))


def is_complete(checkpoint: str | os.PathLike) -> bool:
    return Path(checkpoint, COMPLETE_FILE).is_file()


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The ``checkpoint-N`` folder with the highest ``N`` that is complete, if any."""
    if not Path(output_dir).is_dir():
        return None
    found = [(int(m.group(1)), p) for p in Path(output_dir).iterdir() if (m := _CHECKPOINT.match(p.name))]
    for _, path in sorted(found, reverse=True):
        if is_complete(path):
            return str(path)
    return None
