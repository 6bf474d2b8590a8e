"""``local_steps=1`` (``preset="step-wise"``): FlexDeMo's compressed momentum exchange every step.

Per step and per parameter shard (``g`` already averaged over the node by FSDP):

1. momentum ``delta <- beta * delta + lr * g`` (``momentum="lr"``, DeMo) or ``+ (1 - beta) * g`` (``"ema"``),
   or ``+`` AdamW's first moment ``m`` of this replica's ``g`` (``"avg"``) or its direction ``m / (sqrt(v) + eps)``
   (``"adam"``, the default: without compression and with ``update="sgd"`` this is AdamW)
2. the replicator selects what travels: by default (``"demo"``) the largest ``compression_rate`` of each DCT
   block's coefficients (:mod:`hf_flexdemo.wire.replicators`)
3. error feedback ``delta <- delta - alpha * IDCT(sent)`` (``alpha = compression_feedback``)
4. one collective over the replicate group carries every shard's payload
5. ``Q`` = the decode of all replicas' payloads, bit-identical on every replica
6. decoupled weight decay and the update: ``p <- p - lr * sign(Q)`` (``"sign"``), SGD on ``Q`` (``"sgd"``, the
   default), AdamW fed with ``Q`` as its gradient (``"adamw"``), or AdamW without its first moment
   (``"rmsprop"``) (:mod:`hf_flexdemo.optim.functional`)

Steps 1-5 are the :class:`~hf_flexdemo.optim.exchange.ExchangeEngine`'s transaction; step 6 is the stack's update.

When the exchange happens (``overlap``):

* ``"none"``: ``step()`` compresses every shard and exchanges them in one collective;
* ``"backward"``: a bucket is compressed and its collective started from the hook FSDP2 fires once the bucket's
  node-averaged shards are final, so the network carries it while backward computes the rest; ``step()`` waits,
  decodes and applies (bit-identical to ``"none"``; only the collectives are split);
* ``"delayed"``: ``step()`` applies the previous step's consensus and starts this step's exchange, which then
  travels during the next forward and backward (one step of staleness, as in Psyche).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.profiler import record_function

from ..wire.replicators import Replicator
from .exchange import MOMENT_KEYS
from .mode import Mode
from .plan import Bucket, new_state, stack_rows


class StepWise(Mode):
    """The step-wise mode of a :class:`~hf_flexdemo.optim.optimizer.FlexDeMo` (see the module docstring)."""

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer)
        self.overlap = optimizer.options["overlap"]
        self.timed = optimizer.options["budget_fraction"] is not None  # a time budget's fraction rides along
        self._next_launch = 0  # buckets are launched in plan order, so every replica issues the same sequence
        self._hooks: list[Any] = []
        self._hooked: tuple[int, ...] = ()  # the parameters hooked
        self._planned: list[Bucket] | None = None  # the plan _bucket_of indexes
        self._bucket_of: dict[int, Bucket] = {}
        # hooked from the start, so that the first backward already starts its buckets' exchanges
        self._hook([p for group in optimizer.param_groups for p in group["params"] if p.requires_grad])

    def new_state(self, state: dict[str, Any], p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        return new_state(state, p, group)

    def assign(self, params: list[Tensor]) -> None:
        """A new plan for the trainable ``params``: hook them (``overlap="backward"``), replacing earlier hooks."""
        self._hook(params)

    def _hook(self, params: list[Tensor]) -> None:
        """``overlap="backward"``: a post-accumulate-grad hook on every FSDP2 shard in ``params`` (FSDP2 calls it once
        the shard's node-averaged gradient is final). The same parameters keep their hooks (a plan built during the
        first backward leaves them in place)."""
        hooked = tuple(id(p) for p in params if isinstance(p, DTensor))
        if self.overlap != "backward" or hooked == self._hooked:
            return
        self.remove_hooks()
        self._hooked = hooked
        method = weakref.WeakMethod(self.gradient_ready)  # hooks must not keep the optimizer alive

        def hook(param: Tensor) -> None:
            if (ready := method()) is not None:
                ready(param)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in params if isinstance(p, DTensor)]

    def remove_hooks(self) -> None:
        """Unhook from the parameters (the mode is being replaced)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks, self._hooked = [], ()

    @torch.no_grad()
    def gradient_ready(self, param: Tensor) -> None:
        """FSDP2's hook for ``param``: start the exchange of every complete bucket, in plan order."""
        plan = self.optimizer.exchange_plan()
        if self._planned is not plan:
            self._planned, self._bucket_of = plan, {id(p): bucket for bucket in plan for p in bucket.params}
        bucket = self._bucket_of[id(param)]
        if bucket.launched or id(param) in bucket.ready:
            names = [n for n, p in self.optimizer.param_names() if p is param]
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

    def _launch(self, buckets: list[Bucket]) -> None:
        """Compress ``buckets`` (consecutive in the plan) and start their exchange, in one collective."""
        for bucket in buckets:
            bucket.launched = True
        self._next_launch += len(buckets)
        self.optimizer.exchange.launch([s for b in buckets for s in b.stacks], step=self.optimizer.steps,
                                       timed=self.timed)

    def step(self, plan: list[Bucket]) -> None:
        engine = self.optimizer.exchange
        if self.overlap == "delayed":
            self.finish(plan, None)
            self._launch(plan)  # travels during the next forward and backward
            return
        if self._next_launch < len(plan):
            self._launch(plan[self._next_launch:])  # what backward has not started (everything, for "none")
        engine.land()

    def end_step(self, plan: list[Bucket]) -> None:
        for bucket in plan:
            bucket.launched = False
            bucket.ready.clear()
        self._next_launch = 0

    def finish(self, plan: list[Bucket], final: Replicator | None) -> None:
        """``overlap="delayed"``: commit and apply the previous step's consensus, or skip it (``final`` is unused:
        replicas agree once it is applied)."""
        engine = self.optimizer.exchange
        if not engine.in_flight and engine.held is None:
            return
        held = engine.take_held()
        stacks = [s for b in plan for s in b.stacks]
        for stack, lr in zip(stacks, held["lrs"]):
            stack.momentum, stack.lr = stack_rows(stack.states, "pending_delta"), lr
            kept = [key for key in MOMENT_KEYS if "pending_" + key in stack.states[0]]
            stack.moments = {key: [s["pending_" + key] for s in stack.states] for key in kept} or None
        if held["skip"]:
            engine.skip(held["step"], held["own_nonfinite"])
            for stack in stacks:
                stack.discard()
        else:
            for stack in stacks:
                with record_function("FlexDeMo::apply"):
                    stack.commit(spent=engine.replicator.spends_momentum)
                    stack.apply(stack_rows(stack.states, "pending_update"), stack.lr, engine.workspace)
        engine.drop_held_state(stacks)
