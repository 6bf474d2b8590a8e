"""When and how an optimizer's exchange plan is (re)built: at the first step, and whenever the trainable parameters
change (a parameter frozen or unfrozen, ``add_param_group``). ``requires_grad`` is the same on every rank, so is the
plan (:func:`~hf_flexdemo.optim.plan.build_plan`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..wire.collectives import dense_allreduce_bytes
from ..wire.replicators import DENSE, exchange_bytes
from . import budget
from .plan import Bucket, build_plan, local_shard

if TYPE_CHECKING:
    from .optimizer import FlexDeMo

logger = logging.getLogger(__name__)


class Planner:
    """The plan of one :class:`~hf_flexdemo.optim.optimizer.FlexDeMo`: ``plan`` (``None`` until built),
    ``dense_bytes`` (AdamW-HSDP's bytes per step for the trainable shards, the ratio's reference) and ``parameters``
    (the trainable parameters' full element count, every node's model)."""

    def __init__(self, optimizer: FlexDeMo) -> None:
        self.optimizer = optimizer
        self.plan: list[Bucket] | None = None
        self.dense_bytes = 0
        self.parameters = 0
        self._planned: tuple[int, ...] = ()  # the trainable parameters the plan was built for

    def trainable(self) -> tuple[int, ...]:
        """Which parameters a plan covers: those that require a gradient, in group order (host-only)."""
        return tuple(id(p) for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad)

    def stale(self) -> bool:
        """Whether a plan was built and the trainable parameters have changed since."""
        return self.plan is not None and self.trainable() != self._planned

    def build(self) -> list[Bucket]:
        """A new plan for the trainable parameters, their state filled by the mode; a byte budget's rate is solved
        for it."""
        opt = self.optimizer
        options, replicate = opt.options, opt.replicate
        if not self._planned and replicate.size == 1:
            name = opt.exchange.replicator.name
            how = ("torch's AdamW step" if opt.adamw_only else "the rule's dense limit" if name == DENSE
                   else f"the wire emulated (replicator={name!r})")
            logger.info("FlexDeMo: one replica, nothing crosses nodes: %s.", how)
        self._planned = self.trainable()
        fragment_of = opt.mode.assign([p for _, p in opt.param_names() if p.requires_grad])
        self.plan = build_plan(opt.param_groups, lambda p, group: opt.mode.new_state(opt.state[p], p, group),
                               bucket_cap_mb=options["bucket_cap_mb"], hook_shards=options["overlap"] == "backward",
                               fragment_of=fragment_of)
        numel = sum(local_shard(p).numel() for b in self.plan for s in b.stacks for p in s.params)
        self.dense_bytes = dense_allreduce_bytes(numel, replicate.size)
        self.parameters = sum(p.numel() for group in opt.param_groups for p in group["params"] if p.requires_grad)
        if options["budget_bytes"] is not None:
            opt.exchange.rate = budget.rate_for_bytes(self.bytes_at, options["budget_bytes"],
                                                      options["budget_min_rate"], options["budget_max_rate"])
        return self.plan

    def bytes_at(self, rate: float) -> int:
        """Inter-node bytes this rank sends per step at ``rate`` (the byte budget's equation): every step's exchange,
        or with local steps a round's (one exchange per fragment) over its ``local_steps`` steps, rounded up."""
        opt = self.optimizer
        members = getattr(opt.mode, "members", None)
        fragments = [None] if members is None else [{id(p) for p in fragment} for fragment in members]
        total = sum(
            exchange_bytes(opt.options["replicator"],
                           [tuple(local_shard(p).shape) for p in group["params"]
                            if p.requires_grad and (fragment is None or id(p) in fragment)],
                           opt.replicate.size, rate=rate, topk=None, chunk=group["compression_chunk"],
                           value_dtype=opt.options["value_dtype"])
            for fragment in fragments for group in opt.param_groups
        )
        return -(-total // opt.options["local_steps"])
