"""``local_steps=H > 1``: H local AdamW steps per node, then one compressed exchange of the pseudo-gradient.

DiLoCo and SparseLoCo between nodes, FSDP2 inside them. Per step and parameter shard:

* inner step: torch's AdamW (``torch.optim.adamw.adamw``, foreach) on this node's shard with the group's
  ``lr`` (the Trainer's schedule reaches it through ``param_groups``), ``betas``, ``eps``, ``weight_decay``;
  nothing crosses nodes, no collective and no host sync;
* every H-th step, after the inner step: the pseudo-gradient ``anchor - local`` enters error feedback,
  ``delta <- compression_decay * delta + (anchor - local)``; the replicator compresses and exchanges it in one
  collective like any momentum (:class:`~hf_flexdemo.optimizer._InFlight`: rate, blocks, DCT, value type,
  the non-finite flag, the skip decision); the outer rule moves the anchor by the decoded mean ``Q``,
  ``anchor <- anchor - outer_lr * Q`` (SparseLoCo) or with Nesterov momentum ``outer_momentum`` (DiLoCo),
  and every replica restarts from it (``local <- anchor``): replicas are bit-identical after each exchange.

Streaming (``overlap="delayed"``, Streaming DiLoCo's one-round-late application): the round's exchange is
started at its end and travels while the next round's H inner steps compute; at the end of that round it is
waited for (a link that carries it within a round is never waited on) and ``Q`` moves the anchor then. So
round r's pseudo-gradient, measured from the anchor round r started at, reaches the anchor at round r+1's
end, and round r+1 starts from an anchor without round r's progress. Replicas still restart from one anchor
at every round's end and stay bit-identical; ``state_dict`` holds the exchange in flight as
``pending_delta``/``pending_update`` (4 more bytes per parameter until the round ends).

``compression_decay`` is reused as the error-feedback decay: ``delta`` is the same buffer in the same role
(what compression held back, decayed once per exchange), and its default 0.999 is all but the plain error
feedback the probe measured (DESIGN.md section 8). A skipped round (a non-finite pseudo-gradient on some
rank) keeps the anchor, ``delta`` and the outer momentum, restarts every replica from the anchor, and zeroes
the non-finite entries of the inner moments.

State per parameter (float32 unless noted): ``exp_avg``, ``exp_avg_sq`` (the parameter's dtype) and ``step``
(on the CPU), the inner AdamW's; ``anchor``, the parameters at the last exchange; ``delta``, the error
feedback; ``outer_avg``, the Nesterov buffer (only with ``outer_momentum > 0``). The phase within a round is
the optimizer's ``steps`` modulo H; mid-round, ``state_dict`` also holds each rank's ``local`` shard, since a
Trainer checkpoint keeps one replica's parameters and the others' differ until the round ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.optim.adamw import adamw

from .plan import Bucket, Stack, local_shard, stack_rows

if TYPE_CHECKING:
    from .optimizer import FlexDeMo

FLOAT32_KEYS = ("anchor", "outer_avg")  # besides delta, which the optimizer already keeps in float32
LOCAL_KEY = "local"  # mid-round state_dict only: this rank's parameter shard
PENDING_KEYS = ("pending_delta", "pending_update")  # overlap="delayed", between the hold and the round's end


def outer_step(anchor: Tensor, q: Tensor, outer_avg: Tensor | None, *, lr: float, momentum: float) -> None:
    """The outer rule on the ``(P, *shape)`` anchor: ``anchor <- anchor - lr * Q``, or with Nesterov momentum
    (torch's SGD, no dampening): ``m <- momentum * m + Q``, ``anchor <- anchor - lr * (Q + momentum * m)``."""
    if outer_avg is None:
        anchor.sub_(q, alpha=lr)
        return
    outer_avg.mul_(momentum).add_(q)
    anchor.sub_(q.add_(outer_avg, alpha=momentum), alpha=lr)


class LocalSteps:
    """The local-steps mode of a :class:`~hf_flexdemo.optimizer.FlexDeMo` (see the module docstring)."""

    def __init__(self, optimizer: FlexDeMo) -> None:
        self.optimizer = optimizer
        self.every = optimizer.options["local_steps"]
        self.lr = optimizer.options["outer_lr"]
        self.momentum = optimizer.options["outer_momentum"]
        self.streaming = optimizer.options["overlap"] == "delayed"

    def new_state(self, state: dict[str, Any], p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """``p``'s state, filled on first use: the inner AdamW's moments, the anchor (``p`` now), the error
        feedback and, with outer momentum, its buffer."""
        if not state:
            shard = local_shard(p).detach()
            state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU, as torch's AdamW keeps it
            state["exp_avg"] = torch.zeros_like(shard)
            state["exp_avg_sq"] = torch.zeros_like(shard)
            state["anchor"] = shard.to(torch.float32, copy=True)
            state["delta"] = torch.zeros_like(shard, dtype=torch.float32)
            if self.momentum:
                state["outer_avg"] = torch.zeros_like(shard, dtype=torch.float32)
        return state

    def step(self, plan: list[Bucket]) -> None:
        """One inner step; at the end of a round, the exchange and the outer step."""
        stacks = [stack for bucket in plan for stack in bucket.stacks]
        self._inner(stacks)
        if (self.optimizer.steps + 1) % self.every:
            return
        if self.streaming:
            self._end_round_streaming(stacks)
            return
        opt = self.optimizer
        opt._in_flight.launch(stacks, kept=opt._kept, step=opt.steps, timing=[], stats=opt._stats,
                              momentum=self.pseudo_gradient)
        skipped = opt._resolve_and_apply(rule=self._outer)
        self._restart(stacks, clean=skipped)

    def _end_round_streaming(self, stacks: list[Stack]) -> None:
        """``overlap="delayed"``: the previous round's exchange, in flight during this round, is waited for and
        its consensus applied to the anchor; this round's pseudo-gradient (from the anchor the round started at)
        starts its exchange, which the next round's inner steps overlap; every replica restarts from the anchor."""
        opt = self.optimizer
        if opt._in_flight.exchanges:
            opt._hold()  # the consensus and error feedback of the last round, as state (also what state_dict saves)
        pending, opt._pending = opt._pending, None
        if pending is not None:
            for stack in stacks:
                stack.momentum = stack_rows(stack.states, "pending_delta")
                if pending["skip"]:
                    stack.discard()
                else:
                    stack.commit(spent=False)
            if pending["skip"]:
                opt._skip(pending["step"], pending["own_nonfinite"])
        opt._in_flight.launch(stacks, kept=opt._kept, step=opt.steps, timing=[], stats=opt._stats,
                              momentum=self.pseudo_gradient)
        for stack in stacks:
            if pending is not None and not pending["skip"]:
                self._outer(stack, stack_rows(stack.states, "pending_update"))
            for state in stack.states:
                for key in PENDING_KEYS:
                    state.pop(key, None)
        self._restart(stacks, clean=True)  # this round's own verdict arrives a round late: clean the moments now

    @staticmethod
    def _restart(stacks: list[Stack], *, clean: bool) -> None:
        """Every replica continues from the anchor; ``clean``: the inner moments' non-finite entries become 0."""
        for stack in stacks:
            torch._foreach_copy_(stack.shards(), list(stack_rows(stack.states, "anchor").unbind(0)))
            if clean:
                for state in stack.states:
                    for key in ("exp_avg", "exp_avg_sq"):
                        torch.nan_to_num_(state[key], nan=0.0, posinf=0.0, neginf=0.0)

    def _inner(self, stacks: list[Stack]) -> None:
        """torch's AdamW on every shard with a gradient, one foreach call per parameter group."""
        groups: dict[int, tuple[dict[str, Any], list[list]]] = {}
        for stack in stacks:
            lists = groups.setdefault(id(stack.group), (stack.group, [[], [], [], [], []]))[1]
            for p, state in zip(stack.params, stack.states):
                if p.grad is not None:
                    for into, item in zip(lists, (local_shard(p), local_shard(p.grad), state["exp_avg"],
                                                  state["exp_avg_sq"], state["step"])):
                        into.append(item)
        for group, (params, grads, exp_avgs, exp_avg_sqs, steps) in groups.values():
            if params:
                (beta1, beta2) = group["betas"]
                adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, amsgrad=False, beta1=beta1,
                      beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                      maximize=False)

    @staticmethod
    def pseudo_gradient(stack: Stack) -> Tensor:
        """The candidate error feedback ``decay * delta + (anchor - local)``, built in the stack's spare buffer."""
        out = torch.mul(stack.delta, stack.group["compression_decay"], out=stack.take_spare())
        torch._foreach_sub_(list(out.unbind(0)), stack.shards())
        return out.add_(stack_rows(stack.states, "anchor"))

    def _outer(self, stack: Stack, q: Tensor) -> None:
        """Move the stack's anchor by its consensus ``Q``."""
        states = stack.states
        outer_avg = stack_rows(states, "outer_avg") if self.momentum else None
        outer_step(stack_rows(states, "anchor"), q, outer_avg, lr=self.lr, momentum=self.momentum)

    @contextmanager
    def anchored(self) -> Iterator[None]:
        """Mid-round, the parameters hold the anchor inside the block and this node's local values again after it
        (restored bit for bit); at a round's end they already are the anchor."""
        opt = self.optimizer
        params = [p for group in opt.param_groups for p in group["params"] if "anchor" in opt.state.get(p, {})]
        if not opt.steps % self.every or not params:
            yield
            return
        shards = [local_shard(p) for p in params]
        held = [shard.detach().clone() for shard in shards]
        with torch.no_grad():
            torch._foreach_copy_(shards, [opt.state[p]["anchor"] for p in params])
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(shards, held)

    def save(self, state: dict[str, Any]) -> None:
        """Mid-round, add each parameter's local shard to ``state`` (a ``state_dict``; ``self.state`` is untouched)."""
        opt = self.optimizer
        if not opt.steps % self.every:
            return
        params = [p for group in opt.param_groups for p in group["params"]]
        for index, saved in state["state"].items():
            state["state"][index] = {**saved, LOCAL_KEY: local_shard(params[index]).detach().clone()}

    def load(self, state_dict: dict[str, Any]) -> None:
        """Restore the local shards a mid-round ``state_dict`` holds into the parameters."""
        opt = self.optimizer
        params = [p for group in opt.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            opt.state[params[index]].pop(LOCAL_KEY, None)
            if LOCAL_KEY in saved:
                with torch.no_grad():
                    local_shard(params[index]).copy_(saved[LOCAL_KEY])
