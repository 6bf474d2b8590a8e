"""The tests' launches: a worker script on several local gloo ranks (``hf_flexdemo.launch``, the launcher the
benchmarks use too), or under ``accelerate launch``, with each rank's result collected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from hf_flexdemo.launch import Job, cpu_env, free_port, run_commands, torchrun_command

WORKERS = Path(__file__).parent / "workers"

__all__ = ["WORKERS", "accelerate_launch", "free_port", "run_worker", "torchrun"]


def torchrun(script: str | Path, nproc: int, args: list[str], timeout: float = 300, env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node nproc script args`` on CPU (``script`` may be ``"-m"``, ``args`` then starting
    with the module); raises with the log if it fails (``check``) or runs past ``timeout``."""
    command = torchrun_command([script, *args], nproc)
    return _completed(run_commands([command], timeout, envs={**cpu_env(), **(env or {})}), check)


def accelerate_launch(config: Path, script: str | Path, args: list[str], timeout: float = 300,
                      cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file config script args`` (in ``cwd``); raises with the log if it fails."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--main_process_port", str(free_port()), str(script), *map(str, args)]
    return _completed(run_commands([command], timeout, envs=cpu_env(), cwd=cwd), check=True)


def _completed(job: Job, check: bool) -> subprocess.CompletedProcess:
    if job.timed_out or (check and not job.ok):
        raise AssertionError(job.describe())
    return subprocess.CompletedProcess(job.commands[0], job.returncodes[0], job.stdout[0], job.stderr[0])


def run_worker(name: str, nproc: int, out: Path, *args: str, timeout: float = 300,
               env: dict | None = None) -> list[dict]:
    """Run ``tests/distributed/workers/<name>.py --out OUT args`` and load ``OUT/rank{r}.pt`` of every rank."""
    out.mkdir(parents=True, exist_ok=True)
    torchrun(WORKERS / f"{name}.py", nproc, ["--out", str(out), *args], timeout=timeout, env=env)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nproc)]
