"""``progress_scale="batch"``: what a node sends of a round, lengthened per element to the R nodes' batch.

Each node's inner AdamW divides its first moment by its own gradient's second moment ``v = s + n``: the signal ``s``
(the square of the expected gradient) plus the noise ``n`` of the node's batch. AdamW on the mean gradient of R nodes,
whose noise is ``n / R``, divides by ``s + n / R``. So where noise dominates, the mean of R nodes' normalised steps is
up to sqrt(R) times shorter than the step of one AdamW on their batch, and a uniform outer step cannot lengthen the
noisy elements without overshooting the others. Here every inner step's displacement (weight decay excluded) enters
the round's pseudo-gradient multiplied, per element, by

    f = sqrt(R v / (v + (R - 1) s)),   in [1, sqrt(R)],

with ``v`` and ``s`` bias-corrected. ``s`` comes from the node's own gradients, averaged by an EMA and clipped to
``[0, v]``, from one of two products (``progress_scale_estimate``):

* ``"consecutive"`` (:class:`BatchScaled`): consecutive steps' batches are independent, so ``E[g_t * g_{t-1}] = s``
  where the weights stood still. They do not: the step between the two gradients follows the first one's noise, and
  the second answers it, so on a curved loss the product reads the signal low, and where the step oscillates it
  reads it below 0.
* ``"micro_batches"`` (:class:`MicroBatchScaled`): a step's micro-batches are independent and taken at the same
  weights, so the product of the first ones' summed gradient ``a`` and the last one's ``g - a`` has expectation
  ``w (1 - w) s`` for the share ``w`` of the first ones. The training loop reports each micro-batch's gradient,
  before clipping (:meth:`MicroBatchScaled.observe`); ``v`` is then an EMA of the same unclipped gradients' squares.

By default the EMAs' decay is the inner AdamW's ``beta2``, and with consecutive products ``v`` is AdamW's second
moment: then ``f`` is the ratio of the two AdamW steps' denominators, each an EMA of ``beta2``.
``progress_scale_decay`` gives the estimate a memory of its own: the products and ``v`` are then EMAs of that decay,
``v`` one more state tensor (:data:`SQUARES`), so ``f`` follows the signal's current share.

Where the node walks (``progress_scale_path``): by default (``"own"``) its own path stays its AdamW's. The difference,
``(f - 1)`` times each step's displacement, accumulates in ``extra_progress`` until the replica restarts from the
anchor, and the exchange counts the replica as being at ``local + extra_progress`` (:func:`positions`). Its later steps
in a round then take their gradients on a path the mean does not follow: the mean moves f times as far. With
``"lengthened"`` the difference moves the node's weights instead, so those gradients are taken where the nodes' mean
moves (up to each node's own noise, lengthened too, which the mean cancels), as in the dense mean of every step, and
the exchange counts the replica at its shard. Everything is elementwise on the parameter's device; the step count
lives on the host, as torch's AdamW keeps it.

:func:`for_option` gives the local-steps mode one object for the knobs: :class:`Unscaled` (``"none"``, every hook a
no-op, a replica's position its shard), :class:`BatchScaled` or :class:`MicroBatchScaled` (``"batch"``, the functions
below).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from ..knobs import check
from .plan import Stack, local_shard

PREV, LAG, EXTRA, SQUARES = "prev_grad", "lag_product", "extra_progress", "grad_square"
KEYS = (PREV, LAG, EXTRA, SQUARES)  # SQUARES only with a decay of the estimate's own
PER_NODE = (PREV, LAG)  # each node's own gradients, as the inner moments
Estimate = Literal["consecutive", "micro_batches"]
Path = Literal["own", "lengthened"]


def new_state(state: dict[str, Any], shard: Tensor, keys: tuple[str, ...]) -> dict[str, Any]:
    """``state`` with ``keys`` of :data:`KEYS` (float32, zero) added where missing."""
    for key in keys:
        if key not in state:
            state[key] = torch.zeros_like(shard, dtype=torch.float32)
    return state


def length_factors(v: list[Tensor], s: list[Tensor], nodes: int) -> list[Tensor]:
    """``sqrt(R v / (v + (R - 1) s))`` with ``s`` clipped to ``[0, v]``, per tensor of ``v`` and ``s``: how much longer
    AdamW's step on the mean gradient of ``nodes`` nodes is than one node's, per element (1 where ``v`` is 0)."""
    denominator = torch._foreach_clamp_min(s, 0.0)
    torch._foreach_minimum_(denominator, v)
    torch._foreach_mul_(denominator, nodes - 1)
    torch._foreach_add_(denominator, v)
    torch._foreach_clamp_min_(denominator, torch.finfo(torch.float32).tiny)  # v = 0: f below, clamped to 1
    f = torch._foreach_mul(v, nodes)
    torch._foreach_div_(f, denominator)
    torch._foreach_sqrt_(f)
    torch._foreach_clamp_min_(f, 1.0)  # s <= v makes f >= 1: only rounding and v = 0 reach the clamp
    return f


def accumulate(stacks: list[Stack], nodes: int, decay: float | None = None, walk: bool = False) -> None:
    """After the inner AdamW step: update the estimate's EMAs with this step's gradient and add ``(f - 1)`` times the
    step's displacement to ``extra_progress`` (``walk``: to the shard), for every shard with a gradient (foreach, one
    pass per stack and step count). ``decay``: the EMAs' (None: the inner AdamW's ``beta2``, whose second moment is
    ``v``)."""
    for stack in stacks:
        for t, params, grads, states in by_step(stack):
            _accumulate(grads, states, stack.group, t, nodes, decay, targets(params, states, walk))


def targets(params: list[Tensor], states: list[dict[str, Any]], walk: bool) -> list[Tensor]:
    """What the lengthening moves: the parameters' local shards where the node walks its lengthened steps
    (``walk``), else their ``extra_progress``."""
    return [local_shard(p) for p in params] if walk else [state[EXTRA] for state in states]


def by_step(stack: Stack) -> list[tuple[int, list[Tensor], list[Tensor], list[dict[str, Any]]]]:
    """``stack``'s shards with a gradient, grouped by their step count (on the host, as torch's AdamW keeps it): each
    group's count, parameters, float32 gradients and states."""
    groups: dict[int, tuple[list[Tensor], list[Tensor], list[dict[str, Any]]]] = {}
    for p, state in zip(stack.params, stack.states):
        if p.grad is not None:
            params, grads, states = groups.setdefault(int(state["step"].item()), ([], [], []))
            params.append(p)
            grads.append(local_shard(p.grad).float())
            states.append(state)
    return [(t, *group) for t, group in groups.items()]


def _ema(averages: list[Tensor], a: list[Tensor], b: list[Tensor], decay: float) -> None:
    torch._foreach_mul_(averages, decay)
    torch._foreach_addcmul_(averages, a, b, value=1 - decay)


def _accumulate(grads: list[Tensor], states: list[dict[str, Any]], group: dict[str, Any], t: int, nodes: int,
                decay: float | None, into: list[Tensor]) -> None:
    beta2 = group["betas"][1]
    prev, lag = ([state[key] for state in states] for key in (PREV, LAG))
    beta = beta2 if decay is None else decay
    if decay is not None:  # the estimate's own second moment, as AdamW keeps its
        _ema([state[SQUARES] for state in states], grads, grads, decay)
    if t >= 2:
        _ema(lag, grads, prev, beta)
    torch._foreach_copy_(prev, grads)
    if t < 2:
        return
    own = (torch._foreach_div([state["exp_avg_sq"].float() for state in states], 1 - beta2**t) if decay is None
           else torch._foreach_div([state[SQUARES] for state in states], 1 - decay**t))
    lengthen(states, group, t, length_factors(own, torch._foreach_div(lag, 1 - beta ** (t - 1)), nodes), into)


def lengthen(states: list[dict[str, Any]], group: dict[str, Any], t: int, f: list[Tensor], into: list[Tensor]) -> None:
    """Add ``(f - 1)`` times the inner AdamW step ``t``'s displacement (weight decay excluded) of each state's
    parameter to ``into`` (:func:`targets`); ``f`` is consumed."""
    beta1, beta2 = group["betas"]
    v = torch._foreach_div([state["exp_avg_sq"].float() for state in states], 1 - beta2**t)
    torch._foreach_sqrt_(v)
    torch._foreach_add_(v, group["eps"])
    displacement = torch._foreach_div([state["exp_avg"].float() for state in states], 1 - beta1**t)
    torch._foreach_div_(displacement, v)
    torch._foreach_sub_(f, 1.0)
    torch._foreach_addcmul_(into, displacement, f, value=-group["lr"])


def positions(stack: Stack) -> list[Tensor]:
    """Where the exchange counts each replica: its local shard plus the extra progress."""
    return torch._foreach_add(stack.shards(), [state[EXTRA] for state in stack.states])


def restart(stacks: list[Stack]) -> None:
    """The replica restarts from the anchor: nothing extra yet."""
    for stack in stacks:
        for state in stack.states:
            state[EXTRA].zero_()


class Unscaled:
    """``progress_scale="none"``: a node sends its own progress; no state, the exchange counts a replica at its
    shard."""

    per_node: tuple[str, ...] = ()  # state a node keeps of its own gradients (cleaned where non-finite)

    def new_state(self, state: dict[str, Any], shard: Tensor) -> dict[str, Any]:
        return state

    def observe(self, stacks: list[Stack], *, last: bool) -> None:
        """After each micro-batch's backward (read by ``progress_scale_estimate="micro_batches"`` only)."""

    def after_inner(self, stacks: list[Stack]) -> None:
        """After each inner AdamW step."""

    def positions(self, stack: Stack) -> list[Tensor]:
        """Where the exchange counts each replica of ``stack``."""
        return stack.shards()

    def restart(self, stacks: list[Stack]) -> None:
        """The replicas restart from the anchor."""


class BatchScaled(Unscaled):
    """``progress_scale="batch"`` among ``nodes`` nodes, its estimate's EMAs of ``decay`` (None: the inner AdamW's
    ``beta2``), the node walking its own path or the lengthened one (``path``; the module docstring)."""

    def __init__(self, nodes: int, decay: float | None = None, path: Path = "own") -> None:
        self.nodes, self.decay, self.walk = nodes, decay, path == "lengthened"
        self.per_node = PER_NODE if decay is None else (*PER_NODE, SQUARES)

    def new_state(self, state: dict[str, Any], shard: Tensor) -> dict[str, Any]:
        return new_state(state, shard, self.per_node if self.walk else (*self.per_node, EXTRA))

    def after_inner(self, stacks: list[Stack]) -> None:
        accumulate(stacks, self.nodes, self.decay, self.walk)

    def positions(self, stack: Stack) -> list[Tensor]:
        return stack.shards() if self.walk else positions(stack)

    def restart(self, stacks: list[Stack]) -> None:
        if not self.walk:
            restart(stacks)


class MicroBatchScaled(BatchScaled):
    """``progress_scale="batch"`` with ``progress_scale_estimate="micro_batches"``: ``s`` from the products of a step's
    micro-batches, which :meth:`observe` reads before the gradients are clipped (the module docstring). The first
    micro-batches' gradient waits in one float32 buffer per shard until the step's last micro-batch."""

    def __init__(self, nodes: int, decay: float | None = None, path: Path = "own") -> None:
        super().__init__(nodes, decay, path)
        self.per_node = (LAG, SQUARES)
        self.first: dict[int, Tensor] = {}  # id(parameter) -> the step's first micro-batches' gradient
        self.held: set[int] = set()  # the parameters whose gradient self.first holds for this step
        self.parts = 0  # micro-batches observed in this step before its last
        self.observed = False  # the step's last micro-batch was observed

    def observe(self, stacks: list[Stack], *, last: bool) -> None:
        """A micro-batch's gradient has been added to the parameters' (reduced inside the node, not yet clipped).
        Before the step's last: the sum so far waits. At the last: the product of that sum and the rest, scaled to
        ``s``, and the gradient's square enter the EMAs."""
        if not last:
            shards = [(p, local_shard(p.grad)) for stack in stacks for p in stack.params if p.grad is not None]
            check(bool(shards), "progress_scale_estimate", "micro_batches", "a gradient after every micro-batch: none "
                  "was reduced before the step's last micro-batch; reduce inside the node after each one (Accelerate's "
                  "sync_each_batch=True, as FlexDeMoTrainer sets it)")
            for p, grad in shards:
                self.first.setdefault(id(p), torch.empty_like(grad, dtype=torch.float32)).copy_(grad)
                self.held.add(id(p))
            self.parts += 1
            return
        check(self.parts > 0, "progress_scale_estimate", "micro_batches", "two micro-batches or more per step "
              "(gradient_accumulation_steps >= 2, observed before the last one), or progress_scale_estimate="
              "'consecutive'")
        w = self.parts / (self.parts + 1)  # the first micro-batches' share of the step's gradient
        for stack in stacks:
            decay = stack.group["betas"][1] if self.decay is None else self.decay
            for _, params, grads, states in by_step(stack):  # no gradient before the last micro-batch: a = 0
                first = [self.first[id(p)] if id(p) in self.held else torch.zeros_like(g)
                         for p, g in zip(params, grads)]
                rest = torch._foreach_sub(grads, first)
                torch._foreach_div_(rest, w * (1 - w))
                _ema([state[LAG] for state in states], first, rest, decay)
                _ema([state[SQUARES] for state in states], grads, grads, decay)
        self.parts, self.observed = 0, True
        self.held.clear()

    def after_inner(self, stacks: list[Stack]) -> None:
        check(self.observed, "progress_scale_estimate", "micro_batches", "a step whose micro-batches were observed: "
              "call FlexDeMo.observe_micro_batch(last=...) after each micro-batch's backward, before clipping "
              "(FlexDeMoTrainer does), or progress_scale_estimate='consecutive'")
        self.observed = False
        for stack in stacks:
            decay = stack.group["betas"][1] if self.decay is None else self.decay
            for t, params, _, states in by_step(stack):  # t products observed, one per step
                own, s = ([state[key] for state in states] for key in (SQUARES, LAG))
                f = length_factors(torch._foreach_div(own, 1 - decay**t), torch._foreach_div(s, 1 - decay**t),
                                   self.nodes)
                lengthen(states, stack.group, t, f, targets(params, states, self.walk))


def for_option(value: Literal["none", "batch"], nodes: int, decay: float | None = None,
               estimate: Estimate = "consecutive", path: Path = "own") -> Unscaled:
    """The object for ``progress_scale=value`` among ``nodes`` nodes (``decay``: ``progress_scale_decay``,
    ``estimate``: ``progress_scale_estimate``, ``path``: ``progress_scale_path``)."""
    if value != "batch":
        return Unscaled()
    return (MicroBatchScaled if estimate == "micro_batches" else BatchScaled)(nodes, decay, path)
