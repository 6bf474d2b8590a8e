"""A checkpoint file written in the background: the step goes on while a rank's optimizer state reaches the disk.

``submit`` copies the state to host memory (the part the step waits for: a device-to-host copy on GPU, a memory
copy on CPU), then a thread writes the copy through :func:`hf_flexdemo.trainer.checkpoint.atomic_write`, so the
file appears whole or not at all, and a checkpoint counts as complete only once every rank's file is there
(:func:`hf_flexdemo.trainer.checkpoint.is_complete`). One write is in flight at a time: ``submit`` and ``wait``
first join the one before and raise what it raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map


def host_copy(state: Any) -> Any:
    """``state`` with every tensor copied to host memory: what the background write sees stays as it was."""
    return tree_map(lambda x: x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x, state)


class BackgroundWriter:
    """Writes one file at a time on a thread (the module docstring)."""

    def __init__(self, write: Callable[[Path, Any], None]) -> None:
        self._write = write
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        """Whether a write is still in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, path: Path, state: Any) -> None:
        """Write ``state`` (copied to host memory now) to ``path`` in the background."""
        self.wait()
        snapshot = host_copy(state)
        self._thread = threading.Thread(target=self._run, args=(path, snapshot), name="flexdemo-checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        """Until the write in flight has landed; raise if it failed (the checkpoint it belongs to stays incomplete)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"FlexDeMo: writing a checkpoint's optimizer state in the background failed: {error!r}. "
                               "The checkpoint is incomplete and is never resumed.") from error

    def _run(self, path: Path, state: Any) -> None:
        try:
            self._write(path, state)
        except BaseException as error:  # noqa: BLE001 -- raised again in the training thread by wait()
            self._error = error
