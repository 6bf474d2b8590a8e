"""FlexDeMo: decoupled-momentum optimisation across nodes, on top of FSDP2 shards.

Per step and per parameter shard (``g`` already averaged over the node by FSDP):

1. momentum ``delta <- beta * delta + lr * g`` (``momentum="lr"``, DeMo) or ``+ (1 - beta) * g`` (``"ema"``),
   or ``+`` AdamW's first moment ``m`` of this replica's ``g`` (``"avg"``) or its direction ``m / (sqrt(v) + eps)``
   (``"adam"``, the default: without compression and with ``update="sgd"`` this is AdamW)
2. DCT of ``delta`` in blocks; per block, a fraction ``compression_rate`` of the coefficients is kept: the
   largest (``replicator="demo"``) or positions every replica draws from the same seed (``"random"``)
3. error feedback ``delta <- delta - alpha * IDCT(kept)`` (``alpha = compression_feedback``)
4. the exchange over the replicate group: an all-gather of positions and values (``"demo"``; by default
   float8 values and a bitmask of each block's positions) or an all-reduce of the values alone (``"random"``)
5. ``Q`` = the decode of all replicas' payloads (bit-identical on every replica): each coefficient's mean over
   the replicas that chose it (``consensus="choosers"``, DeMo) or over all replicas (``"replicas"``, the default)
6. decoupled weight decay and the update: ``p <- p - lr * sign(Q)`` (``"sign"``), SGD on ``Q``
   (``"sgd"``, the default), AdamW fed with ``Q`` as its gradient (``"adamw"``), or AdamW without its first moment
   (``"rmsprop"``: ``Q`` is already averaged by error feedback; the second moment gives every coordinate
   its own step size, which a sign update lacks)

``replicator="full"`` replaces 2-5 by a dense average of ``delta`` (which is then spent entirely);
``"none"`` keeps everything local (a single node). Parameters may be FSDP2 ``DTensor`` shards or
plain tensors; all arithmetic runs on local shards, state is created lazily.

When the exchange happens (``overlap``):

* ``"none"``: ``step()`` compresses every shard and exchanges them in one collective;
* ``"backward"``: parameters fall into exchange buckets of about ``bucket_cap_mb`` (DDP's convention,
  in reverse parameter order); a bucket is compressed and its collective started from the hook FSDP2
  fires once the bucket's node-averaged shards are final, so the network carries it while backward
  computes the rest; ``step()`` waits, decodes and applies. The arithmetic is the same as ``"none"``'s
  (bit-identical parameters); only the collectives are split;
* ``"delayed"``: ``step()`` applies the previous step's consensus and starts this step's exchange,
  which then travels during the next forward and backward (one step of staleness, as in Psyche).

What a GPU cluster needs from ``step()``: the collectives that cross nodes carry the payload (the
non-finite flag rides in it), one tiny all-reduce stays inside the node (the flag, made job-wide), and
the host waits for the device once (the skip decision). Every tensor lives on the parameters' device,
and ``torch.profiler`` shows the phases as ``FlexDeMo::compress``, ``::exchange``, ``::decode``, ``::apply``.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.optim.adamw import adamw
from torch.profiler import record_function

from . import budget, compression, guards
from .compression import VALUE_DTYPES, ValueDtype
from .dct import BlockLayout
from .guards import DriftAction, NonfiniteAction
from .replicate import CommStats, Pending, ReplicateGroup, dense_allreduce_bytes, exchange_bytes, pack, unpack

Update = Literal["sign", "sgd", "adamw", "rmsprop"]
Replicator = Literal["demo", "random", "full", "none"]
Momentum = Literal["lr", "ema", "avg", "adam"]
Overlap = Literal["none", "backward", "delayed"]
UPDATES: tuple[str, ...] = get_args(Update)
REPLICATORS: tuple[str, ...] = get_args(Replicator)
MOMENTUMS: tuple[str, ...] = get_args(Momentum)
OVERLAPS: tuple[str, ...] = get_args(Overlap)
PARAM_DTYPES = (torch.float32, torch.bfloat16)
# The measured operating point (README "Choosing the defaults"; benchmarks/results/sweep_density.json).
DEFAULT_RATE = 1 / 4
DEFAULT_CHUNK = 32
DEFAULT_BUCKET_MB = 25.0  # DDP's bucket_cap_mb
DEFAULT_MIN_RATE, DEFAULT_MAX_RATE = 1 / 64, 1 / 4
# The replica's own gradient moments of momentum="avg" ("adam" adds the second), float32 like delta.
MOMENT_KEYS = ("grad_avg", "grad_avg_sq")
# State held until overlap="delayed" applies it (see state_dict), and what stays float32 whatever the params.
PENDING_KEYS = ("pending_delta", "pending_update", *(f"pending_{key}" for key in MOMENT_KEYS))
FLOAT32_KEYS = ("delta", *MOMENT_KEYS, *PENDING_KEYS)
# Knobs that hold for the whole optimizer (shared exchanges), not per parameter group.
GLOBAL_KNOBS = ("replicator", "consensus", "value_dtype", "replicator_seed", "on_nonfinite", "drift_check_every",
                "on_drift", "overlap", "bucket_cap_mb", "budget_bytes", "budget_fraction", "budget_min_rate",
                "budget_max_rate")


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _check(ok: bool, name: str, value: Any, accepted: str) -> None:
    if not ok:
        raise ValueError(f"FlexDeMo: invalid {name}={value!r}; accepted: {accepted}.")


def validate_knobs(
    *, compression_rate: float | None = None, compression_topk: int | None = None, compression_chunk: int = 1,
    compression_decay: float = 0.0, compression_feedback: float = 1.0, momentum: str = "lr",
    update: str = "sign", replicator: str = "demo", consensus: str = "choosers", value_dtype: str = "bfloat16",
    replicator_seed: int = 0, on_nonfinite: str = "skip", drift_check_every: int = 0, on_drift: str = "raise",
    overlap: str = "none",
    bucket_cap_mb: float = DEFAULT_BUCKET_MB, budget_bytes: int | None = None, budget_fraction: float | None = None,
    budget_min_rate: float = DEFAULT_MIN_RATE, budget_max_rate: float = DEFAULT_MAX_RATE,
) -> None:
    """Raise ``ValueError`` naming the field and the accepted values for any invalid FlexDeMo knob."""
    if compression_rate is not None and compression_topk is not None:
        raise ValueError(f"FlexDeMo: compression_rate={compression_rate!r} and compression_topk={compression_topk!r} "
                         "are both set; accepted: one of them (a rate per block, or DeMo's fixed count per block).")
    _check(compression_rate is None or (isinstance(compression_rate, (int, float)) and 0 < compression_rate <= 1),
           "compression_rate", compression_rate, "a float in (0, 1], e.g. 0.125 (None: the default rate)")
    _check(compression_topk is None or (isinstance(compression_topk, int) and compression_topk >= 1),
           "compression_topk", compression_topk, "an integer >= 1 (None: use compression_rate)")
    _check(isinstance(compression_chunk, int) and compression_chunk >= 1, "compression_chunk",
           compression_chunk, "an integer >= 1")
    _check(0.0 <= compression_decay < 1.0, "compression_decay", compression_decay, "a float in [0, 1)")
    _check(0.0 < compression_feedback <= 1.0, "compression_feedback", compression_feedback, "a float in (0, 1]")
    _check(momentum in MOMENTUMS, "momentum", momentum, " | ".join(MOMENTUMS))
    _check(update in UPDATES, "update", update, " | ".join(UPDATES))
    _check(replicator in REPLICATORS, "replicator", replicator, " | ".join(REPLICATORS))
    _check(consensus in compression.CONSENSUSES, "consensus", consensus, " | ".join(compression.CONSENSUSES))
    _check(value_dtype == "auto" or value_dtype in VALUE_DTYPES, "value_dtype", value_dtype,
           " | ".join(("auto", *VALUE_DTYPES)))
    _check(value_dtype != "float8" or replicator != "random", "value_dtype", value_dtype,
           "'bfloat16' | 'float32' with replicator='random' (its all-reduce sums values; float8's per-block "
           "scales do not add up), or replicator='demo' for float8")
    _check(isinstance(replicator_seed, int) and replicator_seed >= 0, "replicator_seed", replicator_seed,
           "an integer >= 0")
    _check(on_nonfinite in guards.NONFINITE_ACTIONS, "on_nonfinite", on_nonfinite,
           " | ".join(guards.NONFINITE_ACTIONS))
    _check(isinstance(drift_check_every, int) and drift_check_every >= 0, "drift_check_every", drift_check_every,
           "an integer >= 0 (0 disables the check)")
    _check(on_drift in guards.DRIFT_ACTIONS, "on_drift", on_drift, " | ".join(guards.DRIFT_ACTIONS))
    _check(overlap in OVERLAPS, "overlap", overlap, " | ".join(OVERLAPS))
    _check(isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0, "bucket_cap_mb", bucket_cap_mb,
           "a number of MB > 0")
    _check(budget_bytes is None or (isinstance(budget_bytes, int) and budget_bytes > 0), "budget_bytes",
           budget_bytes, "None or an integer > 0 (inter-node bytes per step and rank)")
    _check(budget_fraction is None or (isinstance(budget_fraction, (int, float)) and 0 < budget_fraction < 1),
           "budget_fraction", budget_fraction, "None or a float in (0, 1) (of the step time)")
    _check(isinstance(budget_min_rate, (int, float)) and isinstance(budget_max_rate, (int, float))
           and 0 < budget_min_rate <= budget_max_rate <= 1, "budget_min_rate, budget_max_rate",
           (budget_min_rate, budget_max_rate), "0 < budget_min_rate <= budget_max_rate <= 1")
    if budget_bytes is not None or budget_fraction is not None:
        _check(budget_bytes is None or budget_fraction is None, "budget_bytes, budget_fraction",
               (budget_bytes, budget_fraction), "one of them (the other None)")
        _check(compression_topk is None, "compression_topk", compression_topk,
               "None with a budget (the budget chooses a rate)")
        _check(replicator in ("demo", "random"), "replicator", replicator,
               "'demo' | 'random' with a budget ('full' and 'none' do not compress)")


@dataclass
class _Stack:
    """Parameters of one exchange bucket and parameter group whose local shards share a block layout.

    Their momentum buffers are the rows of one stacked tensor (``delta``; each parameter's
    ``state["delta"]`` is a view of its row), so the stack is transformed in a few large kernels.
    ``momentum`` is the candidate momentum of the step in flight, committed only when that step is
    applied; ``spare`` is the buffer the next candidate is built in.
    """

    seed: int  # the stack's place in the plan: seeds replicator="random"'s positions
    group_index: int
    layout: BlockLayout
    group: dict[str, Any]
    params: list[Tensor] = field(default_factory=list)
    states: list[dict[str, Tensor]] = field(default_factory=list)
    delta: Tensor | None = None
    spare: Tensor | None = None
    momentum: Tensor | None = None
    moments: dict[str, list[Tensor]] | None = None  # momentum "avg"/"adam": the candidate gradient moments
    lr: float = 0.0  # the learning rate ``momentum`` was built with
    positions: Tensor | None = None  # flat positions of the kept coefficients in ``momentum``
    values: Tensor | None = None  # their ``(N, k)`` coefficients, before the wire's rounding
    wire: list[Tensor] = field(default_factory=list)  # what travels: positions ("demo") and encoded values

    def locals(self) -> list[Tensor]:
        return [_local(p) for p in self.params]

    def grads(self) -> list[Tensor]:
        return [torch.zeros_like(_local(p)) if p.grad is None else _local(p.grad) for p in self.params]

    def candidate(self) -> dict[str, list[Tensor]]:
        """The state the step in flight commits, per key: the new momentum's rows and any new moments."""
        return {"delta": list(self.momentum.unbind(0)), **(self.moments or {})}


@dataclass
class _Bucket:
    """Parameters whose exchange starts together: about ``bucket_cap_mb`` of local shards."""

    params: list[Tensor]
    stacks: list[_Stack]
    hooked: bool  # overlap="backward" and every parameter an FSDP2 shard, whose final gradient a hook announces
    ready: set[int] = field(default_factory=set)  # ids of the parameters whose gradient arrived this step
    launched: bool = False


@dataclass
class _Exchange:
    """One collective in flight and the stacks whose payload it carries (``like``: what it holds)."""

    stacks: list[_Stack]
    pending: Pending | None
    like: list[Tensor]


def _set_rows(states: list[dict[str, Tensor]], key: str, rows: Iterable[Tensor]) -> None:
    """Each parameter's ``state[key]`` becomes its row of ``rows``."""
    for state, row in zip(states, rows):
        state[key] = row


def _entry_scale(group: dict[str, Any], lr: float) -> float:
    """The factor a gradient enters the momentum with (``momentum="lr"``: ``lr``; ``"ema"``: ``1 - beta``; AdamW's
    moments: 1); the consensus ``Q`` divided by it is in gradient units."""
    return {"lr": lr, "ema": 1.0 - group["compression_decay"], "avg": 1.0, "adam": 1.0}[group["momentum"]]


def _rmsprop(
    params: list[Tensor], q: Tensor, avg_sq: Tensor, denominator: Tensor, *, step: float, lr: float, scale: float,
    beta2: float, eps: float,
) -> None:
    """AdamW without its first moment (the caller applies weight decay), fed ``g = scale * Q`` (``params``: the
    rows of the ``(P, *shape)`` ``Q``):

    ``v <- beta2 * v + (1 - beta2) * g^2``, ``p <- p - lr * g / (sqrt(v / (1 - beta2^step)) + eps)``.

    The scale and the bias correction are folded into the constants, so besides ``v`` and ``p`` only the
    ``denominator`` buffer is written: five passes over the shard, where torch's AdamW with ``beta1 = 0`` fed a
    scaled copy of ``Q`` makes eight and keeps ``m``, a shard-sized copy of ``g``.
    """
    avg_sq.mul_(beta2).addcmul_(q, q, value=(1.0 - beta2) * scale * scale)
    correction = (1.0 - beta2**step) ** 0.5
    torch.sqrt(avg_sq, out=denominator).add_(eps * correction)
    torch._foreach_addcdiv_(params, list(q.unbind(0)), list(denominator.unbind(0)), value=-lr * scale * correction)


def _stack_rows(states: list[dict[str, Tensor]], key: str) -> Tensor:
    """The stacked ``state[key]`` of a stack; re-stacks (once) when the rows are not views of one tensor."""
    rows = [s[key] for s in states]
    base = rows[0]._base
    if (
        base is not None
        and base.shape[0] == len(rows)
        and all(r.data_ptr() == row.data_ptr() for r, row in zip(rows, base))
    ):
        return base
    stacked = torch.stack(rows)
    _set_rows(states, key, stacked)
    return stacked


class FlexDeMo(Optimizer):
    """FlexDeMo optimizer (see module docstring); ``comm_stats`` describes the last step's traffic.

    Args:
        params: parameters or parameter groups (``DTensor`` shards or plain tensors).
        lr: learning rate.
        replicate_group: process group of the replicas to exchange with; ``None`` for a single node.
        shard_group: the ranks of this node (FSDP's group), over which the non-finite flag is OR-ed;
            default: the 1-D device mesh of the ``DTensor`` parameters, ``None`` for plain tensors.
        compression_rate: fraction of each DCT block's coefficients that travels (default ``DEFAULT_RATE`` when
            ``compression_topk`` is not set either); the kept count per block is ``round(rate * block size)``.
        compression_topk: DeMo's convention instead: a fixed count per block.
        compression_chunk: largest block side; each side is the largest divisor of the shard dimension
            not above it.
        compression_decay: momentum decay ``beta`` in ``[0, 1)``.
        compression_feedback: ``alpha`` in ``(0, 1]``: the fraction of the sent signal error feedback
            removes from the momentum (1: DeMo; DeMo's second version uses less).
        momentum: how a gradient enters the momentum: ``"lr"`` adds ``lr * g`` (DeMo), ``"ema"`` adds
            ``(1 - beta) * g`` (the update then carries ``lr``), ``"avg"`` / ``"adam"`` add AdamW's bias-corrected
            ``m`` / ``m / (sqrt(v) + eps)`` of this replica's gradient (``betas``, ``eps``; one / two more buffers).
            Defaults (``"adam"``, ``update="sgd"``, ``consensus="replicas"``): README "Choosing the defaults".
        update: ``"sign"`` (DeMo), ``"sgd"``, ``"adamw"`` or ``"rmsprop"`` (AdamW with ``beta1 = 0``).
        replicator: ``"demo"`` (DCT top-k, all-gather), ``"random"`` (shared random positions, all-reduce of
            the values), ``"full"`` (dense average) or ``"none"`` (no exchange).
        consensus: how ``replicator="demo"`` combines the replicas' coefficients: the mean over the replicas
            that chose each one (``"choosers"``, DeMo) or over all replicas (``"replicas"``: the mean momentum;
            the other replicators always average over all replicas).
        weight_decay: decoupled weight decay.
        value_dtype: wire type of the coefficients, ``"bfloat16"``, ``"float32"`` or ``"float8"`` (e4m3 with a
            bfloat16 scale per block; ``replicator="demo"`` only); ``"auto"``: float8 for ``"demo"``, else bfloat16.
        replicator_seed: seed of ``replicator="random"``'s positions (the same on every replica).
        betas, eps: AdamW constants, used with ``update="adamw"`` or ``"rmsprop"`` and ``momentum="avg"`` or
            ``"adam"``.
        overlap: ``"none"``, ``"backward"`` (start each bucket's exchange during backward; the same
            update, but gradients are read when FSDP2 finalises them, so clipping or scaling them between
            backward and ``step()`` does not reach the exchange) or ``"delayed"`` (apply the previous step's
            consensus; the exchange travels during the next forward and backward).
        bucket_cap_mb: size of an exchange bucket (local shard bytes in float32), as DDP's.
        budget_bytes: instead of a fixed rate, the largest rate whose payload fits this many inter-node
            bytes per step and rank.
        budget_fraction: instead of a fixed rate, a rate adjusted every step so the step waits on the
            exchange for at most this fraction of its time (measured, agreed by every rank).
        budget_min_rate, budget_max_rate: the bounds of a budget's rate.
        on_nonfinite: a NaN/Inf gradient on any rank: every rank skips the step, or raises.
        drift_check_every, on_drift: compare parameters across replicas every N steps (0: never); raise
            or copy replica 0's values on a mismatch.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        *,
        replicate_group: dist.ProcessGroup | None = None,
        shard_group: dist.ProcessGroup | None = None,
        compression_rate: float | None = None,
        compression_topk: int | None = None,
        compression_chunk: int = DEFAULT_CHUNK,
        compression_decay: float = 0.999,
        compression_feedback: float = 1.0,
        momentum: Momentum = "adam",
        update: Update = "sgd",
        replicator: Replicator = "demo",
        consensus: compression.Consensus = "replicas",
        weight_decay: float = 0.0,
        value_dtype: ValueDtype = "auto",
        replicator_seed: int = 0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        overlap: Overlap = "none",
        bucket_cap_mb: float = DEFAULT_BUCKET_MB,
        budget_bytes: int | None = None,
        budget_fraction: float | None = None,
        budget_min_rate: float = DEFAULT_MIN_RATE,
        budget_max_rate: float = DEFAULT_MAX_RATE,
        on_nonfinite: NonfiniteAction = "skip",
        drift_check_every: int = 100,
        on_drift: DriftAction = "raise",
    ) -> None:
        _check(lr >= 0, "lr", lr, "a float >= 0")
        budgeted = budget_bytes is not None or budget_fraction is not None
        value_dtype = compression.resolve_value_dtype(value_dtype, replicator)  # once: state_dict records it
        if compression_rate is None and compression_topk is None and not budgeted:
            compression_rate = DEFAULT_RATE
        knobs = dict(compression_rate=compression_rate, compression_topk=compression_topk,
                     compression_chunk=compression_chunk, compression_decay=compression_decay,
                     compression_feedback=compression_feedback, momentum=momentum, update=update,
                     replicator=replicator, consensus=consensus, value_dtype=value_dtype,
                     replicator_seed=replicator_seed, overlap=overlap, bucket_cap_mb=bucket_cap_mb,
                     budget_bytes=budget_bytes, budget_fraction=budget_fraction, budget_min_rate=budget_min_rate,
                     budget_max_rate=budget_max_rate, on_nonfinite=on_nonfinite,
                     drift_check_every=drift_check_every, on_drift=on_drift)
        validate_knobs(**knobs)
        _check(weight_decay >= 0, "weight_decay", weight_decay, "a float >= 0")
        _check(all(0.0 <= b < 1.0 for b in betas), "betas", betas, "two floats in [0, 1)")
        _check(eps > 0, "eps", eps, "a float > 0")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, **knobs))
        for group in self.param_groups:
            validate_knobs(**{k: group[k] for k in knobs})
            for key in GLOBAL_KNOBS:
                _check(group[key] == self.defaults[key], f"param group {key}", group[key],
                       f"{self.defaults[key]!r}, the optimizer's value (it holds for every parameter group)")
            for p in group["params"]:
                _check(p.dtype in PARAM_DTYPES, "parameter dtype", p.dtype,
                       "torch.float32 | torch.bfloat16 (fp16 needs a loss scaler that can skip a step on one "
                       "rank only and deadlock the others)")
        self.replicate = ReplicateGroup(replicate_group)
        _check(replicator != "none" or self.replicate.size == 1, "replicator", replicator,
               "'demo' | 'random' | 'full' when the replicate group has more than one rank ('none' lets "
               "replicas drift)")
        first = next(p for group in self.param_groups for p in group["params"])
        self._device = _local(first).device
        if shard_group is None and isinstance(first, DTensor) and first.device_mesh.ndim == 1:
            shard_group = first.device_mesh.get_group()
        self.shard_group = shard_group
        self.steps = 0  # optimizer steps taken or skipped: the drift schedule and the random positions' seed
        self.skipped_steps = 0
        self.comm_stats: dict[str, int] = CommStats().as_dict()
        # A budget's current rate (None: each group's compression_rate / compression_topk). A byte budget's
        # is solved from the shard shapes when the plan is built.
        self._rate: float | None = None
        if budget_fraction is not None:
            self._rate = min(max(compression_rate or DEFAULT_RATE, budget_min_rate), budget_max_rate)
        self._stats = CommStats()  # the step being built (backward hooks count into it too)
        self._plan: list[_Bucket] | None = None
        self._dense_bytes = 0  # a dense fp32 all-reduce of the trainable shards: set with the plan
        self._bucket_of: dict[int, _Bucket] = {}
        self._next_launch = 0  # buckets are launched in plan order, so every replica issues the same sequence
        self._in_flight: list[_Exchange] = []
        self._local_flags: list[Tensor] = []  # this rank's own non-finite flags of the step in flight
        self._pending: dict[str, Any] | None = None  # overlap="delayed": the resolved consensus awaiting its step
        self._timing = torch.full((1,), -1.0, device=self._device)  # the last step's waited fraction (budget)
        self._last_step_end: float | None = None
        self._buffers: dict[str, Tensor] = {}
        self._hooks: list[Any] = []
        self._install_hooks()

    # ---- state -------------------------------------------------------------------------------

    @property
    def rate(self) -> float | None:
        """The compression rate in use: a budget's current choice, else the first group's ``compression_rate``."""
        return self._rate if self._rate is not None else self.param_groups[0]["compression_rate"]

    def state_dict(self) -> dict[str, Any]:
        """Torch's ``state_dict`` plus the step counters and the budget's rate (the knobs are in ``param_groups``).

        With ``overlap="delayed"`` the exchange in flight is waited for and decoded first: the candidate
        momentum and the consensus still to apply are per-parameter state (``pending_delta``,
        ``pending_update``), so a resumed run applies exactly what the uninterrupted one would.
        """
        if self._in_flight:
            if self.param_groups[0]["overlap"] != "delayed":
                raise RuntimeError("FlexDeMo: state_dict() while this step's exchange is in flight (after backward, "
                                   "before step()); call it after optimizer.step().")
            self._hold()
        state = super().state_dict()
        state["flexdemo"] = {"steps": self.steps, "skipped_steps": self.skipped_steps, "rate": self._rate,
                             "pending": self._pending}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("consensus", "choosers")  # saved before the knob existed: DeMo's decode

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, keep the momentum in float32 (torch casts it to the parameter's dtype)."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            for key in FLOAT32_KEYS:
                if key in saved:
                    self.state[params[index]][key] = saved[key].to(device=self._device, dtype=torch.float32,
                                                                   copy=True)
        counters = state_dict.get("flexdemo", {})
        self.steps = counters.get("steps", 0)
        self.skipped_steps = counters.get("skipped_steps", 0)
        self._rate = counters.get("rate")
        self._pending = counters.get("pending")
        self._plan, self._bucket_of, self._in_flight = None, {}, []  # rebuilt on the loaded state
        self._install_hooks()  # the loaded knobs may change overlap

    def pop_exchange_seconds(self) -> float:
        """Seconds this rank waited for inter-node collectives since the last call (syncs on CUDA)."""
        return self.replicate.timer.pop()

    # ---- the plan: buckets and stacks ----------------------------------------------------------

    def _install_hooks(self) -> None:
        """With ``overlap="backward"``, a post-accumulate-grad hook on every FSDP2 shard: FSDP2 calls it once
        the node-averaged gradient shard is final (after the reduce-scatter of its last use)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.param_groups[0]["overlap"] != "backward":
            return
        method = weakref.WeakMethod(self._gradient_ready)  # hooks must not keep the optimizer alive

        def hook(param: Tensor) -> None:
            if (ready := method()) is not None:
                ready(param)

        for group in self.param_groups:
            self._hooks += [p.register_post_accumulate_grad_hook(hook) for p in group["params"]
                            if p.requires_grad and isinstance(p, DTensor)]

    def _buckets(self) -> list[_Bucket]:
        """The exchange plan, built once: parameters in reverse order (about the order backward finishes
        them) cut into buckets of ``bucket_cap_mb``, each bucket's shards stacked by (group, block layout)."""
        if self._plan is not None:
            return self._plan
        knobs = self.param_groups[0]
        cap = knobs["bucket_cap_mb"] * 2**20
        entries = [(g, p) for g, group in enumerate(self.param_groups) for p in group["params"] if p.requires_grad]
        members: list[list[tuple[int, Tensor]]] = [[]]
        size = 0
        for g, p in reversed(entries):
            if size >= cap:
                members.append([])
                size = 0
            members[-1].append((g, p))
            size += _local(p).numel() * 4
        self._plan, seed = [], 0
        for bucket_members in members:
            stacks: dict[tuple[int, BlockLayout], _Stack] = {}
            for g, p in bucket_members:
                group, state = self.param_groups[g], self._state_for(p, self.param_groups[g])
                local = _local(p)
                if not local.numel():
                    continue  # an empty shard: its replicas are empty too, nothing to send or update
                layout = BlockLayout.for_shape(tuple(local.shape), group["compression_chunk"])
                if (g, layout) not in stacks:
                    stacks[g, layout] = _Stack(seed, g, layout, group)
                    seed += 1
                stacks[g, layout].params.append(p)
                stacks[g, layout].states.append(state)
            for stack in stacks.values():
                stack.delta = _stack_rows(stack.states, "delta")
            hooked = knobs["overlap"] == "backward" and all(isinstance(p, DTensor) for _, p in bucket_members)
            bucket = _Bucket([p for _, p in bucket_members], list(stacks.values()), hooked)
            self._plan.append(bucket)
            self._bucket_of.update({id(p): bucket for _, p in bucket_members})
        self._dense_bytes = dense_allreduce_bytes(sum(s.delta.numel() for b in self._plan for s in b.stacks),
                                                  self.replicate.size)  # AdamW-HSDP's, for the traffic ratio
        if knobs["budget_bytes"] is not None:
            self._rate = budget.rate_for_bytes(self._bytes_at, knobs["budget_bytes"], knobs["budget_min_rate"],
                                               knobs["budget_max_rate"])
        return self._plan

    def _state_for(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        """``p``'s state, created on first use."""
        state = self.state[p]
        if not state:
            param = _local(p)
            state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU, as torch's AdamW keeps it
            state["delta"] = torch.zeros_like(param, dtype=torch.float32)
            if group["update"] == "adamw":
                state["exp_avg"] = torch.zeros_like(param)
            if group["update"] in ("adamw", "rmsprop"):
                state["exp_avg_sq"] = torch.zeros_like(param)
            if group["momentum"] in ("avg", "adam"):  # this replica's AdamW moments of its node-averaged gradient
                state["grad_avg"] = torch.zeros_like(param, dtype=torch.float32)
                if group["momentum"] == "adam":
                    state["grad_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
        return state

    def _bytes_at(self, rate: float) -> int:
        """Inter-node bytes this rank sends per step at ``rate`` (the byte budget's equation)."""
        knobs = self.param_groups[0]
        return sum(
            exchange_bytes(knobs["replicator"], [tuple(_local(p).shape) for p in group["params"] if p.requires_grad],
                           self.replicate.size, rate=rate, topk=None, chunk=group["compression_chunk"],
                           value_dtype=knobs["value_dtype"])
            for group in self.param_groups
        )

    def _kept(self, stack: _Stack) -> int:
        group = stack.group
        if self._rate is not None:
            return compression.kept_per_block(stack.layout.block_numel, self._rate, None)
        return compression.kept_per_block(stack.layout.block_numel, group["compression_rate"],
                                          group["compression_topk"])

    # ---- step --------------------------------------------------------------------------------

    @torch.no_grad()
    def _gradient_ready(self, param: Tensor) -> None:
        """FSDP2's hook for ``param``: start the exchange of every complete bucket, in plan order."""
        plan = self._buckets()
        bucket = self._bucket_of[id(param)]
        if bucket.launched or id(param) in bucket.ready:
            names = [n for n, p in self._named_params() if p is param]
            raise RuntimeError(
                f"FlexDeMo(overlap='backward'): the gradient of {names[0] if names else 'a parameter'} arrived twice "
                "before step(). With gradient accumulation, reduce gradients on the last micro-batch only "
                "(Accelerate's accumulate/no_sync, or model.set_requires_gradient_sync(False) before the others), "
                "or use overlap='none'.")
        bucket.ready.add(id(param))
        while self._next_launch < len(plan):
            candidate = plan[self._next_launch]
            if not (candidate.hooked and len(candidate.ready) == len(candidate.params)):
                break
            self._launch([candidate])

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        knobs = self.param_groups[0]
        if knobs["drift_check_every"] and self.steps % knobs["drift_check_every"] == 0:
            self._check_drift()
        plan = self._buckets()
        if knobs["overlap"] == "delayed":
            if self._in_flight:
                self._hold()
            if self._pending is not None:
                self._apply_pending(knobs)
            self._launch(plan)  # travels during the next forward and backward
        else:
            if self._next_launch < len(plan):
                self._launch(plan[self._next_launch:])  # what backward has not started (everything, for "none")
            self._resolve_and_apply(knobs)
        self._end_step(plan)
        return loss

    def _launch(self, buckets: list[_Bucket]) -> None:
        """Compress ``buckets`` (consecutive in the plan) and start their exchange, in one collective."""
        knobs = self.param_groups[0]
        for bucket in buckets:
            bucket.launched = True
        self._next_launch += len(buckets)
        stacks = [s for b in buckets for s in b.stacks]
        with record_function("FlexDeMo::compress"):
            flag = self._compress(stacks, knobs)
        with record_function("FlexDeMo::exchange"):
            self._in_flight.append(self._start(stacks, flag, knobs))
        self._local_flags.append(flag)

    def _resolve_and_apply(self, knobs: dict[str, Any]) -> None:
        """Wait for this step's exchanges, decide, then decode and apply stack by stack."""
        stacks, received, flag, timing = self._finish()
        skip, here = self._decide(flag, timing, knobs)
        if skip:
            self._skip(knobs["on_nonfinite"], self.steps, here)
            self._discard(stacks)
            return
        for stack, payload in zip(stacks, received):
            with record_function("FlexDeMo::decode"):
                q = self._decode(stack, payload, knobs)
            with record_function("FlexDeMo::apply"):
                self._commit(stack, spent=knobs["replicator"] == "full")
                self._apply(stack, q, stack.lr)

    def _hold(self) -> None:
        """``overlap="delayed"``: wait for the exchange in flight, decide, and keep the decoded consensus and
        the candidate momentum as per-parameter state until the step that applies them."""
        knobs = self.param_groups[0]
        stacks, received, flag, timing = self._finish()
        skip, here = self._decide(flag, timing, knobs)
        for stack, payload in zip(stacks, received):
            if not skip:
                with record_function("FlexDeMo::decode"):
                    q = self._decode(stack, payload, knobs).clone()
                _set_rows(stack.states, "pending_update", q.unbind(0))
            for key, rows in stack.candidate().items():
                _set_rows(stack.states, f"pending_{key}", rows)
        self._pending = {"skip": skip, "here": here, "lrs": [stack.lr for stack in stacks],
                         "step": self.steps - 1}

    def _apply_pending(self, knobs: dict[str, Any]) -> None:
        """``overlap="delayed"``: commit and apply the held consensus of the previous step (or skip it)."""
        pending, self._pending = self._pending, None
        stacks = [s for b in self._buckets() for s in b.stacks]
        for stack, lr in zip(stacks, pending["lrs"]):
            stack.momentum, stack.lr = _stack_rows(stack.states, "pending_delta"), lr
            held = [key for key in MOMENT_KEYS if "pending_" + key in stack.states[0]]
            stack.moments = {key: [s["pending_" + key] for s in stack.states] for key in held} or None
        if pending["skip"]:
            self._skip(knobs["on_nonfinite"], pending["step"], pending["here"])
            self._discard(stacks)
        else:
            for stack in stacks:
                with record_function("FlexDeMo::apply"):
                    self._commit(stack, spent=knobs["replicator"] == "full")
                    self._apply(stack, _stack_rows(stack.states, "pending_update"), stack.lr)
        for state in (state for stack in stacks for state in stack.states):
            for key in PENDING_KEYS:
                state.pop(key, None)

    def _end_step(self, plan: list[_Bucket]) -> None:
        self.steps += 1
        self._stats.dense_bytes = self._dense_bytes
        self.comm_stats, self._stats = self._stats.as_dict(), CommStats()
        for bucket in plan:
            bucket.launched = False
            bucket.ready.clear()
        self._next_launch = 0
        if self.param_groups[0]["budget_fraction"] is not None:  # this step's waited fraction rides in the next payload
            now = time.perf_counter()
            waited = self.replicate.timer.settle()
            if self._last_step_end is not None:
                self._timing.fill_(waited / max(now - self._last_step_end, 1e-9))
            self._last_step_end = now

    def _skip(self, action: str, step: int, here: bool) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        message = (f"FlexDeMo: non-finite gradient at step {step} (on rank {rank}: "
                   f"{'non-finite' if here else 'finite'})")
        if action == "raise":
            raise FloatingPointError(message + " (on_nonfinite='raise').")
        warnings.warn(message + "; every rank skips this step (on_nonfinite='skip').", stacklevel=4)
        self.skipped_steps += 1

    def _compress(self, stacks: list[_Stack], knobs: dict[str, Any]) -> Tensor:
        """The new momentum and payload of every stack; returns this rank's non-finite flag.

        Non-finite values are zeroed before they are encoded (the flag tells every rank to skip).
        """
        for stack in stacks:
            stack.momentum, stack.lr = self._momentum(stack), stack.group["lr"]
            if knobs["replicator"] != "full":
                self._select(stack, knobs)
        payload = [s.momentum if knobs["replicator"] == "full" else s.values for s in stacks]
        flag = guards.nonfinite(payload, self._device)
        for values in payload:
            torch.nan_to_num_(values, nan=0.0, posinf=0.0, neginf=0.0)
        if knobs["replicator"] != "full":
            for stack in stacks:
                self._feedback(stack, knobs)
        return flag

    def _momentum(self, stack: _Stack) -> Tensor:
        """``beta * delta + scale * x`` in the spare buffer (``x``: the gradient, or AdamW's ``m`` or direction):
        the old momentum survives a skipped step."""
        group = stack.group
        spare, stack.spare = stack.spare, None
        if spare is None or spare.shape != stack.delta.shape:
            spare = torch.empty_like(stack.delta)
        torch.mul(stack.delta, group["compression_decay"], out=spare)
        entering = self._adam_direction(stack) if group["momentum"] in ("avg", "adam") else stack.grads()
        torch._foreach_add_(list(spare.unbind(0)), entering, alpha=_entry_scale(group, group["lr"]))
        return spare

    def _adam_direction(self, stack: _Stack) -> list[Tensor]:
        """AdamW's bias-corrected ``m`` (``momentum="avg"``) or ``m / (sqrt(v) + eps)`` (``"adam"``) of this
        replica's gradient. The new moments are candidates (``stack.moments``), committed with the momentum."""
        group, grads = stack.group, [g.float() for g in stack.grads()]
        (beta1, beta2), eps = group["betas"], group["eps"]
        step = float(stack.states[0]["step"]) + 1.0  # the applied steps so far, on the host
        avg = torch._foreach_lerp([s["grad_avg"] for s in stack.states], grads, 1.0 - beta1)
        stack.moments = {"grad_avg": avg}
        if group["momentum"] == "avg":
            return torch._foreach_div(avg, 1.0 - beta1**step)
        avg_sq = stack.moments["grad_avg_sq"] = torch._foreach_mul([s["grad_avg_sq"] for s in stack.states], beta2)
        torch._foreach_addcmul_(avg_sq, grads, grads, value=1.0 - beta2)
        denominator = torch._foreach_sqrt(avg_sq)
        torch._foreach_div_(denominator, (1.0 - beta2**step) ** 0.5)
        torch._foreach_add_(denominator, eps)
        direction = torch._foreach_div(avg, denominator)
        torch._foreach_div_(direction, 1.0 - beta1**step)
        return direction

    def _select(self, stack: _Stack, knobs: dict[str, Any]) -> None:
        """DCT of the stack's new momentum and the kept coefficients: their positions and values."""
        layout, momentum = stack.layout, stack.momentum
        # Coefficients travel rounded to the wire's type, so the transform runs in it too (bf16 GEMMs are ~3x
        # faster); error feedback still subtracts exactly the values as they arrive, synthesised in float32.
        dtype = compression.transform_dtype(knobs["value_dtype"])
        source = momentum if dtype == momentum.dtype else self._workspace("source", momentum, dtype)
        if source is not momentum:
            source.copy_(momentum)
        coefficients = layout.dct(source, out=self._workspace("coefficients", momentum, dtype),
                                  scratch=self._workspace("scratch", momentum, dtype))
        k = self._kept(stack)
        if knobs["replicator"] == "random":
            generator = torch.Generator(device=self._device)
            generator.manual_seed(knobs["replicator_seed"] * 2**40 + self.steps * 2**16 + stack.seed)
            indices = compression.select_random(layout, momentum.shape[0], k, generator)
            stack.wire = []  # every replica draws the positions: only values travel
        else:
            indices = compression.select_topk(coefficients, layout, k, self._workspace("scratch", momentum, dtype))
            wire, indices = compression.encode_positions(indices, layout.block_numel)  # the values' wire order
            stack.wire = [wire]
        stack.positions, stack.values = compression.gather(coefficients, layout, indices)

    def _feedback(self, stack: _Stack, knobs: dict[str, Any]) -> None:
        """Encode the stack's values for the wire; error feedback subtracts them as every replica decodes them."""
        layout, momentum = stack.layout, stack.momentum
        pieces = compression.encode_values(stack.values, knobs["value_dtype"])
        stack.wire += pieces
        sent = compression.scatter_mean(stack.positions.unsqueeze(0), compression.decode_values(pieces).view(1, -1),
                                        out=self._workspace("dense", momentum), counts=None)
        estimate = layout.idct(sent, out=self._workspace("signal", momentum),
                               scratch=self._workspace("dense_scratch", momentum))
        momentum.sub_(estimate, alpha=stack.group["compression_feedback"])

    def _start(self, stacks: list[_Stack], flag: Tensor, knobs: dict[str, Any]) -> _Exchange:
        """Start the collective carrying ``stacks``' payload, with the flag (and a budget's timing) behind it."""
        replicator = knobs["replicator"]
        trailer = [flag.reshape(1)] + ([self._timing] if knobs["budget_fraction"] is not None else [])
        if replicator == "demo":
            like = [t for s in stacks for t in s.wire] + trailer
            self._stats.coefficients += sum(s.values.numel() for s in stacks)
            return _Exchange(stacks, self.replicate.all_gather(pack(like), self._stats), like)
        if replicator in ("random", "full"):
            payload = [(s.wire[0] if replicator == "random" else s.momentum).reshape(-1) for s in stacks]
            dtype = VALUE_DTYPES[knobs["value_dtype"]] if replicator == "random" else torch.float32
            like = payload + [t.to(dtype) for t in trailer]
            self._stats.coefficients += sum(t.numel() for t in payload) if replicator == "random" else 0
            return _Exchange(stacks, self.replicate.all_reduce(torch.cat(like), self._stats), like)
        return _Exchange(stacks, None, trailer)  # "none": a single node

    def _finish(self) -> tuple[list[_Stack], list[Any], Tensor, Tensor | None]:
        """Wait for every exchange in flight: the stacks, their received payloads, the flag OR-ed over the
        replicate group and, with a time budget, the replicas' mean waited fraction."""
        replicator, replicas = self.param_groups[0]["replicator"], self.replicate.size
        stacks, received, flags, timings = [], [], [], []
        for exchange in self._in_flight:
            count = len(exchange.stacks)
            stacks += exchange.stacks
            if exchange.pending is None:
                parts = [p.reshape(1, -1) for p in exchange.like]
                received += [None] * count
            elif replicator == "demo":
                parts = unpack(exchange.pending.wait(), exchange.like)
                for stack in exchange.stacks:
                    received.append(parts[: len(stack.wire)])
                    parts = parts[len(stack.wire):]
            else:
                parts = list(exchange.pending.wait().split([t.numel() for t in exchange.like]))
                received += parts[:count]
                parts = [(p / replicas).reshape(1, -1) for p in parts[count:]]
            flags.append((parts[0] > 0).any())
            timings.append(parts[1].float().mean() if len(parts) > 1 else None)
        self._in_flight = []
        return stacks, received, torch.stack(flags).any(), timings[0]

    def _decide(self, flag: Tensor, timing: Tensor | None, knobs: dict[str, Any]) -> tuple[bool, bool]:
        """The step's one host sync: skip or not, the same on every rank (and a time budget's next rate);
        with it, on the skip path only, whether this rank's own gradient was the non-finite one."""
        signal = flag.to(torch.float32).reshape(1)
        if timing is not None:
            signal = torch.cat([signal, timing.reshape(1)])
        with record_function("FlexDeMo::exchange"):
            signal = guards.max_in_group(signal, self.shard_group, self._stats)
        if timing is None:
            skip = signal.item() > 0
        else:
            skip, measured = signal.tolist()
            self._rate = budget.next_rate(self._rate, measured, knobs["budget_fraction"], knobs["budget_min_rate"],
                                          knobs["budget_max_rate"])
        here = bool(torch.stack(self._local_flags).any()) if skip else False  # a second sync on the skip path only
        self._local_flags = []
        return bool(skip), here

    def _decode(self, stack: _Stack, received: Any, knobs: dict[str, Any]) -> Tensor:
        """``Q`` of the stack, ``(P, *shape)`` in float32, the same on every replica."""
        momentum, layout = stack.momentum, stack.layout
        replicator, replicas, over = knobs["replicator"], self.replicate.size, knobs["consensus"]
        if replicator == "full":
            return received.view_as(momentum).div_(replicas)
        dense = self._workspace("dense", momentum)
        if replicator == "random":
            dense = compression.scatter_mean(stack.positions.unsqueeze(0),
                                             received.float().div_(replicas).unsqueeze(0), out=dense, counts=None)
        else:
            where, *pieces = [t.unsqueeze(0) for t in stack.wire] if replicator == "none" else received
            rows, k = pieces[0].shape[0], pieces[0].shape[-1]  # (R, N, k) values
            counts = self._workspace("counts", momentum) if over == "choosers" and rows > 1 else None
            if compression.uses_bitmask(layout.block_numel, k):
                dense = compression.scatter_masked(where, pieces, layout, out=dense,
                                                   scratch=self._workspace("replica", momentum), counts=counts,
                                                   over=over)
            else:
                positions = torch.stack([layout.flat_positions(momentum.shape[0], i.long()).view(-1) for i in where])
                dense = compression.scatter_mean(positions, compression.decode_values(pieces).flatten(1), out=dense,
                                                 counts=counts, over=over)
        return layout.idct(dense, out=self._workspace("signal", momentum),
                           scratch=self._workspace("dense_scratch", momentum))

    def _commit(self, stack: _Stack, spent: bool) -> None:
        """Make the candidate momentum the state; the old buffer becomes the next candidate's."""
        if spent:
            stack.momentum.zero_()
        for key, rows in stack.candidate().items():
            _set_rows(stack.states, key, rows)
        stack.spare, stack.delta, stack.momentum, stack.moments = stack.delta, stack.momentum, None, None

    @staticmethod
    def _discard(stacks: list[_Stack]) -> None:
        """A skipped step: the candidate momentum is dropped (its buffer is reused)."""
        for stack in stacks:
            stack.spare, stack.momentum, stack.moments = stack.momentum, None, None

    def _apply(self, stack: _Stack, q: Tensor, lr: float) -> None:
        """Update the stack's parameters from its ``(P, *shape)`` signal ``Q`` (built with learning rate ``lr``)."""
        group, params = stack.group, stack.locals()
        weight_decay = group["weight_decay"]
        # AdamW's eps and SGD's step are in gradient units: Q divided by the scale it entered the momentum with.
        scale = _entry_scale(group, lr)
        to_gradient = 1.0 / scale if scale > 0 else 0.0
        rows = list(q.unbind(0))
        if group["update"] == "adamw":
            grads = [(row * to_gradient).to(p.dtype) for row, p in zip(rows, params)]
            adamw(
                params, grads,
                [s["exp_avg"] for s in stack.states], [s["exp_avg_sq"] for s in stack.states], [],
                [s["step"] for s in stack.states],
                amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1], lr=lr,
                weight_decay=weight_decay, eps=group["eps"], maximize=False,
            )
            return
        torch._foreach_add_([s["step"] for s in stack.states], 1.0)
        if weight_decay:
            torch._foreach_mul_(params, 1.0 - lr * weight_decay)
        if group["update"] == "rmsprop":
            avg_sq = _stack_rows(stack.states, "exp_avg_sq")
            _rmsprop(params, q, avg_sq, self._workspace("denominator", avg_sq), step=float(stack.states[0]["step"]),
                     lr=lr, scale=to_gradient, beta2=group["betas"][1], eps=group["eps"])
        elif group["update"] == "sign":
            q.sign_()
            torch._foreach_add_(params, rows, alpha=-lr)
        else:
            torch._foreach_add_(params, rows, alpha=-lr * to_gradient)

    def _workspace(self, name: str, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """A reusable contiguous buffer shaped like ``like``: on CPU, fresh multi-MB allocations fault
        their pages in again on every step, which costs as much as the transform itself."""
        dtype = dtype or like.dtype
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < like.numel() or buffer.device != like.device or buffer.dtype != dtype:
            buffer = self._buffers[name] = like.new_empty(like.numel(), dtype=dtype)
        return buffer[: like.numel()].view(like.shape)

    # ---- drift -------------------------------------------------------------------------------

    def _check_drift(self) -> None:
        """Compare parameter fingerprints across replicas; raise or re-synchronise on a mismatch."""
        if self.replicate.size == 1:
            return
        named = [(name, _local(p)) for name, p in self._named_params()]
        bad = guards.drifted([p for _, p in named], self.replicate.group, self.replicate.size, self._device)
        names = guards.agree([named[i][0] for i in bad])  # other replicate groups must stop too
        if not names:
            return
        if self.param_groups[0]["on_drift"] == "raise":
            raise RuntimeError(f"FlexDeMo: replicas differ in {names} (on_drift='raise'). Replicas must start "
                               "identical (same seed or checkpoint) and apply identical updates.")
        warnings.warn(f"FlexDeMo: replicas differ in {names}; copying replica 0's values (on_drift='resync').",
                      stacklevel=3)
        guards.resync([named[i][1] for i in bad], self.replicate.group)

    def _named_params(self) -> list[tuple[str, Tensor]]:
        """Trainable parameters with their names (``param_names`` of a group if given, else positions)."""
        named = []
        for g, group in enumerate(self.param_groups):
            names = group.get("param_names") or [f"param_groups[{g}][{i}]" for i in range(len(group["params"]))]
            named += [(n, p) for n, p in zip(names, group["params"]) if p.requires_grad]
        return named
