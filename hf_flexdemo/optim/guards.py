"""Cross-rank safety checks of FlexDeMo: non-finite inputs and replica drift.

Replicas stay identical only because they apply identical updates, and a non-finite value sent
once would poison every node's momentum. Every rank must reach the same decision (skip, raise or
re-synchronise), or the ranks that carry on wait forever for the ones that stopped.

The non-finite decision costs no collective of its own across nodes: each rank's flag rides in its
payload (see :mod:`hf_flexdemo.optim.optimizer`), so after the exchange a rank knows the flags of its
replicate group, and one MAX all-reduce inside the node (:func:`max_in_group`) makes it job-wide.
The drift check runs every ``drift_check_every`` steps only, in one of two ways (``on_drift``):

* exact (``"raise"``, ``"resync"``): replicas must be bit-identical; an 8-byte fingerprint per parameter travels.
  Right for nodes of one hardware model, whose kernels round alike.
* bounded (``"tolerate"``, :func:`check_within_bound`): for nodes of unlike hardware, whose inverse DCTs and GEMMs
  round differently in the last bit, so replicas part by rounding. Replica 0's shards are broadcast, each replica
  measures its largest difference, raises past ``drift_tolerance * (lr + eps * max|p|)`` and otherwise takes replica
  0's values, so the replicas are bit-identical again after every check.

``"auto"`` (the default) is exact where every replica runs the same device model and torch / CUDA / NCCL
versions, bounded where they differ: decided at the first check from a hash of :func:`hardware`, agreed over the
replicate group and the node (one more small all-reduce and host sync, once a run).

Either way the check's collectives stay on the replicate group and the node, as the non-finite decision's: the
per-parameter verdict, agreed over the replicate group, is made job-wide by one MAX inside the node, and read by
one host sync.
"""

from __future__ import annotations

import platform
import warnings
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from ..wire.collectives import CommStats, ReplicateGroup, explained, pack, unpack
from .plan import local_shard


def nonfinite(tensors: list[Tensor], device: torch.device) -> Tensor:
    """A 0-d ``uint8`` tensor on ``device``: 1 if any of ``tensors`` holds a NaN/Inf. No host sync.

    A tensor's minimum and maximum are finite exactly when all of it is (NaN propagates into both): one reduction,
    where ``isfinite().all()`` writes a bool per element first (~7x slower on CPU)."""
    extremes = [torch.stack(torch.aminmax(t)).float() for t in tensors if t.numel()]
    if not extremes:
        return torch.zeros((), dtype=torch.uint8, device=device)
    return (~torch.cat(extremes).isfinite().all()).to(torch.uint8)


def max_in_group(values: Tensor, group: dist.ProcessGroup | None, stats: CommStats,
                 what: str = "all-reduce of the non-finite flag") -> Tensor:
    """Element-wise maximum of a small float32 vector over ``group`` (one all-reduce, no host sync): the non-finite
    flag OR-ed, a time budget's measured fraction, or the drift check's verdict, over the node."""
    if group is None or dist.get_world_size(group) == 1:
        return values
    buffer = values.to(torch.float32).clone()
    with explained(what, group):
        dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=group)
    stats.node_collectives += 1
    return buffer


def fingerprint(tensor: Tensor) -> Tensor:
    """An exact checksum of ``tensor``'s bits (any changed bit changes it, barring collisions)."""
    bits = {4: torch.int32, 2: torch.int16, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(bits).sum(dtype=torch.int64)


def replica0(shards: list[Tensor], replicate: ReplicateGroup, stats: CommStats) -> list[Tensor]:
    """Replica 0's values of ``shards`` (this rank's local shards; every replica holds the same shapes), in one
    broadcast over the replicate group."""
    buffer = pack(shards)
    if buffer.numel():
        replicate.broadcast(buffer, stats).wait()
    return [row[0] for row in unpack(buffer.view(1, -1), shards)]


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.exists() else []
    return models[0] if models else platform.processor() or platform.machine()


def hardware(device: torch.device) -> dict[str, str]:
    """This rank's device model and the torch, CUDA and NCCL versions it runs ("-" where there is none): what decides
    how its kernels round."""
    cuda = device.type == "cuda"
    return {"device": torch.cuda.get_device_name(device) if cuda else f"CPU {_cpu_name()}",
            "torch": torch.__version__, "cuda": torch.version.cuda or "-",
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else "-"}


def hardware_differs(device: torch.device, replicate: ReplicateGroup, shard_group: dist.ProcessGroup | None,
                     stats: CommStats) -> bool:
    """Whether any two replicas of any shard run unlike hardware or versions (:func:`hardware`), the same answer on
    every rank: a 20-bit hash of this rank's (exact in float32) and its negation, MAX-reduced over the replicate
    group and the node (``max == -max(-h)`` iff all equal); one host sync."""
    digest = float(zlib.crc32("|".join(hardware(device).values()).encode()) & 0xFFFFF)
    both = replicate.all_reduce_max(torch.tensor([digest, -digest], device=device), stats)
    spread = _job_wide(torch.stack([both[0] + both[1]]), shard_group, stats)
    return spread[0] > 0


def _job_wide(verdict: Tensor, shard_group: dist.ProcessGroup | None, stats: CommStats) -> list[float]:
    """A per-parameter verdict already agreed over the replicate group, made job-wide by a MAX inside the node (each
    node holds one rank of every replicate group) and read on the host: the check's one host sync."""
    return max_in_group(verdict, shard_group, stats, "all-reduce of the drift check's verdict").tolist()


def check_replicas(named: list[tuple[str, Tensor]], replicate: ReplicateGroup, shard_group: dist.ProcessGroup | None,
                   action: str, stats: CommStats) -> None:
    """Compare the named local shards' fingerprints across the replicate group; on a mismatch anywhere in the job,
    raise naming the parameters (``action="raise"``) or copy replica 0's values (``"resync"``). One all-gather of
    8 bytes per parameter over the replicate group, one MAX inside the node, one host sync."""
    if replicate.size == 1 or not named:
        return
    local = torch.stack([fingerprint(p) for _, p in named])
    gathered = replicate.all_gather(local, stats, "all-gather of the parameter fingerprints").wait()
    differ = _job_wide((gathered != gathered[0]).any(dim=0).to(torch.float32), shard_group, stats)
    bad = [i for i, flag in enumerate(differ) if flag > 0]
    if not bad:
        return
    names = sorted(named[i][0] for i in bad)
    if action == "raise":
        raise RuntimeError(f"FlexDeMo: replicas differ in {names} (on_drift='raise'). Replicas must start "
                           "identical (same seed or checkpoint) and apply identical updates; nodes of unlike "
                           "hardware round differently: use on_drift='tolerate' there.")
    warnings.warn(f"FlexDeMo: replicas differ in {names}; copying replica 0's values (on_drift='resync').",
                  stacklevel=4)
    shards = [named[i][1] for i in bad]
    for shard, source in zip(shards, replica0(shards, replicate, stats)):
        shard.detach().copy_(source)


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
    drift, used = [], []
    for shard, reference, lr in zip(shards, replica0(shards, replicate, stats), lrs):
        if shard.numel() == 0:
            drift.append(shard.new_zeros((), dtype=torch.float32))
            used.append(shard.new_zeros((), dtype=torch.float32))
            continue
        difference = (shard.float() - reference.float()).abs().amax()
        bound = tolerance * (lr + torch.finfo(shard.dtype).eps * reference.float().abs().amax())
        drift.append(difference)
        used.append(difference / bound.clamp_min(torch.finfo(torch.float32).tiny))
        shard.detach().copy_(reference)  # replicas bit-identical again (a raise below ends the run anyway)
    verdict = _job_wide(replicate.all_reduce_max(torch.stack(used + drift), stats), shard_group, stats)
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


class DriftCheck:
    """One optimizer's replica comparison (``on_drift``): ``policy`` is ``on_drift`` with ``"auto"`` resolved at the
    first check, the same on every rank; ``replica_drift`` the bounded check's last job-wide largest ``|p - p0|``
    and largest fraction of its bound."""

    def __init__(self, replicate: ReplicateGroup, shard_group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.replicate, self.shard_group, self.device = replicate, shard_group, device
        self.policy: str | None = None
        self.replica_drift: dict[str, float] = {}

    def check(self, named: list[tuple[str, Tensor]], lrs: list[float], *, on_drift: str, tolerance: float,
              stats: CommStats) -> None:
        """Compare the named local shards across the replicas (``lrs``: each one's peak learning rate, the bound's
        step): bit for bit (:func:`check_replicas`) or within the bound (:func:`check_within_bound`)."""
        if self.policy is None:  # on_drift="auto": exact on one kind of hardware, bounded across kinds
            self.policy = on_drift
            if on_drift == "auto":
                mixed = hardware_differs(self.device, self.replicate, self.shard_group, stats)
                self.policy = "tolerate" if mixed else "raise"
        if self.policy == "tolerate":
            drift, used = check_within_bound(named, lrs, tolerance, self.replicate, self.shard_group, stats)
            self.replica_drift = {"replica_drift": drift, "replica_drift_of_bound": used}
        else:
            check_replicas(named, self.replicate, self.shard_group, self.policy, stats)


class DriftChecking:
    """The drift check's schedule and entry point, and the parameters' names its reports use: a mixin of
    :class:`~hf_flexdemo.optim.optimizer.FlexDeMo`, on the optimizer's own attributes."""

    def drift_check_due(self) -> bool:
        """Whether this step is in a drift-check window: the first ``local_steps`` steps of every
        ``drift_check_every`` (the first point in it where replicas agree checks)."""
        every = self.options["drift_check_every"]
        return bool(every) and self.steps % every < self.options["local_steps"]

    def check_drift(self, only: list[Tensor] | None = None) -> None:
        """Compare the replicas' parameters (``on_drift``, :class:`~.guards.DriftCheck`). With local steps
        the anchor is what replicas share (the parameters restart from it): it is checked, and the parameters
        restart from it again, as a resync left it. ``only``: these parameters alone (local steps'
        ``outer_fragments``: the fragment that just landed; the others' replicas differ and keep their values)."""
        params = self._named_params()
        if only is not None:
            wanted = {id(p) for p in only}
            params = [(name, p) for name, p in params if id(p) in wanted]
        anchored = self.mode.anchors and all("anchor" in self.state[p] for _, p in params)
        named = [(name, self.state[p]["anchor"] if anchored else local_shard(p)) for name, p in params]
        # a schedule's peak (torch schedulers keep it as initial_lr): the largest step since the last check
        peak = {id(p): max(g["lr"], g.get("initial_lr", g["lr"])) for g in self.param_groups for p in g["params"]}
        self.drift.check(named, [peak[id(p)] for _, p in params], on_drift=self.options["on_drift"],
                         tolerance=self.options["drift_tolerance"], stats=self.exchange.stats)
        if anchored:
            torch._foreach_copy_([local_shard(p) for _, p in params], [anchor for _, anchor in named])

    def param_names(self) -> list[tuple[str, Tensor]]:
        """Every parameter with its name (``param_names`` of a group if given, else its position), in
        ``state_dict`` order."""
        named = []
        for g, group in enumerate(self.param_groups):
            names = group.get("param_names") or [f"param_groups[{g}][{i}]" for i in range(len(group["params"]))]
            named += list(zip(names, group["params"]))
        return named

    def _named_params(self) -> list[tuple[str, Tensor]]:
        """The trainable parameters with their names (:meth:`param_names`)."""
        return [(n, p) for n, p in self.param_names() if p.requires_grad]
