"""Run a worker script on several local gloo ranks with torchrun and collect each rank's result."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

WORKERS = Path(__file__).parent / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str | Path, nproc: int, args: list[str], timeout: float = 300, env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node nproc script args`` on CPU; raises with the log if it fails."""
    launcher = ["torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
                "--master_port", str(free_port())]
    return launch(launcher, script, args, timeout, env, check)


def accelerate_launch(config: Path, script: str | Path, args: list[str], timeout: float = 300,
                      cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file config script args`` (in ``cwd``); raises with the log if it fails."""
    launcher = ["accelerate.commands.launch", "--config_file", str(config), "--main_process_port", str(free_port())]
    return launch(launcher, script, args, timeout, cwd=cwd)


def launch(launcher: list[str], script: str | Path, args: list[str], timeout: float = 300, env: dict | None = None,
           check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", *launcher, str(script), *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    if check and proc.returncode != 0:
        log = f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log}")
    return proc


def run_worker(name: str, nproc: int, out: Path, *args: str, timeout: float = 300,
               env: dict | None = None) -> list[dict]:
    """Run ``tests/workers/<name>.py --out OUT args`` and load ``OUT/rank{r}.pt`` of every rank."""
    out.mkdir(parents=True, exist_ok=True)
    torchrun(WORKERS / f"{name}.py", nproc, ["--out", str(out), *args], timeout=timeout, env=env)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nproc)]
