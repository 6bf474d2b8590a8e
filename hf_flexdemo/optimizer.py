"""FlexDeMo: decoupled-momentum optimisation across nodes, on top of FSDP2 shards.

Per step and per parameter shard (``g`` already averaged over the node by FSDP):

1. momentum ``delta <- beta * delta + lr * g`` (``momentum="lr"``, DeMo) or ``+ (1 - beta) * g`` (``"ema"``)
2. DCT of ``delta`` in blocks; per block, a fraction ``compression_rate`` of the coefficients is kept: the
   largest (``replicator="demo"``) or positions every replica draws from the same seed (``"random"``)
3. error feedback ``delta <- delta - alpha * IDCT(kept)`` (``alpha = compression_feedback``)
4. one collective over the replicate group for every shard's payload: an all-gather of positions and
   values (``"demo"``) or an all-reduce of the values alone (``"random"``)
5. ``Q`` = mean-over-choosers decode of all replicas' payloads (bit-identical on every replica)
6. decoupled weight decay and the update: ``p <- p - lr * sign(Q)`` (``"sign"``), SGD on ``Q``
   (``"sgd"``), AdamW fed with ``Q`` as its gradient (``"adamw"``), or AdamW without its first moment
   (``"rmsprop"``: ``Q`` is already averaged by error feedback; the second moment gives every coordinate
   its own step size, which a sign update lacks)

``replicator="full"`` replaces 2-5 by a dense average of ``delta`` (which is then spent entirely);
``"none"`` keeps everything local (a single node). Parameters may be FSDP2 ``DTensor`` shards or
plain tensors; all arithmetic runs on local shards, state is created lazily in :meth:`step`.

What a GPU cluster needs from ``step()``: one collective crosses nodes (the payload; the non-finite
flag rides in it), one tiny all-reduce stays inside the node (the flag, made job-wide), and the host
waits for the device once (the skip decision). Every tensor lives on the parameters' device, and
``torch.profiler`` shows the phases as ``FlexDeMo::compress``, ``::exchange``, ``::decode``, ``::apply``.
"""

from __future__ import annotations

import warnings
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

from . import compression, guards
from .dct import BlockLayout
from .guards import DriftAction, NonfiniteAction
from .replicate import CommStats, ReplicateGroup, dense_allreduce_bytes, pack, unpack

Update = Literal["sign", "sgd", "adamw", "rmsprop"]
Replicator = Literal["demo", "random", "full", "none"]
ValueDtype = Literal["bfloat16", "float32"]
Momentum = Literal["lr", "ema"]
UPDATES: tuple[str, ...] = get_args(Update)
REPLICATORS: tuple[str, ...] = get_args(Replicator)
MOMENTUMS: tuple[str, ...] = get_args(Momentum)
VALUE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PARAM_DTYPES = (torch.float32, torch.bfloat16)
# The measured operating point (README "Choosing the defaults"; benchmarks/results/density_sweep_quick.json).
DEFAULT_RATE = 1 / 8
DEFAULT_CHUNK = 8
# Knobs that hold for the whole optimizer (one exchange per step), not per parameter group.
GLOBAL_KNOBS = ("replicator", "value_dtype", "replicator_seed", "on_nonfinite", "drift_check_every",
                "on_drift")


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _check(ok: bool, name: str, value: Any, accepted: str) -> None:
    if not ok:
        raise ValueError(f"FlexDeMo: invalid {name}={value!r}; accepted: {accepted}.")


def validate_knobs(
    *, compression_rate: float | None = None, compression_topk: int | None = None, compression_chunk: int = 1,
    compression_decay: float = 0.0, compression_feedback: float = 1.0, momentum: str = "lr",
    update: str = "sign", replicator: str = "demo", value_dtype: str = "bfloat16", replicator_seed: int = 0,
    on_nonfinite: str = "skip", drift_check_every: int = 0, on_drift: str = "raise",
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
    _check(value_dtype in VALUE_DTYPES, "value_dtype", value_dtype, " | ".join(VALUE_DTYPES))
    _check(isinstance(replicator_seed, int) and replicator_seed >= 0, "replicator_seed", replicator_seed,
           "an integer >= 0")
    _check(on_nonfinite in guards.NONFINITE_ACTIONS, "on_nonfinite", on_nonfinite,
           " | ".join(guards.NONFINITE_ACTIONS))
    _check(isinstance(drift_check_every, int) and drift_check_every >= 0, "drift_check_every", drift_check_every,
           "an integer >= 0 (0 disables the check)")
    _check(on_drift in guards.DRIFT_ACTIONS, "on_drift", on_drift, " | ".join(guards.DRIFT_ACTIONS))


@dataclass
class _Bucket:
    """Parameters of one group whose local shards share a block layout.

    Their momentum buffers are the rows of one stacked tensor (``delta``; each parameter's
    ``state["delta"]`` is a view of its row), so the bucket is transformed in a few large kernels.
    ``momentum`` is this step's candidate momentum, committed only when the step is not skipped.
    """

    key: tuple[int, BlockLayout]
    layout: BlockLayout
    group: dict[str, Any]
    params: list[Tensor] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    states: list[dict[str, Tensor]] = field(default_factory=list)
    delta: Tensor | None = None
    momentum: Tensor | None = None
    positions: Tensor | None = None  # flat positions of the kept coefficients in ``momentum``
    indices: Tensor | None = None  # their in-block positions as they travel ("demo")
    values: Tensor | None = None  # their values as they travel

    @property
    def kept(self) -> int:
        group = self.group
        return compression.kept_per_block(self.layout.block_numel, group["compression_rate"], group["compression_topk"])


def _stack_rows(states: list[dict[str, Tensor]]) -> Tensor:
    """The stacked momentum of a bucket; re-stacks (once) when the rows are not views of one tensor."""
    deltas = [s["delta"] for s in states]
    base = deltas[0]._base
    if (
        base is not None
        and base.shape[0] == len(deltas)
        and all(d.data_ptr() == row.data_ptr() for d, row in zip(deltas, base))
    ):
        return base
    stacked = torch.stack(deltas)
    for state, row in zip(states, stacked):
        state["delta"] = row
    return stacked


class FlexDeMo(Optimizer):
    """FlexDeMo optimizer (see module docstring); ``comm_stats`` describes the last step's traffic.

    Args:
        params: parameters or parameter groups (``DTensor`` shards or plain tensors).
        lr: learning rate.
        replicate_group: process group of the replicas to exchange with; ``None`` for a single node.
        shard_group: the ranks of this node (FSDP's group), over which the non-finite flag is OR-ed;
            default: the 1-D device mesh of the ``DTensor`` parameters, ``None`` for plain tensors.
        compression_rate: fraction of each DCT block's coefficients that travels (default 1/8 when
            ``compression_topk`` is not set either); the kept count per block is ``round(rate * block size)``.
        compression_topk: DeMo's convention instead: a fixed count per block.
        compression_chunk: largest block side; each side is the largest divisor of the shard dimension
            not above it.
        compression_decay: momentum decay ``beta`` in ``[0, 1)``.
        compression_feedback: ``alpha`` in ``(0, 1]``: the fraction of the sent signal error feedback
            removes from the momentum (1: DeMo; DeMo's second version uses less).
        momentum: how a gradient enters the momentum: ``"lr"`` adds ``lr * g`` (DeMo), ``"ema"`` adds
            ``(1 - beta) * g`` (the update then carries ``lr``).
        update: ``"sign"`` (DeMo), ``"sgd"``, ``"adamw"`` or ``"rmsprop"`` (AdamW with ``beta1 = 0``).
        replicator: ``"demo"`` (DCT top-k, all-gather), ``"random"`` (shared random positions, all-reduce of
            the values), ``"full"`` (dense average) or ``"none"`` (no exchange).
        weight_decay: decoupled weight decay.
        value_dtype: wire type of the coefficients, ``"bfloat16"`` or ``"float32"``.
        replicator_seed: seed of ``replicator="random"``'s positions (the same on every replica).
        betas, eps: AdamW constants, used with ``update="adamw"``.
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
        momentum: Momentum = "lr",
        update: Update = "rmsprop",
        replicator: Replicator = "demo",
        weight_decay: float = 0.0,
        value_dtype: ValueDtype = "bfloat16",
        replicator_seed: int = 0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        on_nonfinite: NonfiniteAction = "skip",
        drift_check_every: int = 100,
        on_drift: DriftAction = "raise",
    ) -> None:
        _check(lr >= 0, "lr", lr, "a float >= 0")
        if compression_rate is None and compression_topk is None:
            compression_rate = DEFAULT_RATE
        knobs = dict(compression_rate=compression_rate, compression_topk=compression_topk,
                     compression_chunk=compression_chunk, compression_decay=compression_decay,
                     compression_feedback=compression_feedback, momentum=momentum, update=update,
                     replicator=replicator, value_dtype=value_dtype, replicator_seed=replicator_seed,
                     on_nonfinite=on_nonfinite, drift_check_every=drift_check_every, on_drift=on_drift)
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
        self._buffers: dict[str, Tensor] = {}
        self._spares: dict[tuple[int, BlockLayout], Tensor] = {}

    # ---- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Torch's ``state_dict`` plus the step counters (the knobs are in ``param_groups``)."""
        state = super().state_dict()
        state["flexdemo"] = {"steps": self.steps, "skipped_steps": self.skipped_steps}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, keep the momentum in float32 (torch casts it to the parameter's dtype)."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            self.state[params[index]]["delta"] = saved["delta"].to(device=self._device, dtype=torch.float32,
                                                                    copy=True)
        counters = state_dict.get("flexdemo", {})
        self.steps = counters.get("steps", 0)
        self.skipped_steps = counters.get("skipped_steps", 0)

    def pop_exchange_seconds(self) -> float:
        """Seconds this rank spent in inter-node collectives since the last call (syncs on CUDA)."""
        return self.replicate.timer.pop()

    # ---- step --------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        knobs = self.param_groups[0]
        if knobs["drift_check_every"] and self.steps % knobs["drift_check_every"] == 0:
            self._check_drift()
        stats = CommStats()
        buckets = self._buckets()
        with record_function("FlexDeMo::compress"):
            local = self._compress(buckets, knobs)
        with record_function("FlexDeMo::exchange"):
            received, flag = self._exchange(buckets, local, knobs, stats)
            flag = guards.any_in_group(flag, self.shard_group, stats)
        self.steps += 1
        stats.dense_bytes = dense_allreduce_bytes(sum(b.delta.numel() for b in buckets), self.replicate.size)
        self.comm_stats = stats.as_dict()
        if flag.item():  # the step's one host sync: every rank reaches the same decision
            self._skip(knobs["on_nonfinite"], bool(local))
            return loss
        for index, bucket in enumerate(buckets):
            with record_function("FlexDeMo::decode"):
                q = self._decode(bucket, received[index], knobs)
            with record_function("FlexDeMo::apply"):
                self._commit(bucket, spent=knobs["replicator"] == "full")
                self._apply(bucket, q)
        return loss

    def _skip(self, action: str, here: bool) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        message = (f"FlexDeMo: non-finite gradient at step {self.steps - 1} (on rank {rank}: "
                   f"{'non-finite' if here else 'finite'})")
        if action == "raise":
            raise FloatingPointError(message + " (on_nonfinite='raise').")
        warnings.warn(message + "; every rank skips this step (on_nonfinite='skip').", stacklevel=3)
        self.skipped_steps += 1

    def _buckets(self) -> list[_Bucket]:
        """Group the non-empty local shards by (param group, block layout); create state lazily."""
        buckets: dict[tuple[int, BlockLayout], _Bucket] = {}
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                param = _local(p)
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU, as torch's AdamW keeps it
                    state["delta"] = torch.zeros_like(param, dtype=torch.float32)
                    if group["update"] in ("adamw", "rmsprop"):
                        state["exp_avg"] = torch.zeros_like(param)
                        state["exp_avg_sq"] = torch.zeros_like(param)
                if not param.numel():
                    continue  # an empty shard: its replicas are empty too, nothing to send or update
                layout = BlockLayout.for_shape(tuple(param.shape), group["compression_chunk"])
                key = (index, layout)
                bucket = buckets.setdefault(key, _Bucket(key, layout, group))
                bucket.params.append(param)
                bucket.grads.append(torch.zeros_like(param) if p.grad is None else _local(p.grad))
                bucket.states.append(state)
        for bucket in buckets.values():
            bucket.delta = _stack_rows(bucket.states)
        return list(buckets.values())

    def _compress(self, buckets: list[_Bucket], knobs: dict[str, Any]) -> Tensor:
        """This step's momentum and payload of every bucket; returns this rank's non-finite flag.

        Non-finite values are zeroed before they can travel (the flag tells every rank to skip).
        """
        value_dtype = VALUE_DTYPES[knobs["value_dtype"]]
        for index, bucket in enumerate(buckets):
            bucket.momentum = self._momentum(bucket)
            if knobs["replicator"] != "full":
                self._select(bucket, index, value_dtype, knobs)
        payload = [b.momentum if knobs["replicator"] == "full" else b.values for b in buckets]
        flag = guards.nonfinite(payload, self._device)
        for values in payload:
            torch.nan_to_num_(values, nan=0.0, posinf=0.0, neginf=0.0)
        return flag

    def _momentum(self, bucket: _Bucket) -> Tensor:
        """``beta * delta + scale * g`` in a second buffer: the old momentum survives a skipped step."""
        group = bucket.group
        spare = self._spares.pop(bucket.key, None)
        if spare is None or spare.shape != bucket.delta.shape or spare.data_ptr() == bucket.delta.data_ptr():
            spare = torch.empty_like(bucket.delta)
        torch.mul(bucket.delta, group["compression_decay"], out=spare)
        scale = group["lr"] if group["momentum"] == "lr" else 1.0 - group["compression_decay"]
        torch._foreach_add_(list(spare.unbind(0)), bucket.grads, alpha=scale)
        return spare

    def _select(self, bucket: _Bucket, index: int, value_dtype: torch.dtype, knobs: dict[str, Any]) -> None:
        """DCT, choice of the kept coefficients, and error feedback on the bucket's new momentum."""
        layout, momentum = bucket.layout, bucket.momentum
        # Coefficients travel rounded to value_dtype, so the transform runs in it too (bf16 GEMMs are ~3x
        # faster); error feedback still subtracts exactly the rounded values, synthesised in float32.
        source = momentum if value_dtype == momentum.dtype else self._workspace("source", momentum, value_dtype)
        if source is not momentum:
            source.copy_(momentum)
        coefficients = layout.dct(source, out=self._workspace("coefficients", momentum, value_dtype),
                                  scratch=self._workspace("scratch", momentum, value_dtype))
        k = bucket.kept
        if knobs["replicator"] == "random":
            generator = torch.Generator(device=self._device)
            generator.manual_seed(knobs["replicator_seed"] * 2**40 + self.steps * 2**16 + index)
            indices = compression.select_random(layout, momentum.shape[0], k, generator)
        else:
            magnitude = self._workspace("scratch", momentum, value_dtype)
            indices = compression.select_topk(coefficients, layout, k, magnitude)
        bucket.positions, bucket.values = compression.gather(coefficients, layout, indices, value_dtype)
        bucket.indices = indices.to(compression.index_dtype(layout.block_numel))
        sent = compression.scatter_mean(bucket.positions.unsqueeze(0), bucket.values.unsqueeze(0),
                                        out=self._workspace("dense", momentum), counts=None)
        estimate = layout.idct(sent, out=self._workspace("signal", momentum),
                               scratch=self._workspace("dense_scratch", momentum))
        momentum.sub_(estimate, alpha=bucket.group["compression_feedback"])

    def _exchange(
        self, buckets: list[_Bucket], flag: Tensor, knobs: dict[str, Any], stats: CommStats
    ) -> tuple[list[Any], Tensor]:
        """The one inter-node collective of the step; returns each bucket's received payload and the flag
        OR-ed over the replicate group (it rides in the payload)."""
        replicator = knobs["replicator"]
        if replicator == "demo":
            like = [t for b in buckets for t in (b.indices, b.values)]
            rows = self.replicate.all_gather(pack([*like, flag.reshape(1)]), stats)
            parts = unpack(rows, like)
            stats.coefficients = sum(b.values.numel() for b in buckets)
            return [(parts[2 * i], parts[2 * i + 1]) for i in range(len(buckets))], rows[:, -1].amax()
        if replicator in ("random", "full"):
            payload = [b.values if replicator == "random" else b.momentum.reshape(-1) for b in buckets]
            dtype = payload[0].dtype if payload else torch.float32
            total = self.replicate.all_reduce(torch.cat([*payload, flag.to(dtype).reshape(1)]), stats)
            sums = total[:-1].split([t.numel() for t in payload])
            stats.coefficients = sum(t.numel() for t in payload) if replicator == "random" else 0
            return list(sums), (total[-1] > 0).to(torch.uint8)
        return [None] * len(buckets), flag  # "none": a single node

    def _decode(self, bucket: _Bucket, received: Any, knobs: dict[str, Any]) -> Tensor:
        """``Q`` of the bucket, ``(P, *shape)`` in float32, the same on every replica."""
        momentum, layout = bucket.momentum, bucket.layout
        replicator, replicas = knobs["replicator"], self.replicate.size
        if replicator == "full":
            return received.view_as(momentum).div_(replicas)
        if replicator == "none":
            positions, values = bucket.positions.unsqueeze(0), bucket.values.unsqueeze(0)
        elif replicator == "random":
            positions, values = bucket.positions.unsqueeze(0), received.float().div_(replicas).unsqueeze(0)
        else:
            indices, values = received
            positions = torch.stack([layout.flat_positions(momentum.shape[0], i.long()).view(-1) for i in indices])
        dense = compression.scatter_mean(positions, values, out=self._workspace("dense", momentum),
                                         counts=self._workspace("counts", momentum))
        return layout.idct(dense, out=self._workspace("signal", momentum),
                           scratch=self._workspace("dense_scratch", momentum))

    def _commit(self, bucket: _Bucket, spent: bool) -> None:
        """Make this step's momentum the state; the old buffer becomes the next step's spare."""
        if spent:
            bucket.momentum.zero_()
        self._spares[bucket.key] = bucket.delta
        for state, row in zip(bucket.states, bucket.momentum.unbind(0)):
            state["delta"] = row

    def _apply(self, bucket: _Bucket, q: Tensor) -> None:
        """Update the bucket's parameters from its ``(P, *shape)`` signal ``Q``."""
        group = bucket.group
        lr, weight_decay = group["lr"], group["weight_decay"]
        # Q carries lr with momentum="lr": the gradient it estimates is Q / lr.
        to_gradient = (1.0 / lr if lr > 0 else 0.0) if group["momentum"] == "lr" else 1.0
        rows = list(q.unbind(0))
        if group["update"] in ("adamw", "rmsprop"):
            grads = [(row * to_gradient).to(p.dtype) for row, p in zip(rows, bucket.params)]
            beta1 = 0.0 if group["update"] == "rmsprop" else group["betas"][0]
            adamw(
                bucket.params, grads,
                [s["exp_avg"] for s in bucket.states], [s["exp_avg_sq"] for s in bucket.states], [],
                [s["step"] for s in bucket.states],
                amsgrad=False, beta1=beta1, beta2=group["betas"][1], lr=lr,
                weight_decay=weight_decay, eps=group["eps"], maximize=False,
            )
            return
        torch._foreach_add_([s["step"] for s in bucket.states], 1.0)
        if weight_decay:
            torch._foreach_mul_(bucket.params, 1.0 - lr * weight_decay)
        if group["update"] == "sign":
            q.sign_()
            torch._foreach_add_(bucket.params, rows, alpha=-lr)
        else:
            torch._foreach_add_(bucket.params, rows, alpha=-lr * to_gradient)

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
