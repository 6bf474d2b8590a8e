"""Reusable step buffers: on CPU, fresh multi-MB allocations fault their pages in again on every step,
which costs as much as the transform itself; on GPU they would churn the caching allocator."""

from __future__ import annotations

import torch
from torch import Tensor


class Workspace:
    """Named contiguous buffers, grown on demand and handed out shaped like a given tensor."""

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def __call__(self, name: str, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """The buffer ``name`` viewed with ``like``'s shape, on its device, in ``dtype`` (default: ``like``'s).
        Its contents are whatever the last user left: callers overwrite it."""
        dtype = dtype or like.dtype
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < like.numel() or buffer.device != like.device or buffer.dtype != dtype:
            buffer = self._buffers[name] = like.new_empty(like.numel(), dtype=dtype)
        return buffer[: like.numel()].view(like.shape)
