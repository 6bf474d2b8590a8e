"""Cross-rank safety checks of FlexDeMo: non-finite inputs and replica drift.

Replicas stay identical only because they apply identical updates, and a non-finite value sent
once would poison every node's momentum. Both checks are collectives that every rank joins, so
all ranks reach the same decision (skip, raise or re-synchronise) and no rank is left waiting.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .replicate import CommStats, explained

NONFINITE_ACTIONS = ("skip", "raise")
DRIFT_ACTIONS = ("raise", "resync")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def nonfinite_ranks(tensors: list[Tensor], device: torch.device, stats: CommStats) -> list[int]:
    """Ranks (of the whole job) holding a NaN/Inf in ``tensors``; the same list on every rank.

    One 4-byte all-gather over all ranks (counted in ``stats.collectives``; its bytes are not
    counted as payload): every rank must take the same decision, or the ranks that carry on would
    wait forever for the ones that stopped.
    """
    local = bool(tensors) and not bool(torch.stack(torch._foreach_norm(tensors)).isfinite().all())
    flag = torch.tensor([int(local)], dtype=torch.int32, device=device)
    if not _distributed() or dist.get_world_size() == 1:
        return [0] if local else []
    world = dist.get_world_size()
    flags = flag.new_empty(world)
    with explained("all-gather of the non-finite flags", None):
        dist.all_gather_single(flags, flag)
    stats.collectives += 1
    return [rank for rank, bad in enumerate(flags.tolist()) if bad]


def fingerprint(tensor: Tensor) -> Tensor:
    """An exact checksum of ``tensor``'s bits (any changed bit changes it, barring collisions)."""
    bits = {4: torch.int32, 2: torch.int16, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(bits).sum(dtype=torch.int64)


def drifted(params: list[Tensor], group: dist.ProcessGroup, size: int) -> list[int]:
    """Indices of ``params`` (local shards) that differ between the replicas of ``group``."""
    local = torch.stack([fingerprint(p) for p in params]) if params else torch.zeros(0, dtype=torch.int64)
    gathered = local.new_empty(size * local.numel())
    with explained("all-gather of the parameter fingerprints", group):
        dist.all_gather_single(gathered, local.to(params[0].device) if params else local, group=group)
    gathered = gathered.view(size, -1).cpu()
    return (gathered != gathered[0]).any(dim=0).nonzero().flatten().tolist()


def agree(names: list[str]) -> list[str]:
    """The union of every rank's ``names``, on every rank: a job-wide decision after group-local checks."""
    if not _distributed():
        return sorted(set(names))
    gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, names)
    return sorted({name for rank_names in gathered for name in rank_names})


def resync(params: list[Tensor], group: dist.ProcessGroup) -> None:
    """Overwrite ``params`` with the replicate group's first replica (an exact copy)."""
    source = dist.get_global_rank(group, 0)
    for param in params:
        buffer = param.detach().contiguous()
        dist.broadcast(buffer, src=source, group=group)
        param.detach().copy_(buffer)
