"""FlexDeMo's additions to a Trainer checkpoint.

* Per-rank optimizer state: each node's error-feedback momentum differs, so DCP (which
  de-duplicates state across replicas) would silently swap it; every rank writes its own file.
* The topology the checkpoint was written with and what a resume on another one needs to map the ranks' state
  (the rank files, whether a delayed exchange is pending, the parameters' full shapes): the same topology resumes
  exactly; another one only under a ``resume_policy`` (:mod:`hf_flexdemo.optim.reshard`), refused before any step.
* A completion marker written after every rank finished its part: a checkpoint without it, or without one of the
  rank files (written in the background, they may land after the marker), is never resumed.
Files are written to a temporary name and renamed, so a crash never leaves a truncated file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..optim import reshard
from ..optim.optimizer import FlexDeMo
from ..optim.plan import local_shard
from ..optim.reshard import RESUME_POLICIES, ResumePolicy
from .background_writer import BackgroundWriter

OPTIMIZER_DIR = "flexdemo_optimizer"
TOPOLOGY_FILE = "flexdemo_topology.json"
COMPLETE_FILE = "flexdemo_complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TOPOLOGY_KEYS = ("world_size", "shard_size", "replicate_size")
SETUP_KEYS = (*TOPOLOGY_KEYS, "method")  # what must match for an exact resume


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` then rename ``tmp`` to ``path``: readers see the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def rank_file(rank: int) -> str:
    return f"{OPTIMIZER_DIR}/rank{rank:05d}.pt"


def write_state(path: Path, state: dict[str, Any]) -> None:
    atomic_write(path, lambda p: torch.save(state, p))


def save_optimizer(optimizer: FlexDeMo, checkpoint: str | os.PathLike, rank: int,
                   writer: BackgroundWriter | None = None) -> None:
    """Write this rank's optimizer state to ``checkpoint/flexdemo_optimizer/rank{rank}.pt``: now, or from a host
    copy by ``writer`` while training goes on."""
    Path(checkpoint, OPTIMIZER_DIR).mkdir(parents=True, exist_ok=True)
    path, state = Path(checkpoint, rank_file(rank)), optimizer.state_dict()
    if writer is None:
        write_state(path, state)
    else:
        writer.submit(path, state)


def describe_state(optimizer: FlexDeMo, world_size: int) -> dict[str, Any]:
    """What a resume on another topology needs besides the topology (call after ``state_dict``, which holds a
    delayed exchange): the rank files, whether a delayed exchange is pending, whether local steps run, and each
    parameter's name and full shape in ``state_dict`` order."""
    params = [(name, list(p.shape)) for name, p in optimizer.param_names()]
    return {"files": [rank_file(r) for r in range(world_size)], "pending": optimizer.holds_exchange,
            "local_steps": optimizer.options["local_steps"], "params": params}


def load_optimizer(optimizer: FlexDeMo, checkpoint: str | os.PathLike, rank: int) -> None:
    """Load this rank's optimizer state (tensors only: ``weights_only=True``)."""
    path = Path(checkpoint, rank_file(rank))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the checkpoint was not written by FlexDeMo on this topology.")
    optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def write_topology(checkpoint: str | os.PathLike, record: dict[str, Any]) -> None:
    path = Path(checkpoint, TOPOLOGY_FILE)
    atomic_write(path, lambda p: p.write_text(json.dumps(record, indent=2, sort_keys=True)))


def read_topology(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The topology record of ``checkpoint`` (``None``: written without FlexDeMo state, method="adamw")."""
    path = Path(checkpoint, TOPOLOGY_FILE)
    return json.loads(path.read_text()) if path.is_file() else None


def load_resharded(optimizer: FlexDeMo, checkpoint: str | os.PathLike, rank: int, shard_size: int,
                   replicate_size: int, policy: ResumePolicy) -> None:
    """Load this rank's share of a checkpoint written on another topology (:func:`hf_flexdemo.optim.reshard.
    reshard_state_dict` over every old rank's file: each rank reads them all, fine for the models one node's memory
    holds many times over), then check each state tensor against the shard FSDP2 gave this rank."""
    saved = read_topology(checkpoint)
    now = [list(p.shape) for group in optimizer.param_groups for p in group["params"]]
    differ = [(name, shape, full) for (name, shape), full in zip(saved["params"], now) if shape != full]
    if differ or len(now) != len(saved["params"]):
        raise ValueError(f"{checkpoint} was written for other parameters: {len(saved['params'])} saved, {len(now)} "
                         f"now; (name, saved shape, shape now) = {differ[:3]}. Accepted: the same model.")
    states = [torch.load(Path(checkpoint, name), map_location="cpu", weights_only=True) for name in saved["files"]]
    optimizer.load_state_dict(reshard.reshard_state_dict(
        states, old_shard_size=saved["shard_size"], rank=rank, shard_size=shard_size, replicate_size=replicate_size,
        policy=policy))
    for group in optimizer.param_groups:
        for p in group["params"]:
            shard = tuple(local_shard(p).shape)
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() and tuple(value.shape) != shard:
                    raise RuntimeError(f"resharded optimizer state {key!r} has shape {tuple(value.shape)} but this "
                                       f"rank's shard of a {tuple(p.shape)} parameter is {shard}.")


def check_resumable(checkpoint: str | os.PathLike, record: dict[str, Any],
                    policy: ResumePolicy | None = None) -> bool:
    """Raise unless ``checkpoint`` is complete and resumes here: same method, and the same topology or a
    ``policy`` that maps the saved one onto this one. Whether the optimizer state must be resharded."""
    checkpoint = Path(checkpoint)
    if not is_complete(checkpoint):
        raise ValueError(f"{checkpoint} is incomplete (no {COMPLETE_FILE}, or a rank file missing): a save was "
                         "interrupted. "
                         "Resume from an earlier checkpoint, or pass resume_from_checkpoint=True to pick the "
                         "last complete one.")
    saved = read_topology(checkpoint)
    if saved is None:
        return False  # written without FlexDeMo state (method="adamw"): Trainer's own checks apply
    diff = {k: (saved.get(k), record.get(k)) for k in SETUP_KEYS if saved.get(k) != record.get(k)}
    if not diff:
        return False
    if "method" in diff:
        raise ValueError(f"{checkpoint} was written with a different setup; (saved, now) = {diff}. "
                         "Accepted: resume with the method it was written with.")
    same_nodes = saved["replicate_size"] == record["replicate_size"]
    allowing = " | ".join(f"'{p}'" for p in RESUME_POLICIES if same_nodes or p != "keep")
    if policy is None or (policy == "keep" and not same_nodes):
        raise ValueError(f"{checkpoint} was written on another topology; (saved, now) = {diff}, and "
                         f"resume_policy={policy!r}. FlexDeMo keeps per-node momentum: resume on the same nodes x "
                         f"processes, or set FlexDeMoConfig.resume_policy (--resume_policy) to {allowing} to reshard "
                         "it (docs/multi-node.md \"Changing the cluster under a run\").")
    if "files" not in saved:
        raise ValueError(f"{checkpoint} was written before elastic resume ({TOPOLOGY_FILE} lists no rank files); "
                         f"accepted: resume it on its own topology; (saved, now) = {diff}.")
    if saved["pending"] and saved.get("local_steps", 1) == 1:  # local steps hold theirs per parameter (reshard)
        raise ValueError(f"{checkpoint} holds a pending delayed exchange (overlap='delayed', local_steps=1), whose "
                         f"bucketing depends on the shard shapes; (saved, now) = {diff}. Accepted: resume it on its "
                         "own topology, or take the checkpoint from a run with overlap='none' | 'backward'.")
    return True


def mark_complete(checkpoint: str | os.PathLike, step: int) -> None:
    """Record that every rank finished its part of ``checkpoint`` (call after a barrier, on one rank); rank files
    written in the background may land after it (:func:`is_complete`)."""
    atomic_write(Path(checkpoint, COMPLETE_FILE), lambda p: p.write_text(json.dumps({"global_step": step})))


def is_complete(checkpoint: str | os.PathLike) -> bool:
    """The completion marker is there, and so is every rank file the topology record lists."""
    if not Path(checkpoint, COMPLETE_FILE).is_file():
        return False
    record = read_topology(checkpoint) or {}
    return all(Path(checkpoint, name).is_file() for name in record.get("files", ()))


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """The global step a complete ``checkpoint`` was written at."""
    return int(json.loads(Path(checkpoint, COMPLETE_FILE).read_text())["global_step"])


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The ``checkpoint-N`` folder with the highest ``N`` that is complete, if any."""
    if not Path(output_dir).is_dir():
        return None
    found = [(int(m.group(1)), p) for p in Path(output_dir).iterdir() if (m := _CHECKPOINT.match(p.name))]
    for _, path in sorted(found, reverse=True):
        if is_complete(path):
            return str(path)
    return None
