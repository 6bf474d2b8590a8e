"""Faults on 4 CPU ranks (2 nodes x 2): a killed or stopped rank, a crash in the middle of a save.

The ranks are started directly (not by torchrun, whose agent would kill the survivors itself), so the
test sees what the surviving ranks do on their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import WORKERS, free_port, torchrun

from hf_flexdemo.trainer import checkpoint

TIMEOUT = 15


def _start_ranks(out: Path, *args: str) -> list[subprocess.Popen]:
    port = str(free_port())
    procs = []
    for rank in range(4):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "4",
               "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(WORKERS / "fault_worker.py"), "--out", str(out),
                                       "--timeout", str(TIMEOUT), *args],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return procs


def _wait_for_checkpoint(out: Path, procs: list[subprocess.Popen], limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while checkpoint.last_complete_checkpoint(out / "run") is None:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no checkpoint was written"
        time.sleep(0.2)


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP])
def test_surviving_ranks_fail_within_the_timeout(fault, tmp_path):
    procs = _start_ranks(tmp_path)
    try:
        _wait_for_checkpoint(tmp_path, procs)
        victim = procs[3]
        os.kill(victim.pid, fault)
        start = time.monotonic()
        for proc in procs[:3]:
            proc.wait(timeout=TIMEOUT + 45)
        elapsed = time.monotonic() - start
        logs = [proc.stderr.read() for proc in procs[:3]]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(proc.returncode != 0 for proc in procs[:3])
    assert elapsed < TIMEOUT + 45
    errors = ("FlexDeMo: the all-gather", "Connection closed by peer", "Connection reset by peer", "Timed out")
    for log in logs:  # the failed collective: FlexDeMo's own message, or gloo's from FSDP / Trainer
        assert any(error in log for error in errors), log[-3000:]


def test_crash_during_save_leaves_the_previous_checkpoint_as_the_one_resumed(tmp_path):
    proc = torchrun(WORKERS / "fault_worker.py", 4,
                    ["--out", str(tmp_path), "--steps", "12", "--crash_rank", "1", "--crash_step", "10"],
                    check=False, timeout=240)
    assert proc.returncode != 0
    run = tmp_path / "run"
    assert (run / "checkpoint-10").is_dir()  # it was mid-save
    assert not checkpoint.is_complete(run / "checkpoint-10")
    assert checkpoint.last_complete_checkpoint(run) == str(run / "checkpoint-5")
    resumed = torchrun(WORKERS / "fault_worker.py", 4, ["--out", str(tmp_path), "--steps", "12", "--resume"],
                       timeout=240)
    assert resumed.returncode == 0
    assert checkpoint.is_complete(run / "checkpoint-12")
