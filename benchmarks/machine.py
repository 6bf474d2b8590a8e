"""What a benchmark ran on (machine, package versions, git state), recorded in every results JSON."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("torch", "transformers", "accelerate", "datasets", "evaluate", "sacrebleu", "tokenizers", "detonation")


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True).stdout.strip()


def describe_machine() -> dict[str, Any]:
    """CPU count and model, kernel, Python and package versions, git commit and dirtiness, load average."""
    models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
              if line.startswith("model name")]
    return {
        "nproc": os.cpu_count(),
        "cpu_model": models[0] if models else platform.processor(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in PACKAGES},
        "git_commit": _git("rev-parse", "HEAD") or None,
        "git_status": _git("status", "--porcelain") or "clean",
        "loadavg": os.getloadavg(),
    }
