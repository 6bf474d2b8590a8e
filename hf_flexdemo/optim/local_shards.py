"""Each rank's own parameter shards while the replicas differ (mid-round, or streaming before a landing).

The consensus then is the anchor, ``state["anchor"]``: a Trainer checkpoint and evaluation use it
(:func:`anchored`), and an exact resume needs each rank's local shard besides, which ``state_dict`` carries as
``state["local"]`` (:func:`save`, :func:`load`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .plan import local_shard

LOCAL_KEY = "local"  # mid-round state_dict only: this rank's parameter shard


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


@contextmanager
def anchored(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Inside the block the parameters with an anchor hold it; after it, this rank's local values again (restored bit
    for bit)."""
    params = [p for p in _params(optimizer) if "anchor" in optimizer.state.get(p, {})]
    if not params:  # nothing anchored yet (torch's foreach ops refuse empty lists)
        yield
        return
    shards = [local_shard(p) for p in params]
    held = [shard.detach().clone() for shard in shards]
    with torch.no_grad():
        torch._foreach_copy_(shards, [optimizer.state[p]["anchor"] for p in params])
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(shards, held)


def save(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Add each parameter's local shard to ``state`` (the optimizer's ``state_dict``; ``optimizer.state`` is
    untouched)."""
    params = _params(optimizer)
    for index, saved in state["state"].items():
        state["state"][index] = {**saved, LOCAL_KEY: local_shard(params[index]).detach().clone()}


def load(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """Restore the local shards a ``state_dict`` holds into the parameters (and keep none in ``optimizer.state``)."""
    params = _params(optimizer)
    for index, saved in state_dict["state"].items():
        optimizer.state[params[index]].pop(LOCAL_KEY, None)
        if LOCAL_KEY in saved:
            with torch.no_grad():
                local_shard(params[index]).copy_(saved[LOCAL_KEY])
