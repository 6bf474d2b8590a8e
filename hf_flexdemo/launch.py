"""Several simulated nodes on one host: the torchrun command, the ranks' CPU environment, and running it to the end.

Why here: the tests and the benchmarks both start ``N nodes x M processes`` of gloo ranks on one machine, and both
need the same command line, environment and clean-up at a timeout. The installed package is the one place both can
import without path tricks, so the launcher lives here, and it imports only the standard library.

* :func:`torchrun_command`: ``python -m torch.distributed.run ...`` for one agent: one node on a free local port,
  or node ``node_rank`` of ``nnodes`` with a static rendezvous at ``master_addr:master_port``.
* :func:`elastic_torchrun_command`: one agent of an elastic job (``--nnodes MIN:MAX``, a c10d rendezvous, restarts);
  :func:`kill_agent`: such a node dies (its workers and agent SIGKILLed).
* :func:`cpu_env`: the ranks' environment: one OpenMP thread each (many ranks share a few cores), no GPU.
* :func:`run_commands`: launchers side by side, each in its own session; at the timeout every process group left is
  stopped (SIGTERM, then SIGKILL), so no rank outlives its job; a :class:`Job` with exit codes and output.
* :func:`run_local`: ``nnodes`` agents of ``nproc_per_node`` ranks on this host, through the two above.

A node of one agent (``nnodes=1``) is what the tests use: FlexDeMo groups ``nproc_per_node`` ranks into nodes of
``shard_size`` (``torchrun --nproc_per_node 4`` with ``shard_size=2`` is 2 nodes x 2 processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Job", "cpu_env", "elastic_torchrun_command", "free_port", "kill_agent", "run_commands", "run_local",
           "stop", "torchrun_command"]

STATIC_PORT = 29500  # a static rendezvous's default port (torchrun's)
_GRACE_S = 10.0  # between SIGTERM and SIGKILL


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the rendezvous of a local job)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_command(target: Sequence[str | Path], nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None,
                     python: str = sys.executable) -> list[str]:
    """``python -m torch.distributed.run --nproc_per_node M ... *target`` for one agent.

    ``target`` is ``[script, *args]`` or ``["-m", module, *args]``. With ``nnodes=1`` the agent is the whole job,
    on ``master_port`` or a free local port; with ``nnodes > 1`` it is node ``node_rank`` of a static rendezvous at
    ``master_addr:master_port`` (default 29500; every node's agent gets the same address and port).
    """
    if nproc_per_node < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"need nproc_per_node >= 1 and 0 <= node_rank < nnodes, got {nproc_per_node}, "
                         f"{node_rank}, {nnodes}")
    command = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc_per_node)]
    if nnodes > 1:
        command += ["--nnodes", str(nnodes), "--node_rank", str(node_rank), "--rdzv_backend", "static"]
        master_port = master_port or STATIC_PORT
    command += ["--master_addr", master_addr, "--master_port", str(master_port or free_port(master_addr))]
    return [*command, *map(str, target)]


def elastic_torchrun_command(target: Sequence[str | Path], nproc_per_node: int, *, nnodes: str, endpoint: str,
                             run_id: str, max_restarts: int, host: bool | None = None, last_call_s: float = 30,
                             monitor_s: float = 5, store_timeout_s: int = 60,
                             python: str = sys.executable) -> list[str]:
    """``python -m torch.distributed.run`` for one agent of an elastic job: ``nnodes`` as ``"MIN:MAX"``, a c10d
    rendezvous at ``endpoint`` (``host:port``) named ``run_id``, up to ``max_restarts`` restarts of its workers.

    ``host``: whether this agent hosts the rendezvous store (``None``: the agent whose address is the endpoint's; on
    one machine the first to bind it). The store lives as long as its agent, so the agent that hosts it must outlive
    the others. ``last_call_s``: how long a rendezvous that has ``MIN`` nodes waits for more; ``monitor_s``: how often
    an agent checks its workers and whether a node waits to join (which restarts the workers to let it in);
    ``store_timeout_s``: how long an agent tries to reach the rendezvous store before it ends with torch's
    ``RendezvousConnectionError`` (an endpoint no agent hosts, a firewall) instead of waiting for ever.
    """
    conf = (f"last_call_timeout={last_call_s:g},read_timeout={store_timeout_s:d}"
            + ("" if host is None else f",is_host={int(host)}"))
    return [python, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc_per_node", str(nproc_per_node),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", run_id, "--rdzv_conf", conf,
            "--max_restarts", str(max_restarts), "--monitor_interval", f"{monitor_s:g}", *map(str, target)]


def kill_agent(agent: subprocess.Popen) -> None:
    """A node dies: SIGKILL the agent's workers (torchrun starts each in a session of its own, so they are found as
    the agent's children, Linux's ``/proc``), then the agent's own session; wait for the agent."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # the process ended meanwhile
            continue
        if parent == agent.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stat.parent.name), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()


def cpu_env(env: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``env`` (default: this process's environment) for CPU ranks: ``OMP_NUM_THREADS=1`` (the ranks share the
    host's cores), ``CUDA_VISIBLE_DEVICES=""`` (gloo, no GPU), then ``extra``."""
    return {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


@dataclass(frozen=True)
class Job:
    """What :func:`run_commands` saw: one entry per launcher, in the order given."""

    commands: list[list[str]]
    returncodes: list[int | None]  # after a timeout: the code of the stopped launcher (negative: its signal)
    timed_out: bool  # a launcher still ran at the timeout (every one left was stopped)
    seconds: float
    stdout: list[str]  # each launcher's output ("" where it went to a log file)
    stderr: list[str]

    @property
    def ok(self) -> bool:
        """Every launcher exited 0 before the timeout."""
        return not self.timed_out and not any(self.returncodes)

    def describe(self, tail_chars: int = 8000) -> str:
        """The commands, how they ended and the tails of their output: the message of a failed job."""
        how = "timed out" if self.timed_out else f"exit codes {self.returncodes}"
        lines = [f"{len(self.commands)} launcher(s) {how} after {self.seconds:.0f} s:"]
        for command, out, err in zip(self.commands, self.stdout, self.stderr):
            lines += [" ".join(command), out[-(tail_chars // 2):], err[-tail_chars:]]
        return "\n".join(lines)


def stop(processes: Sequence[subprocess.Popen]) -> None:
    """SIGTERM each launcher's process group, then SIGKILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in processes if p.poll() is None]
        for process in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        deadline = time.monotonic() + _GRACE_S
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.1)


def run_commands(commands: Sequence[Sequence[str]], timeout_s: float, *,
                 envs: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 logs: Sequence[Path] | None = None) -> Job:
    """Run the launchers side by side until all exit or ``timeout_s`` passes; then stop every process group left.

    Each launcher starts in its own session (its ranks in its process group), so a timeout, an error or Ctrl-C here
    stops them all. ``envs``: one environment for all or one per launcher (default: this process's). ``logs``: a
    file per launcher for its stdout and stderr together (the :class:`Job` then holds no output); else both are
    captured and returned.
    """
    commands = [list(map(str, command)) for command in commands]
    if envs is None or isinstance(envs, Mapping):
        envs = [dict(os.environ if envs is None else envs)] * len(commands)
    with contextlib.ExitStack() as files:
        if logs is not None:
            outs = [files.enter_context(open(log, "w")) for log in logs]
            errs = [subprocess.STDOUT] * len(outs)
        else:
            outs = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in commands]
            errs = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in commands]
        processes: list[subprocess.Popen] = []
        start = time.monotonic()
        try:
            for command, env, out, err in zip(commands, envs, outs, errs, strict=True):
                processes.append(subprocess.Popen(command, env=dict(env), cwd=cwd, stdout=out, stderr=err,
                                                  stdin=subprocess.DEVNULL, start_new_session=True))
            deadline = start + timeout_s
            while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            timed_out = any(p.poll() is None for p in processes)
            stop(processes)
        seconds = time.monotonic() - start

        def read(handles: Sequence) -> list[str]:
            if logs is not None:
                return [""] * len(commands)
            texts = []
            for handle in handles:
                handle.seek(0)
                texts.append(handle.read())
            return texts

        stdout, stderr = read(outs), read(errs)
    return Job(commands, [p.returncode for p in processes], timed_out, seconds, stdout, stderr)


def run_local(target: Sequence[str | Path], nproc_per_node: int, *, nnodes: int = 1, timeout_s: float = 300,
              env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
              logs: Sequence[Path] | None = None) -> Job:
    """``nnodes`` torchrun agents of ``nproc_per_node`` ranks each on this host (a static rendezvous on a free
    local port when ``nnodes > 1``), run with :func:`run_commands`. ``env`` is the ranks' environment as given
    (e.g. :func:`cpu_env`; default: this process's)."""
    port = free_port() if nnodes > 1 else None
    commands = [torchrun_command(target, nproc_per_node, nnodes=nnodes, node_rank=node, master_port=port)
                for node in range(nnodes)]
    return run_commands(commands, timeout_s, envs=env, cwd=cwd, logs=logs)
