"""FlexDeMo: decoupled-momentum optimisation across nodes, on top of FSDP2 shards.

Per step and per parameter shard (``g`` already averaged over the node by FSDP):

1. decoupled weight decay ``p <- p * (1 - lr * wd)``
2. momentum ``delta <- beta * delta + lr * g``
3. DCT of ``delta`` in blocks, top-``k`` coefficients per block (``compression``)
4. error feedback ``delta <- delta - IDCT(top-k)``
5. all-gather of every shard's top-``k`` payload over the replicate group, in one collective
6. ``Q`` = mean-over-choosers decode of all replicas' payloads (bit-identical on every replica)
7. update: ``p <- p - lr * sign(Q)`` (``"sign"``), ``p <- p - Q`` (``"sgd"``: ``Q`` already carries
   ``lr``), or AdamW on the gradient estimate ``Q / lr`` (``"adamw"``)

``replicator="full"`` replaces 3-6 by a dense average of ``delta`` (which is then spent entirely);
``"none"`` keeps everything local (a single node). Parameters may be FSDP2 ``DTensor`` shards or
plain tensors; all arithmetic runs on local shards, state is created lazily in :meth:`step`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.optim.adamw import adamw

from . import compression, guards
from .dct import BlockLayout
from .replicate import CommStats, ReplicateGroup, dense_allreduce_bytes

UPDATES = ("sign", "sgd", "adamw")
REPLICATORS = ("demo", "full", "none")
VALUE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PARAM_DTYPES = (torch.float32, torch.bfloat16)


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _check(ok: bool, name: str, value: Any, accepted: str) -> None:
    if not ok:
        raise ValueError(f"FlexDeMo: invalid {name}={value!r}; accepted: {accepted}.")


def validate_guards(on_nonfinite: str, drift_check_every: int, on_drift: str) -> None:
    """Raise ``ValueError`` naming the field and the accepted values for an invalid guard setting."""
    _check(on_nonfinite in guards.NONFINITE_ACTIONS, "on_nonfinite", on_nonfinite, " | ".join(guards.NONFINITE_ACTIONS))
    _check(isinstance(drift_check_every, int) and drift_check_every >= 0, "drift_check_every", drift_check_every,
           "an integer >= 0 (0 disables the check)")
    _check(on_drift in guards.DRIFT_ACTIONS, "on_drift", on_drift, " | ".join(guards.DRIFT_ACTIONS))


def validate_compression(
    compression_topk: int, compression_chunk: int, compression_decay: float, update: str, replicator: str,
    value_dtype: str,
) -> None:
    """Raise ``ValueError`` naming the field and the accepted values for any invalid FlexDeMo knob."""
    _check(isinstance(compression_topk, int) and compression_topk >= 1, "compression_topk",
           compression_topk, "an integer >= 1")
    _check(isinstance(compression_chunk, int) and compression_chunk >= 1, "compression_chunk",
           compression_chunk, "an integer >= 1")
    _check(0.0 <= compression_decay < 1.0, "compression_decay", compression_decay, "a float in [0, 1)")
    _check(update in UPDATES, "update", update, " | ".join(UPDATES))
    _check(replicator in REPLICATORS, "replicator", replicator, " | ".join(REPLICATORS))
    _check(value_dtype in VALUE_DTYPES, "value_dtype", value_dtype, " | ".join(VALUE_DTYPES))


@dataclass
class _Bucket:
    """Parameters of one group whose local shards share a block layout.

    Their momentum buffers are the rows of one stacked tensor (``delta``; each parameter's
    ``state["delta"]`` is a view of its row), so the bucket is transformed in a few large kernels.
    """

    layout: BlockLayout
    group: dict[str, Any]
    params: list[Tensor] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    states: list[dict[str, Tensor]] = field(default_factory=list)
    delta: Tensor | None = None

    def block_views(self, tensors: list[Tensor]) -> list[Tensor]:
        """``(g1, n1, g2, n2)`` views of same-shaped tensors, matching ``signal.transpose(2, 3)`` rows."""
        (g1, g2), (n1, n2) = self.layout.grid, self.layout.block
        return [t.view(g1, n1, g2, n2) for t in tensors]


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
        compression_topk: coefficients kept per DCT block.
        compression_chunk: largest block side; each side is the largest divisor of the shard dimension
            not above it.
        compression_decay: momentum decay ``beta`` in ``[0, 1)``.
        update: ``"sign"`` (DeMo), ``"sgd"`` or ``"adamw"``.
        replicator: ``"demo"`` (DCT top-k), ``"full"`` (dense average) or ``"none"`` (no exchange).
        weight_decay: decoupled weight decay.
        value_dtype: wire type of the coefficients, ``"bfloat16"`` or ``"float32"``.
        betas, eps: AdamW constants, used with ``update="adamw"``.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        *,
        replicate_group: dist.ProcessGroup | None = None,
        compression_topk: int = 4,
        compression_chunk: int = 64,
        compression_decay: float = 0.999,
        update: str = "sign",
        replicator: str = "demo",
        weight_decay: float = 0.0,
        value_dtype: str = "bfloat16",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        on_nonfinite: str = "skip",
        drift_check_every: int = 100,
        on_drift: str = "raise",
    ) -> None:
        _check(lr >= 0, "lr", lr, "a float >= 0")
        validate_compression(compression_topk, compression_chunk, compression_decay, update, replicator, value_dtype)
        _check(weight_decay >= 0, "weight_decay", weight_decay, "a float >= 0")
        _check(all(0.0 <= b < 1.0 for b in betas), "betas", betas, "two floats in [0, 1)")
        _check(eps > 0, "eps", eps, "a float > 0")
        validate_guards(on_nonfinite, drift_check_every, on_drift)
        defaults = dict(lr=lr, compression_decay=compression_decay, weight_decay=weight_decay,
                        betas=betas, eps=eps)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                _check(p.dtype in PARAM_DTYPES, "parameter dtype", p.dtype,
                       "torch.float32 | torch.bfloat16 (fp16 needs a loss scaler that can skip a step on one "
                       "rank only and deadlock the others)")
        self.replicate = ReplicateGroup(replicate_group)
        _check(replicator != "none" or self.replicate.size == 1, "replicator", replicator,
               "'demo' | 'full' when the replicate group has more than one rank ('none' lets replicas drift)")
        self.compression_topk = compression_topk
        self.compression_chunk = compression_chunk
        self.update = update
        self.replicator = replicator
        self.value_dtype = VALUE_DTYPES[value_dtype]
        self.on_nonfinite = on_nonfinite
        self.drift_check_every = drift_check_every
        self.on_drift = on_drift
        self.skipped_steps = 0
        self._steps = 0
        self.comm_stats: dict[str, float] = CommStats().as_dict()
        self._buffers: dict[int, Tensor] = {}

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stats = CommStats()
        buckets = self._buckets()
        if self.drift_check_every and self._steps % self.drift_check_every == 0:
            self._check_drift()
        self._steps += 1
        if not self._inputs_finite(buckets, stats):
            self.comm_stats = stats.as_dict()
            return loss
        for bucket in buckets:
            bucket.delta.mul_(bucket.group["compression_decay"])
            torch._foreach_add_(list(bucket.delta.unbind(0)), bucket.grads, alpha=bucket.group["lr"])
        if self.replicator == "full":
            self._full_average(buckets, stats)
        else:
            self._demo_exchange(buckets, stats)
        numel = sum(b.delta.numel() for b in buckets)
        stats.dense_bytes = dense_allreduce_bytes(numel, self.replicate.size)
        self.comm_stats = stats.as_dict()
        return loss

    def _inputs_finite(self, buckets: list[_Bucket], stats: CommStats) -> bool:
        """Agree across all ranks, before any state changes or anything is sent, whether a gradient is
        NaN/Inf. Momentum stays finite by induction: it only ever accumulates checked gradients."""
        grads = [g for b in buckets for g in b.grads]
        bad = guards.nonfinite_ranks(grads, grads[0].device if grads else torch.device("cpu"), stats)
        if not bad:
            return True
        message = f"FlexDeMo: non-finite gradient on rank(s) {bad}"
        if self.on_nonfinite == "raise":
            raise FloatingPointError(message + " (on_nonfinite='raise').")
        warnings.warn(message + "; every rank skips this step (on_nonfinite='skip').", stacklevel=3)
        self.skipped_steps += 1
        return False

    def _check_drift(self) -> None:
        """Compare parameter fingerprints across replicas; raise or re-synchronise on a mismatch."""
        if self.replicate.size == 1:
            return
        named = [(name, _local(p)) for name, p in self._named_params()]
        bad = guards.drifted([p for _, p in named], self.replicate.group, self.replicate.size)
        names = guards.agree([named[i][0] for i in bad])  # other replicate groups must stop too
        if not names:
            return
        if self.on_drift == "raise":
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

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, then restore the saved buffer dtypes (torch casts them to the parameter's)."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            state = self.state[params[index]]
            for key, value in saved.items():
                state[key] = value.to(device=params[index].device, copy=True)

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
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["delta"] = torch.zeros_like(param, dtype=torch.float32)
                    if self.update == "adamw":
                        state["exp_avg"] = torch.zeros_like(param)
                        state["exp_avg_sq"] = torch.zeros_like(param)
                if not param.numel():
                    continue  # an empty shard: its replicas are empty too, nothing to send or update
                layout = BlockLayout.for_shape(tuple(param.shape), self.compression_chunk)
                bucket = buckets.setdefault((index, layout), _Bucket(layout, group))
                bucket.params.append(param)
                bucket.grads.append(torch.zeros_like(param) if p.grad is None else _local(p.grad))
                bucket.states.append(state)
        for bucket in buckets.values():
            bucket.delta = _stack_rows(bucket.states)
        return list(buckets.values())

    def _demo_exchange(self, buckets: list[_Bucket], stats: CommStats) -> None:
        """Compress every bucket, exchange all payloads in one collective, decode and apply per bucket."""
        payload = []
        for bucket in buckets:
            layout, delta = bucket.layout, bucket.delta
            # Coefficients travel rounded to value_dtype, so the transform runs in it too (bf16 GEMMs are ~3x
            # faster); error feedback still subtracts exactly the rounded values, synthesised in float32.
            source = delta
            if self.value_dtype != delta.dtype:
                source = self._workspace(2, delta, self.value_dtype).copy_(delta)
            coefficients = self._workspace(0, delta, self.value_dtype)
            scratch = self._workspace(1, delta, self.value_dtype)
            k = min(self.compression_topk, layout.block_numel)
            layout.dct(source, out=coefficients, scratch=scratch)
            indices, values, estimate = compression.compress(
                coefficients, layout, k, self.value_dtype, magnitude=scratch, estimate=self._workspace(3, delta)
            )
            estimate = estimate.view(layout.blocks(delta).shape)
            layout.blocks(delta).sub_(estimate)
            stats.coefficients += indices.numel()
            if self.replicate.size == 1:
                self._apply(bucket, estimate)
            payload += [indices, values]
        if self.replicate.size == 1:
            return
        gathered = self.replicate.all_gather(payload, stats)
        for i, bucket in enumerate(buckets):
            out = self._workspace(3, bucket.delta).view(-1, *bucket.layout.block)
            signal = compression.decode(gathered[2 * i], gathered[2 * i + 1], bucket.layout.block, out)
            self._apply(bucket, signal.view(bucket.layout.blocks(bucket.delta).shape))

    def _workspace(self, slot: int, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """A reusable contiguous buffer shaped like ``like``: on CPU, fresh multi-MB allocations fault
        their pages in again on every step, which costs as much as the transform itself."""
        dtype = dtype or like.dtype
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.numel() < like.numel() or buffer.device != like.device or buffer.dtype != dtype:
            buffer = self._buffers[slot] = like.new_empty(like.numel(), dtype=dtype)
        return buffer[: like.numel()].view(like.shape)

    def _full_average(self, buckets: list[_Bucket], stats: CommStats) -> None:
        """Dense average of all momentum in one all-reduce; the momentum is then spent entirely."""
        flat = self.replicate.mean(torch.cat([b.delta.reshape(-1) for b in buckets]), stats)
        for bucket, piece in zip(buckets, flat.split([b.delta.numel() for b in buckets])):
            self._apply(bucket, bucket.layout.blocks(piece.view_as(bucket.delta)))
            bucket.delta.zero_()

    def _apply(self, bucket: _Bucket, signal: Tensor) -> None:
        """Update the bucket's parameters from its ``(P, g1, g2, n1, n2)`` signal ``Q``."""
        group = bucket.group
        lr, weight_decay = group["lr"], group["weight_decay"]
        rows = list(signal.transpose(2, 3).unbind(0))
        if self.update == "adamw":
            grads = [
                (q / lr if lr > 0 else torch.zeros_like(q)).reshape(p.shape).to(p.dtype)
                for q, p in zip(rows, bucket.params)
            ]
            adamw(
                bucket.params, grads,
                [s["exp_avg"] for s in bucket.states], [s["exp_avg_sq"] for s in bucket.states], [],
                [s["step"] for s in bucket.states],
                amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1], lr=lr,
                weight_decay=weight_decay, eps=group["eps"], maximize=False,
            )
            return
        torch._foreach_add_([s["step"] for s in bucket.states], 1.0)
        if weight_decay:
            torch._foreach_mul_(bucket.params, 1.0 - lr * weight_decay)
        if self.update == "sign":
            signal.sign_()
            torch._foreach_add_(bucket.block_views(bucket.params), rows, alpha=-lr)
        else:
            torch._foreach_add_(bucket.block_views(bucket.params), rows, alpha=-1.0)
