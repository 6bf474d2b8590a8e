"""What every benchmark shares: torchrun jobs, their environment, provenance of the results, plots and tables.

The scripts run as ``python benchmarks/X.py``, so this module is a plain sibling import (``import harness``); the
studies run as ``python -m benchmarks.studies.X`` from the repository root and import ``benchmarks.harness``.

* Jobs, on the package's launcher (:mod:`hf_flexdemo.launch`, which the tests use too): :func:`torchrun` (the
  launcher's command line), :func:`worker_env` (one thread per rank, CPU only, offline), :func:`run_job` (one or
  more launchers with a timeout; a launcher's whole process group is stopped when it is over; one status of
  :data:`STATUSES` and the logs' tails). The ranks import ``hf_flexdemo`` as installed: :meth:`Run.start` refuses
  to run unless that is this checkout (``pip install -e .``), so the commit a JSON records is the code it ran.
* FlexDeMo knobs: drivers take ``--flexdemo FIELD=VALUE ...`` (``FlexDeMoConfig`` fields) and hand them to their
  worker as ``--FIELD=VALUE`` (:func:`flexdemo_flags`); a worker reads them back with :func:`parse_flexdemo`.
* Provenance: :func:`add_provenance_flags` (``--allow_dirty``) and :class:`Run`, which records when the run starts
  the header every results JSON carries: ``command``, ``started_at``, ``git_commit``, ``git_dirty`` (and, when
  dirty, ``git_status`` and ``git_diff_sha256``, the SHA-256 of ``git diff HEAD``), ``machine``, ``versions``;
  ``duration_seconds`` when the report is written. Writing into ``benchmarks/results/`` from a tree with
  uncommitted changes (``benchmarks/results/`` itself aside) is refused unless ``--allow_dirty`` is given.
* Output: :func:`figure` (a matplotlib figure saved and closed), :func:`markdown_table`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from hf_flexdemo import launch

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PACKAGES = ("torch", "transformers", "accelerate", "datasets", "evaluate", "sacrebleu", "tokenizers", "detonation")
# run_job's statuses: every launcher exited 0 (and wrote the expected file); one ran past the timeout; else.
OK, TIMEOUT, FAILED = "ok", "timeout", "failed"
STATUSES = (OK, TIMEOUT, FAILED)
# Outputs of the benchmarks, not the code that produced them: not counted as uncommitted changes.
_NOT_CODE = ":(exclude)benchmarks/results"


# --- jobs -------------------------------------------------------------------------------------------------


# The launcher's command line: ``[python, -m, torch.distributed.run, ..., script, *args]`` for one node on a free local
# port, or node ``node_rank`` of ``nnodes`` with a static rendezvous at ``master_addr:master_port``.
torchrun = launch.torchrun_command


def worker_env(*, gloo_interface: str | None = None, datasets_cache: Path | None = None) -> dict[str, str]:
    """The environment of a benchmark's ranks: one OpenMP thread each, no GPU (``launch.cpu_env``), no Hub; gloo
    bound to ``gloo_interface`` (an emulated link's veth) and a datasets cache if given."""
    env = launch.cpu_env(HF_HUB_OFFLINE="1")
    if gloo_interface is not None:
        env["GLOO_SOCKET_IFNAME"] = gloo_interface
    if datasets_cache is not None:
        env["HF_DATASETS_CACHE"] = str(datasets_cache)
    return env


def run_job(commands: Sequence[Sequence[str]], logs: Sequence[Path], timeout_s: float,
            envs: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None, expect: Path | None = None,
            tail_chars: int = 8000) -> dict[str, Any]:
    """Run the launchers side by side (``launch.run_commands``: each in its own session, output to its log) until
    all exit or ``timeout_s`` passes; then stop every process group that is left.

    Returns ``status`` (``"ok"``: every launcher exited 0 and ``expect``, if given, exists; ``"timeout"``;
    ``"failed"``), ``returncodes``, ``launch_seconds`` and, unless ok, ``log_tails`` (and ``error`` when the job
    exited 0 without writing ``expect``).
    """
    job = launch.run_commands(commands, timeout_s, envs=envs, logs=logs)
    record: dict[str, Any] = {"status": OK, "returncodes": job.returncodes, "launch_seconds": job.seconds}
    if job.timed_out:
        record["status"] = TIMEOUT
    elif not job.ok:
        record["status"] = FAILED
    elif expect is not None and not expect.exists():
        record |= {"status": FAILED, "error": f"every launcher exited 0 but {expect.name} was not written"}
    if record["status"] != OK:
        record["log_tails"] = [log.read_text(errors="replace")[-tail_chars:] for log in logs]
    return record


# --- FlexDeMo knobs -----------------------------------------------------------------------------------------


def flexdemo_field(text: str) -> str:
    """argparse type of ``--flexdemo FIELD=VALUE`` (the worker checks the field and the value)."""
    name, sep, value = text.partition("=")
    if not (sep and name.isidentifier() and value):
        raise argparse.ArgumentTypeError(f"--flexdemo takes FIELD=VALUE (a FlexDeMoConfig field), got {text!r}")
    return text


def add_flexdemo_flag(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--flexdemo", nargs="+", type=flexdemo_field, default=[], metavar="FIELD=VALUE", help=help)


def flexdemo_flags(fields: Sequence[str]) -> list[str]:
    """``FIELD=VALUE`` pairs as the worker's ``--FIELD=VALUE`` flags."""
    return [f"--{pair}" for pair in fields]


def parse_flexdemo(argv: Sequence[str], **fixed: Any) -> tuple[Any, dict[str, Any]]:
    """A worker's ``--FIELD=VALUE`` flags as the recipes parse them: the ``FlexDeMoConfig`` (``fixed`` fields
    set too) and the fields the flags named, typed."""
    from transformers import HfArgumentParser

    from hf_flexdemo import FlexDeMoConfig

    given = [a[2:].split("=", 1)[0] for a in argv if a.startswith("--")]
    extra = [token for name, value in fixed.items() for token in (f"--{name}", str(value))]
    (config,) = HfArgumentParser(FlexDeMoConfig).parse_args_into_dataclasses(args=[*argv, *extra])
    return config, {name: getattr(config, name) for name in given}


# --- provenance ---------------------------------------------------------------------------------------------


def require_this_checkout() -> None:
    """Exit with a message unless the ``hf_flexdemo`` that imports here (and in the ranks, which get no
    ``PYTHONPATH``) is this checkout's: the results record this checkout's commit."""
    spec = importlib.util.find_spec("hf_flexdemo")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is None or not origin.is_relative_to(REPO):
        sys.exit(f"[harness] hf_flexdemo imports from {origin}, not from this checkout ({REPO}): the benchmarks "
                 f"measure the installed package, so install this one first: pip install -e \"{REPO}[bench]\"")


def _git(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True)


def git_state() -> dict[str, Any]:
    """``git_commit``, ``git_dirty`` and, when dirty, ``git_status`` (porcelain lines, untracked files included)
    and ``git_diff_sha256`` (of ``git diff HEAD --binary``); ``benchmarks/results/`` is not counted."""
    commit = _git("rev-parse", "HEAD").stdout.decode().strip() or None
    status = _git("status", "--porcelain", "--", ".", _NOT_CODE).stdout.decode().splitlines()
    state: dict[str, Any] = {"git_commit": commit, "git_dirty": bool(status)}
    if status:
        diff = _git("diff", "HEAD", "--binary", "--", ".", _NOT_CODE).stdout
        state |= {"git_status": status, "git_diff_sha256": hashlib.sha256(diff).hexdigest()}
    return state


def describe_machine() -> dict[str, Any]:
    """CPU count and model, kernel, Python, and the load average at the call."""
    models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
              if line.startswith("model name")]
    return {"nproc": os.cpu_count(), "cpu_model": models[0] if models else platform.processor(),
            "kernel": platform.release(), "python": platform.python_version(), "loadavg_at_start": os.getloadavg()}


def versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def add_provenance_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow_dirty", action="store_true",
                        help="write into benchmarks/results/ from a tree with uncommitted changes (the JSON records "
                             "git_dirty and git_diff_sha256, the SHA-256 of `git diff HEAD`)")


def refuse_dirty(out: Path, git: dict[str, Any], allow_dirty: bool) -> None:
    """Exit with a message when ``out`` is under ``benchmarks/results/``, the tree is dirty and not allowed."""
    if not git["git_dirty"] or allow_dirty or not out.resolve().is_relative_to(RESULTS):
        return
    listed = "; ".join(line.strip() for line in git["git_status"][:5]) + (" ..." if len(git["git_status"]) > 5 else "")
    sys.exit(f"[harness] refusing to write {out}: the working tree has uncommitted changes ({listed}). Results in "
             "benchmarks/results/ must name the commit that produced them: commit first, write elsewhere with "
             "--out, or pass --allow_dirty (the JSON then records git_dirty and git_diff_sha256).")


@dataclass
class Run:
    """One benchmark run: the results header, taken when it starts, and its clock."""

    header: dict[str, Any]
    clock: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, out: Path | Sequence[Path], allow_dirty: bool = False) -> Run:
        """Record the command, time, git state, machine and versions; refuse a dirty tree, or a package that is
        not this checkout's (see the module)."""
        require_this_checkout()
        git = git_state()
        for path in [out] if isinstance(out, Path) else out:
            refuse_dirty(path, git, allow_dirty)
        header = {
            "command": shlex.join(sys.orig_argv),
            "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **git,
            "machine": describe_machine(),
            "versions": versions(),
        }
        return cls(header)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.clock

    def report(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The header, ``duration_seconds`` so far, then ``body``."""
        return {**self.header, "duration_seconds": self.seconds, **body}

    def write(self, path: Path, body: Mapping[str, Any]) -> dict[str, Any]:
        """Write :meth:`report` as JSON to ``path`` (folders made); return it."""
        return write_json(path, self.report(body))


def write_json(path: Path, report: Mapping[str, Any]) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return dict(report)


# --- plots and tables ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def figure(path: Path, panels: int = 1, figsize: tuple[float, float] = (7, 4.5),
           title: str | None = None) -> Iterator[list[Any]]:
    """``panels`` matplotlib axes side by side (Agg backend); on exit the figure gets ``title``, a tight layout,
    is saved to ``path`` at 120 dpi and closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=figsize, squeeze=False)
    try:
        yield list(axes[0])
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; a row may have fewer cells than columns (a status row)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join([*lines, *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)])
