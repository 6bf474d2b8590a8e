"""Cross-rank safety checks of FlexDeMo: non-finite inputs and replica drift.

Replicas stay identical only because they apply identical updates, and a non-finite value sent
once would poison every node's momentum. Every rank must reach the same decision (skip, raise or
re-synchronise), or the ranks that carry on wait forever for the ones that stopped.

The non-finite decision costs no collective of its own across nodes: each rank's flag rides in its
payload (see :mod:`hf_flexdemo.optimizer`), so after the exchange a rank knows the flags of its
replicate group, and one MAX all-reduce inside the node (:func:`max_in_group`) makes it job-wide.
The drift check runs every ``drift_check_every`` steps only, in one of two ways (``on_drift``):

* exact (``"raise"``, ``"resync"``): replicas must be bit-identical; an 8-byte fingerprint per parameter travels.
  Right for nodes of one hardware model, whose kernels round alike.
* bounded (``"tolerate"``, :func:`check_within_bound`): for nodes of unlike hardware, whose inverse DCTs and GEMMs
  round differently in the last bit, so replicas part by rounding. Replica 0's shards are broadcast, each replica
  measures its largest difference, raises past ``drift_tolerance * (lr + eps * max|p|)`` and otherwise takes replica
  0's values, so the replicas are bit-identical again after every check.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import Tensor

from .replicate import CommStats, ReplicateGroup, all_gather_into, explained, pack, unpack


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def nonfinite(tensors: list[Tensor], device: torch.device) -> Tensor:
    """A 0-d ``uint8`` tensor on ``device``: 1 if any of ``tensors`` holds a NaN/Inf. No host sync."""
    if not tensors:
        return torch.zeros((), dtype=torch.uint8, device=device)
    finite = torch.stack([t.isfinite().all() for t in tensors]).all()
    return (~finite).to(torch.uint8)


def max_in_group(values: Tensor, group: dist.ProcessGroup | None, stats: CommStats) -> Tensor:
    """Element-wise maximum of a small float32 vector over ``group`` (one all-reduce, no host sync):
    the non-finite flag OR-ed, and a time budget's measured fraction, over the node."""
    if group is None or dist.get_world_size(group) == 1:
        return values
    buffer = values.to(torch.float32).clone()
    with explained("all-reduce of the non-finite flag", group):
        dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=group)
    stats.node_collectives += 1
    return buffer


def fingerprint(tensor: Tensor) -> Tensor:
    """An exact checksum of ``tensor``'s bits (any changed bit changes it, barring collisions)."""
    bits = {4: torch.int32, 2: torch.int16, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(bits).sum(dtype=torch.int64)


def drifted(params: list[Tensor], group: dist.ProcessGroup, size: int, device: torch.device) -> list[int]:
    """Indices of ``params`` (local shards) that differ between the replicas of ``group``."""
    local = torch.stack([fingerprint(p) for p in params]) if params else torch.zeros(0, dtype=torch.int64)
    local = local.to(device)
    gathered = local.new_empty(size * local.numel())
    with explained("all-gather of the parameter fingerprints", group):
        all_gather_into(gathered, local, group)
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


def check_replicas(named: list[tuple[str, Tensor]], group: dist.ProcessGroup | None, size: int, device: torch.device,
                   action: str) -> None:
    """Compare the named local shards across the replicate ``group``; on a mismatch anywhere in the job, raise
    naming the parameters (``action="raise"``) or copy replica 0's values (``"resync"``)."""
    if size == 1:
        return
    bad = drifted([p for _, p in named], group, size, device)
    names = agree([named[i][0] for i in bad])  # other replicate groups must stop too
    if not names:
        return
    if action == "raise":
        raise RuntimeError(f"FlexDeMo: replicas differ in {names} (on_drift='raise'). Replicas must start "
                           "identical (same seed or checkpoint) and apply identical updates.")
    warnings.warn(f"FlexDeMo: replicas differ in {names}; copying replica 0's values (on_drift='resync').",
                  stacklevel=4)
    resync([named[i][1] for i in bad], group)


def check_within_bound(named: list[tuple[str, Tensor]], lrs: list[float], tolerance: float, replicate: ReplicateGroup,
                       shard_group: dist.ProcessGroup | None, stats: CommStats) -> tuple[float, float]:
    """``on_drift="tolerate"``: compare the named local shards with replica 0's, raise past the bound, else copy them.

    The bound of a shard is ``tolerance * (lr + eps * max|p0|)``: ``lr`` (its group's, in ``lrs``) is the most one
    step of sign, AdamW or SGD on an Adam direction moves a coordinate, and ``eps * max|p0|`` one rounding of the
    shard's largest value in its dtype (``eps`` of float32 or bfloat16). Rounding on unlike hardware stays orders
    below it (``benchmarks/replica_drift.py``); a corrupted node or a bug that makes replicas apply different updates
    does not. One broadcast and one small all-reduce over the replicate group, one inside the node (the verdict made
    job-wide), one host sync. Returns the job's largest ``|p - p0|`` and its largest fraction of the bound.
    """
    shards = [p for _, p in named]
    if replicate.size == 1 or not shards:
        return 0.0, 0.0
    buffer = pack(shards)
    source = replicate.broadcast(buffer, stats).wait() if buffer.numel() else buffer
    drift, used = [], []
    for shard, reference, lr in zip(shards, unpack(source.view(1, -1), shards), lrs):
        reference = reference[0]
        if shard.numel() == 0:
            drift.append(shard.new_zeros((), dtype=torch.float32))
            used.append(shard.new_zeros((), dtype=torch.float32))
            continue
        difference = (shard.float() - reference.float()).abs().amax()
        bound = tolerance * (lr + torch.finfo(shard.dtype).eps * reference.float().abs().amax())
        drift.append(difference)
        used.append(difference / bound.clamp_min(torch.finfo(torch.float32).tiny))
        shard.detach().copy_(reference)  # replicas bit-identical again (a raise below ends the run anyway)
    verdict = replicate.all_reduce_max(torch.stack(used + drift), stats)
    verdict = max_in_group(verdict, shard_group, stats).tolist()  # the check's one host sync
    used_values, drift_values = verdict[:len(named)], verdict[len(named):]
    past = [(name, d, u) for (name, _), d, u in zip(named, drift_values, used_values) if u > 1.0]
    if past:
        listed = ", ".join(f"{name} (|p - p0| {d:.3g}, {u:.3g} x its bound)" for name, d, u in past)
        raise RuntimeError(
            f"FlexDeMo: replicas differ past the bound in [{listed}] (on_drift='tolerate', drift_tolerance="
            f"{tolerance:g}: bound = drift_tolerance * (lr + eps * max|p|)). Unlike hardware rounds orders below "
            "it: a node's parameters were corrupted or replicas apply different updates. Restart from the last "
            "checkpoint; if the nodes are healthy, raise drift_tolerance.")
    return max(drift_values), max(used_values)
