"""``local_steps=H > 1``: H local AdamW steps per node, then one compressed exchange of the pseudo-gradient.

DiLoCo and SparseLoCo between nodes, FSDP2 inside them. Per step and parameter shard:

* inner step: torch's AdamW (``torch.optim.adamw.adamw``, foreach) on this node's shard with the group's
  ``lr`` (the Trainer's schedule reaches it through ``param_groups``), ``betas``, ``eps``, ``weight_decay``;
  nothing crosses nodes, no collective and no host sync;
* every H-th step, after the inner step: the pseudo-gradient ``anchor - local`` enters error feedback,
  ``delta <- feedback_decay * delta + (anchor - local)``; the replicator compresses and exchanges it in one
  collective like any momentum (:class:`~hf_flexdemo.optim.exchange.ExchangeEngine`: rate, blocks, transform, value
  type, the non-finite flag, the skip decision); the outer rule moves the anchor by the decoded mean ``Q``,
  ``anchor <- anchor - outer_lr * Q`` (SparseLoCo) or with Nesterov momentum ``outer_momentum`` (DiLoCo),
  and every replica restarts from it (``local <- anchor``): replicas are bit-identical after each exchange.

Streaming (``overlap="delayed"``, Streaming DiLoCo): a round's exchange starts at its end and the replicas go on
from where they are; it lands in the ``outer_delay``-th step (tau) after it, before that step's inner update: ``Q``
moves the anchor, the progress of the tau - 1 steps between (``local at the start - local now``) joins the error
feedback, every replica restarts from the anchor, and the step's gradient, computed where the replica was, updates
it. So the payload travels during tau - 1 whole steps and a forward and backward, replicas are bit-identical at
every landing (the drift check runs there), and no step's progress is lost: the eager steps' share travels with the
next round, as everything compression holds back does (docs/how-it-works.md says why replicas do not restart from
the anchor at once). ``state_dict`` holds an exchange in flight as ``pending_delta``/``pending_update`` (4 more
bytes per parameter until it lands).

Fragments (``outer_fragments=F > 1``, streaming only, Streaming DiLoCo's; 4 by default): a round's whole payload may
need longer on a slow link than the tau steps it has. So the parameters are split into F fragments, balanced by size
(:func:`partition` of the full element counts, the same on every rank), whose rounds are staggered: fragment f's
ends after the steps ``done`` with ``done % H == (f + 1) * H / F % H``, and only its stacks are exchanged then and
landed tau steps later (the landing as above, its drift check on that fragment alone). Each step then sends about
1/F of the payload, the link is busy evenly, every fragment still syncs every H steps, and with ``tau <= H / F`` one
fragment's exchange at most is in flight. Every anchor starts at step 0, so fragment f's first round is (f + 1) * H
/ F steps, shorter than H but for the last. Replicas differ on some fragment at every step after the first, so the
consensus parameters are the anchors (see below), and a whole round's bytes equal F = 1's plus the F - 1 more
collectives' non-finite flags.

The end of a run (:meth:`LocalSteps.finish`, from ``FlexDeMo.finish``): the exchange in flight lands, then one final
round of every fragment in one collective (on a wire that lands a round an exchange late, ``replicator="owner"``,
two), and every replica restarts from the anchor, which then holds every step trained. Weights loaded from outside
become the anchor (:meth:`LocalSteps.adopt`).

On a wire that lands a round an exchange late, each replica restarts from the anchor moved by its own share of the
round in flight (:mod:`hf_flexdemo.optim.own_share`), so that it does not walk that round again; replicas then
differ between exchanges in the non-streamed mode too, and the consensus is the anchor.

``feedback_decay`` decays what compression held back once per exchange. A skipped round (a non-finite
pseudo-gradient on some rank) keeps the anchor, ``delta`` and the outer momentum, restarts every replica from the
anchor, and zeroes the non-finite entries of the inner moments and of ``delta``. Streaming, a skipped landing also
drops that step's gradient (computed where a replica was non-finite) and restarts every fragment, not just its own:
a non-finite value spreads through the next forward to every parameter, and through a landing's progress term into
``delta``; otherwise every later round would be skipped.

State per parameter (float32 unless noted): ``exp_avg``, ``exp_avg_sq`` (the parameter's dtype) and ``step``
(on the CPU), the inner AdamW's; ``anchor``, the parameters at the last exchange; ``delta``, the error
feedback; ``outer_avg``, the Nesterov buffer (only with ``outer_momentum > 0``); with ``progress_scale="batch"``
the gradient statistics and the extra progress of :mod:`hf_flexdemo.optim.progress_scale`. The phase within a round is
the optimizer's ``steps`` modulo H; where replicas differ (mid-round, or streaming before a landing),
``state_dict`` also holds each rank's ``local`` shard, since a Trainer checkpoint keeps the anchor
(:meth:`~hf_flexdemo.optim.optimizer.FlexDeMo.consensus_parameters`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from . import local_shards, own_share, progress_scale
from .mode import Mode
from .one_replica import adamw_state, adamw_step
from .plan import Bucket, Stack, local_shard, stack_rows

if TYPE_CHECKING:
    from ..wire.replicators import Replicator
    from .optimizer import FlexDeMo

FLOAT32_KEYS = ("anchor", "outer_avg", own_share.KEY, *progress_scale.KEYS)  # besides delta (the optimizer's)


def partition(sizes: Sequence[int], fragments: int) -> list[int]:
    """Each item's fragment, balanced by size: the largest first (ties: the earlier) into the least-loaded fragment
    (ties: the lowest)."""
    loads, where = [0] * fragments, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        where[i] = min(range(fragments), key=lambda f: (loads[f], f))
        loads[where[i]] += sizes[i]
    return where


def fragments_for(wanted: int, local_steps: int, outer_delay: int, tensors: int) -> int:
    """The fragments a round runs in: ``wanted`` where there are at least as many trainable tensors, else the largest
    divisor of ``local_steps`` not above ``tensors`` (a fragment is never empty; fewer fragments leave the delay more
    room)."""
    if tensors >= wanted:
        return wanted
    return max(f for f in range(1, max(tensors, 1) + 1) if local_steps % f == 0 and outer_delay <= local_steps // f)


def outer_step(anchor: Tensor, q: Tensor, outer_avg: Tensor | None, *, lr: float, momentum: float) -> None:
    """The outer rule on the ``(P, *shape)`` anchor: ``anchor <- anchor - lr * Q``, or with Nesterov momentum
    (torch's SGD, no dampening): ``m <- momentum * m + Q``, ``anchor <- anchor - lr * (Q + momentum * m)``."""
    if outer_avg is None:
        anchor.sub_(q, alpha=lr)
        return
    outer_avg.mul_(momentum).add_(q)
    anchor.sub_(q.add_(outer_avg, alpha=momentum), alpha=lr)


class LocalSteps(Mode):
    """The local-steps mode of a :class:`~hf_flexdemo.optim.optimizer.FlexDeMo` (see the module docstring)."""

    anchors = True

    def __init__(self, optimizer: FlexDeMo) -> None:
        super().__init__(optimizer)
        self.every = optimizer.options["local_steps"]
        self.lr = optimizer.options["outer_lr"]
        self.momentum = optimizer.options["outer_momentum"]
        self.streaming = optimizer.options["overlap"] == "delayed"
        self.delay = optimizer.options["outer_delay"]
        self.fragments = optimizer.options["outer_fragments"]
        self.scale = progress_scale.for_option(optimizer.options["progress_scale"], optimizer.replicate.size,
                                               optimizer.options["progress_scale_decay"],
                                               optimizer.options["progress_scale_estimate"],
                                               optimizer.options["progress_scale_path"])
        self.slot = self.every // self.fragments  # steps between two fragments' round ends
        self.members: list[list[Tensor]] = [[] for _ in range(self.fragments)]  # each fragment's parameters
        self.synced = False  # finish() or adopt() left every replica at the anchor, until the next step
        self._warned = False

    def assign(self, params: list[Tensor]) -> Callable[[Tensor], int] | None:
        """Split the trainable ``params`` into the fragments (:func:`partition` of their full element counts) and
        return each one's fragment for the plan (``None``: one). Parameters rather than stacks, so that every rank
        splits alike: a node's ranks stack their shards differently (uneven or empty shards), while the drift
        check's per-parameter verdict is agreed across the node. Fewer trainable tensors than fragments run in
        fewer fragments (:func:`fragments_for`), with a warning: no fragment is ever empty."""
        wanted = self.optimizer.options["outer_fragments"]
        self.fragments = fragments_for(wanted, self.every, self.delay, len(params))
        self.slot = self.every // self.fragments
        if self.fragments < wanted and not self._warned:
            self._warned = True
            warnings.warn(f"FlexDeMo: outer_fragments={wanted} with {len(params)} trainable tensor(s); the rounds run "
                          f"in {self.fragments} fragment(s) (a fragment holds whole tensors and is never empty).",
                          stacklevel=5)
        if self.fragments == 1:
            self.members = [list(params)]
            return None
        where = partition([p.numel() for p in params], self.fragments)
        self.members = [[p for p, f in zip(params, where) if f == fragment] for fragment in range(self.fragments)]
        fragment_of = {id(p): f for p, f in zip(params, where)}
        return lambda p: fragment_of[id(p)]

    def fragment_at(self, done: int) -> int:
        """The fragment whose round ends after ``done`` steps (``done`` a multiple of the slot): fragment f's at
        ``done % H == (f + 1) * H / F % H``."""
        return ((done % self.every) // self.slot - 1) % self.fragments

    @property
    def lags(self) -> bool:
        """Whether the wire in use lands a round's consensus with the exchange after it (replicas then lean on their
        own share of the round in flight)."""
        return self.optimizer.exchange.replicator.lag > 0

    def new_state(self, state: dict[str, Any], p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """``p``'s state, filled where missing: the inner AdamW's moments, the anchor (``p`` now), the error
        feedback, with outer momentum its buffer, and on a lagging wire the own share (a single replica's state
        lacks all but the moments)."""
        adamw_state(state, p)
        self.scale.new_state(state, local_shard(p))
        if "anchor" not in state:
            shard = local_shard(p).detach()
            state["anchor"] = shard.to(torch.float32, copy=True)
            state["delta"] = torch.zeros_like(shard, dtype=torch.float32)
        if self.momentum and "outer_avg" not in state:
            state["outer_avg"] = torch.zeros_like(state["anchor"])
        if self.lags:
            own_share.new_state(state, state["anchor"])
        return state

    def observe_micro_batch(self, plan: list[Bucket], *, last: bool) -> None:
        self.scale.observe([stack for bucket in plan for stack in bucket.stacks], last=last)

    def step(self, plan: list[Bucket]) -> None:
        """One inner step; at the end of a round, the exchange and the outer step (streaming: the exchange starts
        at the round's end and lands at the start of the ``outer_delay``-th step after it; with fragments, the
        round's end of one fragment every ``local_steps / outer_fragments`` steps, its stacks only)."""
        stacks = [stack for bucket in plan for stack in bucket.stacks]
        engine, done = self.optimizer.exchange, self.optimizer.steps + 1
        self.synced = False
        if not self.streaming:
            self._inner(stacks)
            if done % self.every == 0:
                self._launch(stacks)
                skipped = engine.land(rule=self._outer)
                self._restart(stacks, clean=skipped)
                if self.lags and self.optimizer.drift_check_due():  # replicas agree here, before they lean
                    self.optimizer.check_drift()
                own_share.settle(stacks, lean=not skipped, outer_lr=self.lr)
            return
        skipped = False
        if (done - self.delay) % self.slot == 0 and (engine.in_flight or engine.held is not None):
            skipped = self._land(stacks, self.fragment_at(done - self.delay))
        if skipped:  # a replica went non-finite: so may this step's gradient and every fragment's progress since
            self._restart(stacks, clean=True)
            own_share.forget(stacks)
        else:
            self._inner(stacks)
        if done % self.slot == 0:
            stacks = [stack for stack in stacks if stack.fragment == self.fragment_at(done)]
            self._launch(stacks)  # an empty fragment (or rank) still joins the collective: every rank issues the same
            for stack in stacks:  # what was held back decays now; the progress until the exchange lands joins it
                held = stack.momentum.zero_() if engine.replicator.spends_momentum else stack.momentum
                held.mul_(stack.group["feedback_decay"])
                torch._foreach_add_(list(held.unbind(0)), self.scale.positions(stack))  # minus where it is then (_land)

    def _inner(self, stacks: list[Stack]) -> None:
        adamw_step(stacks)
        self.scale.after_inner(stacks)

    def _launch(self, stacks: list[Stack]) -> None:
        def momentum(stack: Stack) -> Tensor:
            pseudo_gradient = self.pseudo_gradient(stack)
            own_share.capture(stack, pseudo_gradient)
            return pseudo_gradient

        engine = self.optimizer.exchange
        engine.launch(stacks, step=self.optimizer.steps, momentum=momentum)
        own_share.keep_sent(stacks, lags=self.lags)

    def _land(self, stacks: list[Stack], fragment: int) -> bool:
        """Streaming, before a step's inner update: wait for the exchange in flight (or take the one ``state_dict``
        held), move the anchor by its consensus, add the inner steps' progress since it started to the error
        feedback, and restart every replica from the anchor (the step's gradient, computed where the replica was,
        then updates the anchor: one step stale, as ``overlap="delayed"`` is step-wise). Only ``fragment``'s stacks:
        the exchange's. Whether the exchange was skipped."""
        opt, engine = self.optimizer, self.optimizer.exchange
        stacks = [stack for stack in stacks if stack.fragment == fragment]
        pending = engine.take_held()  # the consensus and error feedback as state: also what state_dict saves
        for stack in stacks:
            stack.momentum = stack_rows(stack.states, "pending_delta")  # decay * (held back) + local at the start
            if pending["skip"]:
                stack.discard()
                continue
            stack.commit(spent=False)
            torch._foreach_sub_(list(stack.delta.unbind(0)), self.scale.positions(stack))  # minus where it is now
            self._outer(stack, stack_rows(stack.states, "pending_update"))
        engine.drop_held_state(stacks)
        if pending["skip"]:
            engine.skip(pending["step"], pending["own_nonfinite"])
        self._restart(stacks, clean=True)  # a non-finite round is only known now: clean the moments here
        if opt.drift_check_due():  # the one point of a round where replicas agree (on the fragment's parameters)
            opt.check_drift(None if self.fragments == 1 else self.members[fragment])
        own_share.settle(stacks, lean=not pending["skip"], outer_lr=self.lr)
        return pending["skip"]

    def finish(self, plan: list[Bucket], final: Replicator | None) -> None:
        """Land the exchange in flight (streaming), then one final round of every fragment in one collective, on
        the optimizer's wire or on ``final``'s: every replica then holds the anchor, which carries every step
        trained (what the final round's compression holds back stays in ``delta``; on a lagging wire, what the last
        round sent waits with the owners, as it would for the next exchange)."""
        engine, stacks = self.optimizer.exchange, [stack for bucket in plan for stack in bucket.stacks]
        if engine.in_flight or engine.held is not None:
            launched_at = engine.launched_at if engine.in_flight else engine.held["step"]
            self._land(stacks, self.fragment_at(launched_at + 1))
        own, rounds = engine.replicator, 1
        if final is None:
            rounds += own.lag  # a wire that lands a round later lands the final one with the exchange after it
        else:
            for stack in stacks:
                own.release(stack, engine.workspace, k=engine.kept(stack))
        with engine.using(final):
            for remaining in reversed(range(rounds)):
                self._launch(stacks)
                skipped = engine.land(rule=self._outer)
                self._restart(stacks, clean=skipped)
                own_share.settle(stacks, lean=remaining > 0 and not skipped, outer_lr=self.lr)  # the last: the anchor
        self.synced = True

    def adopt(self, plan: list[Bucket]) -> None:
        """The parameters, loaded from outside, become the anchor; the error feedback and outer momentum, which
        belong to the trajectory left, are zeroed (the inner AdamW's moments stay, as torch's optimizers keep
        their state when a model's weights are loaded)."""
        for stack in (stack for bucket in plan for stack in bucket.stacks):
            for p, state in zip(stack.params, stack.states):
                state["anchor"].copy_(local_shard(p).detach())
                state["delta"].zero_()
                if "outer_avg" in state:
                    state["outer_avg"].zero_()
            own_share.forget([stack])
            self.scale.restart([stack])
        self.synced = True

    def agreed(self, steps: int) -> bool:
        """Whether every replica's parameters are the anchor between ``step()`` calls, before step ``steps``
        (0-based): after a round's exchange; with streaming only before the first step (they agree inside the
        step that lands an exchange, where its drift check runs; with fragments, on the landed fragment only; on a
        lagging wire, where replicas lean on their own shares, likewise); and after :meth:`finish` or :meth:`adopt`,
        until the next step."""
        if self.synced or steps == 0:
            return True
        return steps % self.every == 0 and not self.streaming and not self.lags

    def _restart(self, stacks: list[Stack], *, clean: bool) -> None:
        """Every replica continues from the anchor (with no extra progress); ``clean``: the non-finite entries of the
        inner moments, of the gradient statistics ``progress_scale`` keeps and of the error feedback (streaming: the
        progress a landing adds to it) become 0."""
        cleaned = ("exp_avg", "exp_avg_sq", "delta", *self.scale.per_node)
        for stack in stacks:
            torch._foreach_copy_(stack.shards(), list(stack_rows(stack.states, "anchor").unbind(0)))
            if clean:
                for state in stack.states:
                    for key in cleaned:
                        torch.nan_to_num_(state[key], nan=0.0, posinf=0.0, neginf=0.0)
        self.scale.restart(stacks)

    def pseudo_gradient(self, stack: Stack) -> Tensor:
        """The candidate error feedback ``decay * delta + (restart point - local)``, built in the stack's spare
        buffer (streaming: ``delta + ...``, ``delta`` having decayed when its round's exchange started); the restart
        point is the anchor, on a lagging wire moved by the replica's own share."""
        decay = 1.0 if self.streaming else stack.group["feedback_decay"]
        out = torch.mul(stack.delta, decay, out=stack.take_spare())
        torch._foreach_sub_(list(out.unbind(0)), self.scale.positions(stack))
        return own_share.restart_point(stack, out.add_(stack_rows(stack.states, "anchor")), self.lr)

    def _outer(self, stack: Stack, q: Tensor) -> None:
        """Move the stack's anchor by its consensus ``Q``."""
        states = stack.states
        outer_avg = stack_rows(states, "outer_avg") if self.momentum else None
        outer_step(stack_rows(states, "anchor"), q, outer_avg, lr=self.lr, momentum=self.momentum)

    def anchored(self) -> AbstractContextManager[None]:
        """While replicas differ, the parameters hold the anchor inside the block and this node's local values
        again after it (:func:`~hf_flexdemo.optim.local_shards.anchored`); where they agree they already are the
        anchor."""
        return nullcontext() if self.agreed(self.optimizer.steps) else local_shards.anchored(self.optimizer)

    def save(self, state: dict[str, Any]) -> None:
        """While replicas differ, add each parameter's local shard to ``state`` (a ``state_dict``)."""
        if not self.agreed(self.optimizer.steps):
            local_shards.save(self.optimizer, state)

    def load(self, state_dict: dict[str, Any]) -> None:
        """Restore the local shards a mid-round ``state_dict`` holds into the parameters."""
        local_shards.load(self.optimizer, state_dict)
