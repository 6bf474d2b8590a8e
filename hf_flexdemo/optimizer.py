"""FlexDeMo: decoupled-momentum optimisation across nodes, on top of FSDP2 shards.

By default (``local_steps=8``) every node takes local AdamW steps and exchanges the pseudo-gradient once a
round, streamed (:mod:`hf_flexdemo.local_steps`, which reuses this module's exchange). With ``local_steps=1``
(``preset="step-wise"``) the exchange runs every step; per step and per parameter shard (``g`` already
averaged over the node by FSDP):

1. momentum ``delta <- beta * delta + lr * g`` (``momentum="lr"``, DeMo) or ``+ (1 - beta) * g`` (``"ema"``),
   or ``+`` AdamW's first moment ``m`` of this replica's ``g`` (``"avg"``) or its direction ``m / (sqrt(v) + eps)``
   (``"adam"``, the default: without compression and with ``update="sgd"`` this is AdamW)
2. the replicator selects what travels: by default (``"demo"``) the largest ``compression_rate`` of each DCT
   block's coefficients (:mod:`hf_flexdemo.replicators`)
3. error feedback ``delta <- delta - alpha * IDCT(sent)`` (``alpha = compression_feedback``)
4. one collective over the replicate group carries every shard's payload
5. ``Q`` = the decode of all replicas' payloads, bit-identical on every replica
6. decoupled weight decay and the update: ``p <- p - lr * sign(Q)`` (``"sign"``), SGD on ``Q`` (``"sgd"``, the
   default), AdamW fed with ``Q`` as its gradient (``"adamw"``), or AdamW without its first moment
   (``"rmsprop"``) (:mod:`hf_flexdemo.functional`)

This module holds the step's transaction: the plan (:mod:`hf_flexdemo.plan`), the backward hooks,
compress -> exchange -> decide -> decode -> commit and apply, delayed application, ``state_dict`` and the
drift check. What varies between ways of exchanging lives in the replicator; the arithmetic in
:mod:`hf_flexdemo.functional`; the knobs, their defaults and their checks in :mod:`hf_flexdemo.knobs`.

When the exchange happens (``overlap``):

* ``"none"``: ``step()`` compresses every shard and exchanges them in one collective;
* ``"backward"``: a bucket is compressed and its collective started from the hook FSDP2 fires once the
  bucket's node-averaged shards are final, so the network carries it while backward computes the rest;
  ``step()`` waits, decodes and applies (bit-identical to ``"none"``; only the collectives are split);
* ``"delayed"``: ``step()`` applies the previous step's consensus and starts this step's exchange, which
  then travels during the next forward and backward (one step of staleness, as in Psyche); with
  ``local_steps > 1``, during the next round's inner steps (:mod:`hf_flexdemo.local_steps`).

What a GPU cluster needs from ``step()``: the collectives that cross nodes carry the payload (the
non-finite flag rides in it), one tiny all-reduce stays inside the node (the flag, made job-wide), and
the host waits for the device once (the skip decision). Every tensor lives on the parameters' device,
and ``torch.profiler`` shows the phases as ``FlexDeMo::compress``, ``::exchange``, ``::decode``, ``::apply``.
"""

from __future__ import annotations

import logging
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.profiler import record_function

from . import budget, compression, guards, knobs, local_steps
from .knobs import (
    DEFAULT_RATE,
    DEFAULTS,
    OPTIMIZER_WIDE,
    PER_GROUP,
    Consensus,
    DriftAction,
    Momentum,
    NonfiniteAction,
    Overlap,
    Preset,
    Replicator,
    Transform,
    Update,
    ValueDtype,
    check,
)
from .plan import Bucket, Stack, build_plan, local_shard, new_state, set_rows, stack_rows
from .replicate import CommStats, ReplicateGroup, dense_allreduce_bytes
from .replicators import DENSE, REGISTRY, Exchange, exchange_bytes
from .replicators import Replicator as ReplicatorBase
from .workspace import Workspace

PARAM_DTYPES = (torch.float32, torch.bfloat16)
# The replica's own gradient moments of momentum="avg" ("adam" adds the second), float32 like delta.
MOMENT_KEYS = ("grad_avg", "grad_avg_sq")
# State held until overlap="delayed" applies it (see state_dict), and what stays float32 whatever the params.
PENDING_KEYS = ("pending_delta", "pending_update", *(f"pending_{key}" for key in MOMENT_KEYS))
FLOAT32_KEYS = ("delta", *MOMENT_KEYS, *PENDING_KEYS, *local_steps.FLOAT32_KEYS)
_D = DEFAULTS
logger = logging.getLogger(__name__)
FINAL = "compressed"  # finish()'s wire for the last round (docs/how-it-works.md "The end of a run")


class FlexDeMo(Optimizer):
    """FlexDeMo optimizer (see module docstring); ``comm_stats`` describes the last step's traffic, ``options``
    holds the optimizer-wide knobs (:data:`hf_flexdemo.knobs.OPTIMIZER_WIDE`).

    Args:
        params: parameters or parameter groups (``DTensor`` shards or plain tensors). A group may set the
            per-group knobs (:data:`hf_flexdemo.knobs.PER_GROUP`), not the optimizer-wide ones.
        replicate_group: process group of the replicas to exchange with; ``None`` for a single node.
        shard_group: the ranks of this node (FSDP's group), over which the non-finite flag is OR-ed;
            default: the 1-D device mesh of the ``DTensor`` parameters, ``None`` for plain tensors.
        preset: a named set of knob values (:data:`hf_flexdemo.knobs.PRESETS`: ``"step-wise"``,
            ``"flexdemo-paper"``, ``"demo-paper"``) for the knobs left at their default.
        lr, and every keyword after ``shard_group``: the knobs, each explained in :data:`hf_flexdemo.knobs.HELP`
            (the same text as ``FlexDeMoConfig``'s ``--help``), defaults in :data:`hf_flexdemo.knobs.DEFAULTS`.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = _D["lr"],
        *,
        replicate_group: dist.ProcessGroup | None = None,
        shard_group: dist.ProcessGroup | None = None,
        preset: Preset = "default",
        compression_rate: float | None = _D["compression_rate"],
        compression_topk: int | None = _D["compression_topk"],
        compression_chunk: int = _D["compression_chunk"],
        compression_transform: Transform = _D["compression_transform"],
        compression_decay: float = _D["compression_decay"],
        compression_feedback: float = _D["compression_feedback"],
        momentum: Momentum = _D["momentum"],
        update: Update = _D["update"],
        replicator: Replicator = _D["replicator"],
        consensus: Consensus = _D["consensus"],
        weight_decay: float = _D["weight_decay"],
        value_dtype: ValueDtype = _D["value_dtype"],
        replicator_seed: int = _D["replicator_seed"],
        betas: tuple[float, float] = _D["betas"],
        eps: float = _D["eps"],
        overlap: Overlap = _D["overlap"],
        bucket_cap_mb: float = _D["bucket_cap_mb"],
        budget_bytes: int | None = _D["budget_bytes"],
        budget_fraction: float | None = _D["budget_fraction"],
        budget_min_rate: float = _D["budget_min_rate"],
        budget_max_rate: float = _D["budget_max_rate"],
        on_nonfinite: NonfiniteAction = _D["on_nonfinite"],
        drift_check_every: int = _D["drift_check_every"],
        on_drift: DriftAction = _D["on_drift"],
        drift_tolerance: float = _D["drift_tolerance"],
        local_steps: int = _D["local_steps"],
        outer_lr: float = _D["outer_lr"],
        outer_momentum: float = _D["outer_momentum"],
        outer_delay: int = _D["outer_delay"],
        outer_fragments: int | None = _D["outer_fragments"],
    ) -> None:
        given = knobs.apply_preset(preset, {key: value for key, value in locals().items() if key in DEFAULTS})
        knobs.validate(given)
        if all(given[key] is None for key in ("compression_rate", "compression_topk", "budget_bytes",
                                              "budget_fraction")):
            given["compression_rate"] = DEFAULT_RATE
        given = knobs.resolve(given)  # once, so that state_dict records the wire and schedule actually used
        super().__init__(params, {key: given[key] for key in PER_GROUP})
        self.options: dict[str, Any] = {key: given[key] for key in OPTIMIZER_WIDE}
        for group in self.param_groups:
            self._check_group(group)
        self.replicate = ReplicateGroup(replicate_group)
        first = next(p for group in self.param_groups for p in group["params"])
        self._device = local_shard(first).device
        if shard_group is None and isinstance(first, DTensor) and first.device_mesh.ndim == 1:
            shard_group = first.device_mesh.get_group()
        self.shard_group = shard_group
        self.steps = 0  # optimizer steps taken or skipped: the drift schedule and the random positions' seed
        self.skipped_steps = 0
        # the bounded check's last job-wide largest |p - p0| and largest fraction of its bound
        self.replica_drift: dict[str, float] = {}
        self._drift_policy: str | None = None  # on_drift, "auto" resolved at the first check
        self.comm_stats: dict[str, int] = CommStats().as_dict()
        # A budget's current rate (None: each group's compression_rate / compression_topk). A byte budget's
        # is solved from the shard shapes when the plan is built.
        self._rate: float | None = None
        if budget_fraction is not None:
            self._rate = min(max(given["compression_rate"] or DEFAULT_RATE, budget_min_rate), budget_max_rate)
        self._stats = CommStats()  # the step being built (backward hooks count into it too)
        self._timing = torch.full((1,), -1.0, device=self._device)  # the last step's waited fraction (budget)
        self._last_step_end: float | None = None
        self._workspace = Workspace()
        self._hooks: list[Any] = []
        self._reset()

    def _reset(self) -> None:
        """The replicator, the plan and the hooks, (re)built from ``options`` and the parameters' state."""
        # One replica sends nothing: it trains as the rule's dense limit, exactly torch's AdamW where that is AdamW
        # (local steps, and the step-wise momentum="adam" with update="sgd"); replicator="none" emulates the wire.
        single = self.replicate.size == 1 and not REGISTRY[self.options["replicator"]].emulates
        self.adamw_only = single and (self.options["local_steps"] > 1 or all(
            g["momentum"] == "adam" and g["update"] == "sgd" for g in self.param_groups))
        self._replicator = self._new_replicator(DENSE if single else self.options["replicator"])
        self._plan: list[Bucket] | None = None
        self._planned: tuple[int, ...] = ()  # the trainable parameters the plan was built for
        self._dense_bytes = 0  # a dense fp32 all-reduce of the trainable shards: set with the plan
        self._bucket_of: dict[int, Bucket] = {}
        self._next_launch = 0  # buckets are launched in plan order, so every replica issues the same sequence
        self._in_flight = _InFlight(self._replicator, self._workspace, self._device)
        self._pending: dict[str, Any] | None = None  # overlap="delayed": the resolved consensus awaiting its step
        # local_steps > 1: inner AdamW steps and an exchange per round (hf_flexdemo.local_steps)
        self._local = (local_steps.LocalSteps(self) if self.options["local_steps"] > 1 and not self.adamw_only
                       else None)
        self._register_hooks()

    def _register_hooks(self) -> None:
        """``overlap="backward"``: a post-accumulate-grad hook on every trainable FSDP2 shard."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.options["overlap"] == "backward" and not self.adamw_only:
            # FSDP2 calls a shard's post-accumulate-grad hook once its node-averaged gradient is final.
            method = weakref.WeakMethod(self._gradient_ready)  # hooks must not keep the optimizer alive

            def hook(param: Tensor) -> None:
                if (ready := method()) is not None:
                    ready(param)

            self._hooks = [p.register_post_accumulate_grad_hook(hook) for group in self.param_groups
                           for p in group["params"] if p.requires_grad and isinstance(p, DTensor)]

    def _new_replicator(self, name: str) -> ReplicatorBase:
        return REGISTRY[name](self.replicate, value_dtype=self.options["value_dtype"],
                              consensus=self.options["consensus"], seed=self.options["replicator_seed"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's, at any time: the group's ``"auto"`` transform is resolved and its knobs validated; its
        parameters join the exchange at the next step (:meth:`step` re-plans)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if hasattr(self, "options"):  # not from Optimizer.__init__, which __init__ then checks itself
            self._check_group(group)

    def _check_group(self, group: dict[str, Any]) -> None:
        group["compression_transform"] = knobs.resolve_transform(group["compression_transform"],
                                                                 self.options["local_steps"])  # a group's "auto"
        wide = sorted(set(group) & set(OPTIMIZER_WIDE))
        check(not wide, "param group keys", wide, f"per-group knobs only ({', '.join(PER_GROUP)}); pass "
              "optimizer-wide knobs to FlexDeMo(...) itself: they hold for every parameter group")
        knobs.validate({**self.options, **{key: group[key] for key in PER_GROUP}})
        for p in group["params"]:
            check(p.dtype in PARAM_DTYPES, "parameter dtype", p.dtype,
                  "torch.float32 | torch.bfloat16 (fp16 needs a loss scaler that can skip a step on one "
                  "rank only and deadlock the others)")

    # ---- state -------------------------------------------------------------------------------

    @property
    def rate(self) -> float | None:
        """The compression rate in use: a budget's current choice, else the first group's ``compression_rate``."""
        return self._rate if self._rate is not None else self.param_groups[0]["compression_rate"]

    def state_dict(self) -> dict[str, Any]:
        """Torch's ``state_dict`` plus the optimizer-wide options, the step counters and the budget's rate.

        With ``overlap="delayed"`` the exchange in flight is waited for and decoded first: the candidate
        momentum and the consensus still to apply are per-parameter state (``pending_delta``,
        ``pending_update``), so a resumed run applies exactly what the uninterrupted one would.
        """
        if self._in_flight.exchanges:
            if self.options["overlap"] != "delayed":
                raise RuntimeError("FlexDeMo: state_dict() while this step's exchange is in flight (after backward, "
                                   "before step()); call it after optimizer.step().")
            self._hold()
        state = super().state_dict()
        state["flexdemo"] = {"options": dict(self.options), "steps": self.steps, "skipped_steps": self.skipped_steps,
                             "rate": self._rate, "pending": self._pending}
        if self._local is not None:
            self._local.save(state)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, with the saved options; keep the momentum in float32 (torch casts it to the
        parameter's dtype). A checkpoint from before ``options`` carries them in its param groups."""
        super().load_state_dict(state_dict)
        counters = state_dict.get("flexdemo", {})
        saved = dict(counters.get("options") or {})
        if "options" not in counters:
            saved = {key: self.param_groups[0][key] for key in OPTIMIZER_WIDE if key in self.param_groups[0]}
            saved.setdefault("consensus", "choosers")  # saved before the knob existed: DeMo's decode
        for group in self.param_groups:
            for key in OPTIMIZER_WIDE:
                group.pop(key, None)
            group.setdefault("compression_transform", "dct")  # saved before the knob existed
        saved.setdefault("outer_fragments", 1)  # saved before the knob existed: the whole model in one round
        self.options = {**self.options, **saved}
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved_state in state_dict["state"].items():
            for key in FLOAT32_KEYS:
                if key in saved_state:
                    self.state[params[index]][key] = saved_state[key].to(device=self._device, dtype=torch.float32,
                                                                         copy=True)
        self.steps = counters.get("steps", 0)
        self.skipped_steps = counters.get("skipped_steps", 0)
        self._rate = counters.get("rate")
        self._reset()  # on the loaded options and state
        self._pending = counters.get("pending")
        if self._pending is not None and "here" in self._pending:  # the key's name before it said what it holds
            self._pending["own_nonfinite"] = self._pending.pop("here")
        if self._local is not None:
            self._local.load(state_dict)

    @contextmanager
    def consensus_parameters(self) -> Iterator[None]:
        """Inside the block the parameters hold the replicas' last consensus, the model to evaluate and save: with
        ``local_steps > 1`` in the middle of a round, the anchor instead of this node's local values (put back on
        exit, bit for bit); otherwise the parameters already are the consensus. Under FSDP2, reshard the modules
        before and after the block (FlexDeMoTrainer does): the root keeps its gathered parameters after a forward."""
        if self._local is None:
            yield
            return
        with self._local.anchored():
            yield

    def pop_exchange_seconds(self) -> float:
        """Seconds this rank waited for inter-node collectives since the last call (syncs on CUDA)."""
        return self.replicate.timer.pop()

    # ---- the plan ----------------------------------------------------------------------------

    def _trainable(self) -> tuple[int, ...]:
        """Which parameters the plan covers: those that require a gradient, in group order (host-only)."""
        return tuple(id(p) for group in self.param_groups for p in group["params"] if p.requires_grad)

    def _buckets(self) -> list[Bucket]:
        """The exchange plan (:func:`hf_flexdemo.plan.build_plan`), built on the first step and again whenever the
        trainable parameters change (a parameter frozen or unfrozen, :meth:`add_param_group`): the exchanges in
        flight land and a final round brings every replica to one consensus first (:meth:`finish`), so the new
        plan starts where all replicas agree. ``requires_grad`` is the same on every rank, so is the plan."""
        if self._plan is not None and self._trainable() != self._planned:
            self._settle(FINAL)
            self._plan = None
            self._register_hooks()
        if self._plan is None:
            if not self._planned and self.replicate.size == 1:
                name = self._replicator.name
                how = ("torch's AdamW step" if self.adamw_only else "the rule's dense limit" if name == DENSE
                       else f"the wire emulated (replicator={name!r})")
                logger.info("FlexDeMo: one replica, nothing crosses nodes: %s.", how)
            self._planned = self._trainable()
            if self.adamw_only:
                fill = local_steps.adamw_state
            else:
                fill = new_state if self._local is None else self._local.new_state
            fragment_of = None if self._local is None else self._local.assign([p for _, p in self._named_params()])
            self._plan = build_plan(self.param_groups, lambda p, group: fill(self.state[p], p, group),
                                    bucket_cap_mb=self.options["bucket_cap_mb"],
                                    hook_shards=self.options["overlap"] == "backward", fragment_of=fragment_of)
            self._bucket_of = {id(p): bucket for bucket in self._plan for p in bucket.params}
            numel = sum(local_shard(p).numel() for b in self._plan for s in b.stacks for p in s.params)
            self._dense_bytes = dense_allreduce_bytes(numel, self.replicate.size)  # AdamW-HSDP's, for the ratio
            if self.options["budget_bytes"] is not None:
                self._rate = budget.rate_for_bytes(self._bytes_at, self.options["budget_bytes"],
                                                   self.options["budget_min_rate"], self.options["budget_max_rate"])
        return self._plan

    def _bytes_at(self, rate: float) -> int:
        """Inter-node bytes this rank sends per step at ``rate`` (the byte budget's equation): every step's exchange,
        or with local steps a round's (one exchange per fragment) over its ``local_steps`` steps, rounded up."""
        fragments = [None] if self._local is None else [{id(p) for p in members} for members in self._local.members]
        total = sum(
            exchange_bytes(self.options["replicator"],
                           [tuple(local_shard(p).shape) for p in group["params"]
                            if p.requires_grad and (fragment is None or id(p) in fragment)],
                           self.replicate.size, rate=rate, topk=None, chunk=group["compression_chunk"],
                           value_dtype=self.options["value_dtype"])
            for fragment in fragments for group in self.param_groups
        )
        return -(-total // self.options["local_steps"])

    def _kept(self, stack: Stack) -> int:
        if not self._replicator.compresses:
            return 0
        if self._rate is not None:
            return compression.kept_per_block(stack.layout.block_numel, self._rate, None)
        return compression.kept_per_block(stack.layout.block_numel, stack.group["compression_rate"],
                                          stack.group["compression_topk"])

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
        """One optimizer step (see the module docstring): with local steps an inner AdamW step and, at a round's
        end, its exchange; step-wise the compressed exchange of the momentum and the update; with one replica
        torch's AdamW. ``closure`` re-evaluates the loss, as in torch's optimizers."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plan = self._buckets()
        # every N steps; with local steps, at the first point from there on where replicas agree
        if not self.adamw_only and (self._local is None or self._local.agreed(self.steps)) and self.drift_check_due():
            self._check_drift()
        if self.adamw_only:
            self._adamw_step([stack for bucket in plan for stack in bucket.stacks])
        elif self._local is not None:
            self._local.step(plan)
        elif self.options["overlap"] == "delayed":
            if self._in_flight.exchanges:
                self._hold()
            if self._pending is not None:
                self._apply_pending()
            self._launch(plan)  # travels during the next forward and backward
        else:
            if self._next_launch < len(plan):
                self._launch(plan[self._next_launch:])  # what backward has not started (everything, for "none")
            self._resolve_and_apply()
        self._end_step(plan)
        return loss

    @torch.no_grad()
    def finish(self, *, final: Literal["compressed", "dense"] = FINAL) -> dict[str, int]:
        """End of training: every exchange in flight lands, and with local steps one final round of every fragment
        brings each node's steps since its last round into the consensus, so the parameters on every replica are
        the model trained (``overlap="delayed"`` step-wise: the held consensus is applied). ``final``: that round's
        wire, the optimizer's own (its error feedback keeps what it holds back) or one dense float32 all-reduce
        (nothing held back; docs/how-it-works.md "The end of a run" measures both). Call it on every rank, after the
        last ``step()``; training may go on afterwards. Returns this rank's traffic of the call (``comm_stats``'s
        keys), which ``comm_stats`` then holds; a single replica, or replicas already in agreement, send nothing.
        """
        check(final in ("compressed", "dense"), "final", final, "'compressed' | 'dense'")
        if self._in_flight.exchanges and self.options["overlap"] != "delayed":
            raise RuntimeError("FlexDeMo: finish() while this step's exchange is in flight (after backward, before "
                               "step()); call it after optimizer.step().")
        self._settle(final)
        self._stats.dense_bytes = self._dense_bytes
        self.comm_stats, self._stats = self._stats.as_dict(), CommStats()
        return self.comm_stats

    def _settle(self, final: str) -> None:
        """:meth:`finish`'s landing and final round, its traffic counted into the step being built."""
        if self.adamw_only or not self.state:
            return
        plan = self._plan if self._plan is not None else self._buckets()  # loaded from a state_dict: rebuilt
        if self._local is not None:
            if not self._local.agreed(self.steps) or self._in_flight.exchanges or self._pending is not None:
                self._local.finish(plan, None if final == "compressed" else self._new_replicator(DENSE))
        elif self.options["overlap"] == "delayed":
            if self._in_flight.exchanges:
                self._hold()
            if self._pending is not None:
                self._apply_pending()

    @torch.no_grad()
    def adopt_parameters(self) -> None:
        """The parameters were loaded from outside (the best checkpoint, a user's ``load_state_dict``): they become
        what every replica agrees on. An exchange in flight is waited for and dropped; with local steps the anchor
        becomes the parameters and the error feedback and outer momentum restart from zero. The other state
        (AdamW's moments, the step-wise momentum) stays, as torch's optimizers keep theirs. Call it on every
        rank, each having loaded the same weights (``FlexDeMoTrainer`` does, from a load hook on the model)."""
        if self._plan is None:
            return
        if self._in_flight.exchanges:
            stacks = self._resolve()[0]
            for stack in stacks:
                stack.discard()
        if self._pending is not None:
            self._pending = None
            self._drop_pending([s for b in self._plan for s in b.stacks])
        if self._local is not None:
            self._local.adopt(self._plan)

    @contextmanager
    def _exchanging_with(self, replicator: ReplicatorBase | None) -> Iterator[None]:
        """Inside the block the exchanges run on ``replicator`` (``None``: the optimizer's own)."""
        if replicator is None:
            yield
            return
        own, self._replicator, self._in_flight.replicator = self._replicator, replicator, replicator
        try:
            yield
        finally:
            self._replicator = self._in_flight.replicator = own

    def _adamw_step(self, stacks: list[Stack]) -> None:
        """One replica: torch's AdamW, unless a gradient in the node is non-finite (the step's one host sync;
        ``on_nonfinite`` as with several replicas)."""
        with record_function("FlexDeMo::apply"):
            grads = [local_shard(p.grad) for stack in stacks for p in stack.params if p.grad is not None]
            flag = guards.nonfinite(grads, self._device).to(torch.float32).reshape(1)
            if guards.max_in_group(flag, self.shard_group, self._stats).item() > 0:
                self._skip(self.steps, bool(flag.item()))
                return
            local_steps.adamw_step(stacks)

    def _launch(self, buckets: list[Bucket]) -> None:
        """Compress ``buckets`` (consecutive in the plan) and start their exchange, in one collective."""
        for bucket in buckets:
            bucket.launched = True
        self._next_launch += len(buckets)
        timing = [self._timing] if self.options["budget_fraction"] is not None else []
        self._in_flight.launch([s for b in buckets for s in b.stacks], kept=self._kept, step=self.steps,
                               timing=timing, stats=self._stats)

    def _resolve(self) -> tuple[list[Stack], list[Any], bool, bool]:
        """Finish the exchanges in flight and decide (a time budget's next rate with it)."""
        stacks, received, skip, own_nonfinite, measured = self._in_flight.resolve(self.shard_group, self._stats)
        if measured is not None:
            options = self.options
            self._rate = budget.next_rate(self._rate, measured, options["budget_fraction"],
                                          options["budget_min_rate"], options["budget_max_rate"])
        return stacks, received, skip, own_nonfinite

    def _resolve_and_apply(self, rule: Callable[[Stack, Tensor], None] | None = None) -> bool:
        """Wait for this step's exchanges, decide, then decode and apply stack by stack (``rule(stack, Q)``;
        default: the group's update); whether the step was skipped."""
        stacks, received, skip, own_nonfinite = self._resolve()
        if skip:
            self._skip(self.steps, own_nonfinite)
            for stack in stacks:
                stack.discard()
            return True
        for stack, payload in zip(stacks, received):
            with record_function("FlexDeMo::decode"):
                q = self._replicator.decode(stack, payload, workspace=self._workspace)
            with record_function("FlexDeMo::apply"):
                stack.commit(spent=self._replicator.spends_momentum)
                if rule is None:
                    stack.apply(q, stack.lr, self._workspace)
                else:
                    rule(stack, q)
        return False

    def _hold(self) -> None:
        """``overlap="delayed"``: wait for the exchange in flight, decide, and keep the decoded consensus and
        the candidate momentum as per-parameter state until the step that applies them (with local steps, until
        the next round's end)."""
        launched_at = self._in_flight.step
        stacks, received, skip, own_nonfinite = self._resolve()
        for stack, payload in zip(stacks, received):
            if not skip:
                with record_function("FlexDeMo::decode"):
                    q = self._replicator.decode(stack, payload, workspace=self._workspace).clone()
                set_rows(stack.states, "pending_update", q.unbind(0))
            for key, rows in stack.candidate().items():
                set_rows(stack.states, f"pending_{key}", rows)
        self._pending = {"skip": skip, "own_nonfinite": own_nonfinite, "lrs": [stack.lr for stack in stacks],
                         "step": launched_at}

    def _apply_pending(self) -> None:
        """``overlap="delayed"``: commit and apply the held consensus of the previous step (or skip it)."""
        pending, self._pending = self._pending, None
        stacks = [s for b in self._buckets() for s in b.stacks]
        for stack, lr in zip(stacks, pending["lrs"]):
            stack.momentum, stack.lr = stack_rows(stack.states, "pending_delta"), lr
            held = [key for key in MOMENT_KEYS if "pending_" + key in stack.states[0]]
            stack.moments = {key: [s["pending_" + key] for s in stack.states] for key in held} or None
        if pending["skip"]:
            self._skip(pending["step"], pending["own_nonfinite"])
            for stack in stacks:
                stack.discard()
        else:
            for stack in stacks:
                with record_function("FlexDeMo::apply"):
                    stack.commit(spent=self._replicator.spends_momentum)
                    stack.apply(stack_rows(stack.states, "pending_update"), stack.lr, self._workspace)
        self._drop_pending(stacks)

    @staticmethod
    def _drop_pending(stacks: list[Stack]) -> None:
        """Forget the held exchange's per-parameter state once it is applied or skipped."""
        for state in (state for stack in stacks for state in stack.states):
            for key in PENDING_KEYS:
                state.pop(key, None)

    def _end_step(self, plan: list[Bucket]) -> None:
        self.steps += 1
        self._stats.dense_bytes = self._dense_bytes
        self.comm_stats, self._stats = self._stats.as_dict(), CommStats()
        for bucket in plan:
            bucket.launched = False
            bucket.ready.clear()
        self._next_launch = 0
        if self.options["budget_fraction"] is not None:  # this step's waited fraction rides in the next payload
            now = time.perf_counter()
            waited = self.replicate.timer.settle()
            if self._last_step_end is not None:
                self._timing.fill_(waited / max(now - self._last_step_end, 1e-9))
            self._last_step_end = now

    def _skip(self, step: int, own_nonfinite: bool) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        message = (f"FlexDeMo: non-finite gradient at step {step} (on rank {rank}: "
                   f"{'non-finite' if own_nonfinite else 'finite'})")
        if self.options["on_nonfinite"] == "raise":
            raise FloatingPointError(message + " (on_nonfinite='raise').")
        warnings.warn(message + "; every rank skips this step (on_nonfinite='skip').", stacklevel=4)
        self.skipped_steps += 1

    # ---- drift -------------------------------------------------------------------------------

    def drift_check_due(self) -> bool:
        """Whether this step is in a drift-check window: the first ``local_steps`` steps of every
        ``drift_check_every`` (the first point in it where replicas agree checks)."""
        every = self.options["drift_check_every"]
        return bool(every) and self.steps % every < self.options["local_steps"]

    def _check_drift(self, only: list[Tensor] | None = None) -> None:
        """Compare the replicas' parameters: bit for bit (:func:`hf_flexdemo.guards.check_replicas`), or within a bound
        of the step's size (``on_drift="tolerate"``, :func:`hf_flexdemo.guards.check_within_bound`). With local
        steps the anchor is what replicas share (the parameters restart from it): it is checked, and the
        parameters restart from it again, as a resync left it. ``only``: these parameters alone (local steps'
        ``outer_fragments``: the fragment that just landed; the others' replicas differ and keep their values)."""
        params = self._named_params()
        if only is not None:
            wanted = {id(p) for p in only}
            params = [(name, p) for name, p in params if id(p) in wanted]
        anchored = self._local is not None and all("anchor" in self.state[p] for _, p in params)
        named = [(name, self.state[p]["anchor"] if anchored else local_shard(p)) for name, p in params]
        if self._drift_policy is None:  # on_drift="auto": exact on one kind of hardware, bounded across kinds
            self._drift_policy = self.options["on_drift"]
            if self._drift_policy == "auto":
                mixed = guards.hardware_differs(self._device, self.replicate, self.shard_group, self._stats)
                self._drift_policy = "tolerate" if mixed else "raise"
        if self._drift_policy == "tolerate":
            self._check_within_bound(named, [p for _, p in params])
        else:
            guards.check_replicas(named, self.replicate, self.shard_group, self._drift_policy, self._stats)
        if anchored:
            torch._foreach_copy_([local_shard(p) for _, p in params], [anchor for _, anchor in named])

    def _check_within_bound(self, named: list[tuple[str, Tensor]], params: list[Tensor]) -> None:
        # a schedule's peak (torch schedulers keep it as initial_lr): the largest step since the last check
        peak = {id(p): max(g["lr"], g.get("initial_lr", g["lr"])) for g in self.param_groups for p in g["params"]}
        lrs = [peak[id(p)] for p in params]
        drift, used = guards.check_within_bound(named, lrs, self.options["drift_tolerance"], self.replicate,
                                                self.shard_group, self._stats)
        self.replica_drift = {"replica_drift": drift, "replica_drift_of_bound": used}

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


class _InFlight:
    """The exchanges of the step in flight: each compressed and started with :meth:`launch` (one collective per
    call: the whole step, or a bucket during backward), then waited for and decided together by :meth:`resolve`."""

    def __init__(self, replicator: ReplicatorBase, workspace: Workspace, device: torch.device) -> None:
        self.replicator, self.workspace, self.device = replicator, workspace, device
        self.exchanges: list[Exchange] = []
        self.flags: list[Tensor] = []  # this rank's own non-finite flags
        self.step = 0  # the optimizer step that launched the exchanges in flight

    def launch(self, stacks: list[Stack], *, kept: Callable[[Stack], int], step: int, timing: list[Tensor],
               stats: CommStats, momentum: Callable[[Stack], Tensor] = Stack.new_momentum) -> None:
        """The new ``momentum`` and payload of every stack, then their collective, the non-finite flag (and a time
        budget's ``timing``) riding in it. Non-finite values are zeroed before they are encoded."""
        replicator, payloads, self.step = self.replicator, [], step
        with record_function("FlexDeMo::compress"):
            for stack in stacks:
                stack.momentum, stack.lr = momentum(stack), stack.group["lr"]
                payloads.append(replicator.select(stack, k=kept(stack), step=step, workspace=self.workspace))
            flag = guards.nonfinite(payloads, self.device)
            for values in payloads:
                torch.nan_to_num_(values, nan=0.0, posinf=0.0, neginf=0.0)
            for stack in stacks:
                replicator.encode(stack, feedback=stack.group["compression_feedback"], workspace=self.workspace)
        with record_function("FlexDeMo::exchange"):
            self.exchanges.append(replicator.start(stacks, [flag.reshape(1), *timing], stats))
        self.flags.append(flag)

    def resolve(self, shard_group: dist.ProcessGroup | None, stats: CommStats
                ) -> tuple[list[Stack], list[Any], bool, bool, float | None]:
        """Wait for every exchange: the stacks, their received payloads, and the step's one host sync: skip or
        not, the same on every rank (the flag OR-ed over the replicate group by the payloads, over the node by
        one all-reduce); on the skip path only, whether this rank's own gradient was the non-finite one; and
        with a time budget, the agreed waited fraction."""
        stacks, received, flags, timings = [], [], [], []
        for exchange in self.exchanges:
            stacks += exchange.stacks
            got, trailer = self.replicator.finish(exchange)
            received += got
            flags.append((trailer[0] > 0).any())
            if len(trailer) > 1:
                timings.append(trailer[1].float().mean())
        verdict = torch.stack(flags).any().to(torch.float32).reshape(1)
        if timings:
            verdict = torch.cat([verdict, timings[0].reshape(1)])
        with record_function("FlexDeMo::exchange"):
            verdict = guards.max_in_group(verdict, shard_group, stats)
        skip, measured = verdict.tolist() if timings else (verdict.item(), None)
        own_nonfinite = bool(torch.stack(self.flags).any()) if skip > 0 else False  # a second sync, skip path only
        self.exchanges, self.flags = [], []
        return stacks, received, skip > 0, own_nonfinite, measured
