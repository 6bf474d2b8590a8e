"""FlexDeMo: local steps between nodes, FSDP2 inside them, and a compressed, error-fed exchange.

The default path, local steps (:mod:`hf_flexdemo.optim.local_steps`): every node takes local AdamW steps on its FSDP2
shards, with no traffic; every 8 steps (4 in a run the Trainer knows to be short) a node's pseudo-gradient (where it
went since the last consensus) enters error feedback, its largest quarter per block travels in 2-bit values, and
every node restarts from the consensus. The exchange is streamed, a quarter of the model at a time
(``outer_fragments``): each fragment's starts at its round's end and lands when the next fragment's starts, so the
link is busy evenly and hides behind compute. ``local_steps=1``
(``preset="step-wise"``, :mod:`hf_flexdemo.optim.stepwise`) exchanges the compressed momentum every step, as FlexDeMo
does; a single node trains as torch's AdamW (:mod:`hf_flexdemo.optim.one_replica`).

This module holds what every mode shares: the knobs, resolved once (:mod:`hf_flexdemo.knobs`); the plan of which shards
travel together (:mod:`hf_flexdemo.optim.plan`); the exchange engine (:mod:`hf_flexdemo.optim.exchange`); the end of a
run (:meth:`FlexDeMo.finish`). ``state_dict`` is :mod:`hf_flexdemo.optim.state`'s, the drift check
:mod:`hf_flexdemo.optim.guards`'.
``step()`` dispatches to the mode (:mod:`hf_flexdemo.optim.mode`). docs/how-it-works.md explains the algorithm and why
each default is what it is.

What a GPU cluster needs from ``step()``: the collectives that cross nodes carry the payload (the non-finite flag
rides in it), one tiny all-reduce stays inside the node (the flag, made job-wide), and the host waits for the device
once (the skip decision). Every tensor lives on the parameters' device, and ``torch.profiler`` shows the phases as
``FlexDeMo::compress``, ``::exchange``, ``::decode``, ``::apply``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from .. import knobs
from ..knobs import DEFAULT_RATE, DEFAULTS, OPTIMIZER_WIDE, PER_GROUP, Overlap, Preset, check
from ..policies import CLASSES as POLICY_CLASSES
from ..policies import BudgetPolicy, CompressionPolicy, GuardPolicy, OuterPolicy, StepRulePolicy, knob_values
from ..wire.collectives import CommStats, ReplicateGroup
from ..wire.replicators import DENSE, REGISTRY, Replicator
from . import local_steps
from .exchange import ExchangeEngine
from .guards import DriftCheck, DriftChecking
from .mode import Mode
from .one_replica import OneReplica
from .plan import Bucket, local_shard
from .planner import Planner
from .state import StateDictMixin
from .stepwise import StepWise

PARAM_DTYPES = (torch.float32, torch.bfloat16)
FINAL = "compressed"  # finish()'s wire for the last round (docs/how-it-works.md "The end of a run")


class FlexDeMo(StateDictMixin, DriftChecking, Optimizer):
    """FlexDeMo optimizer (see the module docstring); ``comm_stats`` describes the last step's traffic, ``options``
    holds the optimizer-wide knobs (:data:`hf_flexdemo.knobs.OPTIMIZER_WIDE`), flat, as resolved.

    Args:
        params: parameters or parameter groups (``DTensor`` shards or plain tensors). A group may set the
            per-group knobs by their flat names (:data:`hf_flexdemo.knobs.PER_GROUP`: ``lr``, ``compression_rate``,
            ...), not the optimizer-wide ones.
        lr, betas, eps, weight_decay: AdamW's, per group (the inner steps'; step-wise, the rule's).
        replicate_group: process group of the replicas to exchange with; ``None`` for a single node.
        shard_group: the ranks of this node (FSDP's group), over which the non-finite flag is OR-ed;
            default: the 1-D device mesh of the ``DTensor`` parameters, ``None`` for plain tensors.
        preset: a named set of knob values (:data:`hf_flexdemo.knobs.PRESETS`: ``"step-wise"``,
            ``"flexdemo-paper"``, ``"demo-paper"``) for the knobs left at their default.
        local_steps: AdamW steps each node takes between two exchanges (1: the step-wise mode; ``None``: 8, the
            choice for a run of unknown length; ``FlexDeMoTrainer`` resolves it from the run's and the model's, 4
            under 1,000 steps, 16 from 2,000 steps on 8 M parameters or more: :func:`knobs.resolve_local_steps`).
        overlap: when the exchange runs (``"auto"``: streamed with local steps, in ``step()`` step-wise).
        bucket_cap_mb: the exchange bucket size, as DDP's.
        compression: what travels (:class:`~hf_flexdemo.policies.CompressionPolicy`; ``None``: the defaults).
        outer: local steps' outer rule and streaming (:class:`~hf_flexdemo.policies.OuterPolicy`).
        step_rule: the step-wise rule (:class:`~hf_flexdemo.policies.StepRulePolicy`).
        budget: a byte or time budget instead of a fixed rate (:class:`~hf_flexdemo.policies.BudgetPolicy`).
        guards: non-finite steps and the replica drift check (:class:`~hf_flexdemo.policies.GuardPolicy`).

    Every knob is explained in docs/configuration.md (:data:`hf_flexdemo.knobs.KNOBS`, the same text as
    ``FlexDeMoConfig``'s ``--help``); :func:`hf_flexdemo.policies.from_knobs` builds these keywords from flat names.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = DEFAULTS["lr"],
        *,
        betas: tuple[float, float] = DEFAULTS["betas"],
        eps: float = DEFAULTS["eps"],
        weight_decay: float = DEFAULTS["weight_decay"],
        replicate_group: dist.ProcessGroup | None = None,
        shard_group: dist.ProcessGroup | None = None,
        preset: Preset = "default",
        local_steps: int | None = DEFAULTS["local_steps"],
        overlap: Overlap = DEFAULTS["overlap"],
        bucket_cap_mb: float = DEFAULTS["bucket_cap_mb"],
        compression: CompressionPolicy | None = None,
        outer: OuterPolicy | None = None,
        step_rule: StepRulePolicy | None = None,
        budget: BudgetPolicy | None = None,
        guards: GuardPolicy | None = None,
    ) -> None:
        given = knobs.apply_preset(preset, knob_values({key: value for key, value in locals().items()
                                                        if key in DEFAULTS or key in POLICY_CLASSES}))
        knobs.validate(given)
        # resolved once, so that state_dict records the wire and schedule actually used
        given = knobs.resolve(knobs.with_default_rate(given))
        super().__init__(params, {key: given[key] for key in PER_GROUP})
        self.options: dict[str, Any] = {key: given[key] for key in OPTIMIZER_WIDE}
        for group in self.param_groups:
            self._check_group(group)
        self.replicate = ReplicateGroup(replicate_group)
        # the outer step's default follows the nodes, here and on a resume on other nodes (step-wise: unread)
        self.outer_lr_follows_nodes = self.options["outer_lr"] is None
        if self.options["local_steps"] > 1:
            self.options["outer_lr"] = knobs.resolve_outer_lr(self.options["outer_lr"], self.replicate.size,
                                                             self.options["replicator"])
        first = next(p for group in self.param_groups for p in group["params"])
        self.device = local_shard(first).device
        if shard_group is None and isinstance(first, DTensor) and first.device_mesh.ndim == 1:
            shard_group = first.device_mesh.get_group()
        self.shard_group = shard_group
        self.steps = 0  # optimizer steps taken or skipped: the drift schedule and the random positions' seed
        self.drift = DriftCheck(self.replicate, shard_group, self.device)
        self.comm_stats: dict[str, int] = CommStats().as_dict()
        self.exchange = ExchangeEngine(self._new_replicator(DENSE), replicate=self.replicate, shard_group=shard_group,
                                       device=self.device, options=self.options)
        if given["budget_fraction"] is not None:  # a byte budget's rate is solved from the shard shapes with the plan
            self.exchange.rate = min(max(given["compression_rate"] or DEFAULT_RATE, given["budget_min_rate"]),
                                     given["budget_max_rate"])
        self.mode: Mode = Mode(self)
        self._reset()

    def _reset(self) -> None:
        """The mode, the replicator and the plan, (re)built from ``options`` and the parameters' state."""
        # One replica sends nothing: it trains as the rule's dense limit, exactly torch's AdamW where that is AdamW
        # (local steps, and the step-wise momentum="adam" with update="sgd"); replicator="none" emulates the wire.
        single = self.replicate.size == 1 and not REGISTRY[self.options["replicator"]].emulates
        self.adamw_only = single and (self.options["local_steps"] > 1 or all(
            g["momentum"] == "adam" and g["update"] == "sgd" for g in self.param_groups))
        self.exchange.options = self.options
        self.exchange.reset(self._new_replicator(DENSE if single else self.options["replicator"]))
        if isinstance(self.mode, StepWise):
            self.mode.remove_hooks()
        self.mode = (OneReplica(self) if self.adamw_only else
                     local_steps.LocalSteps(self) if self.options["local_steps"] > 1 else StepWise(self))
        self.planner = Planner(self)

    def _new_replicator(self, name: str) -> Replicator:
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

    # ---- what a Trainer reads ------------------------------------------------------------------

    @property
    def rate(self) -> float | None:
        """The compression rate in use: a budget's current choice, else the first group's ``compression_rate``."""
        return self.exchange.rate if self.exchange.rate is not None else self.param_groups[0]["compression_rate"]

    @property
    def skipped_steps(self) -> int:
        """Steps (or rounds) every rank skipped for a non-finite value (``on_nonfinite="skip"``)."""
        return self.exchange.skipped_steps

    @property
    def replica_drift(self) -> dict[str, float]:
        """The bounded drift check's last job-wide largest ``|p - p0|`` and largest fraction of its bound."""
        return self.drift.replica_drift

    @property
    def holds_exchange(self) -> bool:
        """Whether an exchange is in flight or held, to land in a later step (``state_dict`` then saves it)."""
        return self.exchange.in_flight or self.exchange.held is not None

    def pop_exchange_seconds(self) -> float:
        """Seconds this rank waited for inter-node collectives since the last call (syncs on CUDA)."""
        return self.replicate.timer.pop()

    @contextmanager
    def consensus_parameters(self) -> Iterator[None]:
        """Inside the block the parameters hold the replicas' last consensus, the model to evaluate and save: with
        ``local_steps > 1`` in the middle of a round, the anchor instead of this node's local values (put back on
        exit, bit for bit); otherwise the parameters already are the consensus. Under FSDP2, reshard the modules
        before and after the block (FlexDeMoTrainer does): the root keeps its gathered parameters after a forward."""
        with self.mode.anchored():
            yield

    # ---- the plan ----------------------------------------------------------------------------

    def exchange_plan(self) -> list[Bucket]:
        """The buckets and stacks the exchange runs on (:class:`~.planner.Planner`), built at the first step and again
        whenever the trainable parameters change: the exchanges in flight land and a final round brings every replica
        to one consensus first (:meth:`finish`), so the new plan starts where all replicas agree."""
        if self.planner.stale():
            self._settle(FINAL)
            self.planner.plan = None
        return self.planner.plan if self.planner.plan is not None else self.planner.build()

    # ---- step --------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        """One optimizer step, by the mode: at the defaults an inner AdamW step and, at the end of a fragment's
        round, the start of its streamed exchange (the one in flight lands first); step-wise the compressed
        exchange of the momentum and the update; with one replica torch's AdamW. ``closure`` re-evaluates the loss,
        as in torch's optimizers."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plan = self.exchange_plan()
        # every N steps; with local steps, at the first point from there on where replicas agree
        if not self.adamw_only and self.mode.agreed(self.steps) and self.drift_check_due():
            self.check_drift()
        self.mode.step(plan)
        self.steps += 1
        self.comm_stats = self.exchange.close_step(self.planner.dense_bytes)
        self.mode.end_step(plan)
        if self.options["budget_fraction"] is not None:
            self.exchange.time_step()
        return loss

    @torch.no_grad()
    def observe_micro_batch(self, *, last: bool) -> None:
        """Call after each micro-batch's backward, before clipping, on every rank (``FlexDeMoTrainer`` does);
        ``last``: the step's last micro-batch. With ``progress_scale_estimate="micro_batches"`` the step's
        micro-batches, taken at the same weights, give the lengthening its signal estimate
        (:mod:`~hf_flexdemo.optim.progress_scale`); otherwise nothing happens. Elementwise on the parameters' device,
        no collective, no host sync."""
        if self.options["progress_scale_estimate"] == "micro_batches" and not self.adamw_only:
            self.mode.observe_micro_batch(self.exchange_plan(), last=last)

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
        if self.exchange.in_flight:
            self._refuse_in_flight("finish")
        self._settle(final)
        self.comm_stats = self.exchange.close_step(self.planner.dense_bytes)
        return self.comm_stats

    def _settle(self, final: str) -> None:
        """:meth:`finish`'s landing and final round, its traffic counted into the step being built."""
        if self.adamw_only or not self.state:
            return
        plan = self.planner.plan if self.planner.plan is not None else self.exchange_plan()  # after a load: rebuilt
        if not self.mode.agreed(self.steps) or self.holds_exchange:
            self.mode.finish(plan, None if final == "compressed" else self._new_replicator(DENSE))

    @torch.no_grad()
    def adopt_parameters(self) -> None:
        """The parameters were loaded from outside (the best checkpoint, a user's ``load_state_dict``): they become
        what every replica agrees on. An exchange in flight is waited for and dropped; with local steps the anchor
        becomes the parameters and the error feedback and outer momentum restart from zero. The other state
        (AdamW's moments, the step-wise momentum) stays, as torch's optimizers keep theirs. Call it on every
        rank, each having loaded the same weights (``FlexDeMoTrainer`` does, from a load hook on the model)."""
        plan = self.planner.plan
        if plan is None:
            return
        self.exchange.discard([s for b in plan for s in b.stacks])
        self.mode.adopt(plan)
