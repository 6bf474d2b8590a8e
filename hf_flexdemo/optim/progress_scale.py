"""``progress_scale="batch"``: what a node sends of a round, lengthened per element to the R nodes' batch.

Each node's inner AdamW divides its first moment by its own gradient's second moment ``v = s + n``: the signal ``s``
(the square of the expected gradient) plus the noise ``n`` of the node's batch. AdamW on the mean gradient of R nodes,
whose noise is ``n / R``, divides by ``s + n / R``. So where noise dominates, the mean of R nodes' normalised steps is
up to sqrt(R) times shorter than the step of one AdamW on their batch, and a uniform outer step cannot lengthen the
noisy elements without overshooting the others. Here every inner step's displacement (weight decay excluded) enters
the round's pseudo-gradient multiplied, per element, by

    f = sqrt(R v / (v + (R - 1) s)),   in [1, sqrt(R)],

with ``v`` and ``s`` bias-corrected. ``s`` comes from the node's own gradients: consecutive steps' batches are
independent, so ``E[g_t * g_{t-1}] = s``, averaged by an EMA and clipped to ``[0, v]``. By default that EMA's decay is
the inner AdamW's ``beta2`` and ``v`` is its second moment: then ``f`` is the ratio of the two AdamW steps'
denominators, each an EMA of ``beta2``. ``progress_scale_decay`` gives the estimate a memory of its own: the products
and ``v`` are then EMAs of that decay, ``v`` one more state tensor (:data:`SQUARES`), so ``f`` follows the signal's
current share.

The node's own path stays its AdamW's. The difference, ``(f - 1)`` times each step's displacement, accumulates in
``extra_progress`` until the replica restarts from the anchor, and the exchange counts the replica as being at
``local + extra_progress`` (:func:`positions`). Everything is elementwise on the parameter's device; the step count
lives on the host, as torch's AdamW keeps it.

:func:`for_option` gives the local-steps mode one object for either value: :class:`Unscaled` (``"none"``, every hook a
no-op, a replica's position its shard) or :class:`BatchScaled` (``"batch"``, the functions below).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from .plan import Stack, local_shard

PREV, LAG, EXTRA, SQUARES = "prev_grad", "lag_product", "extra_progress", "grad_square"
KEYS = (PREV, LAG, EXTRA, SQUARES)  # SQUARES only with a decay of the estimate's own
PER_NODE = (PREV, LAG)  # each node's own gradients, as the inner moments


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


def accumulate(stacks: list[Stack], nodes: int, decay: float | None = None) -> None:
    """After the inner AdamW step: update the estimate's EMAs with this step's gradient and add ``(f - 1)`` times the
    step's displacement to ``extra_progress``, for every shard with a gradient (foreach, one pass per stack and step
    count). ``decay``: the EMAs' (None: the inner AdamW's ``beta2``, whose second moment is ``v``)."""
    for stack in stacks:
        by_step: dict[int, list[tuple[Tensor, dict[str, Any]]]] = {}
        for p, state in zip(stack.params, stack.states):
            if p.grad is not None:  # the step count is on the host, as torch's AdamW keeps it
                by_step.setdefault(int(state["step"].item()), []).append((local_shard(p.grad).float(), state))
        for t, items in by_step.items():
            _accumulate([grad for grad, _ in items], [state for _, state in items], stack.group, t, nodes, decay)


def _accumulate(grads: list[Tensor], states: list[dict[str, Any]], group: dict[str, Any], t: int, nodes: int,
                decay: float | None) -> None:
    beta1, beta2 = group["betas"]
    prev, lag, extra = ([state[key] for state in states] for key in (PREV, LAG, EXTRA))
    beta = beta2 if decay is None else decay
    if decay is not None:  # the estimate's own second moment, as AdamW keeps its
        squares = [state[SQUARES] for state in states]
        torch._foreach_mul_(squares, decay)
        torch._foreach_addcmul_(squares, grads, grads, value=1 - decay)
    if t >= 2:
        torch._foreach_mul_(lag, beta)
        torch._foreach_addcmul_(lag, grads, prev, value=1 - beta)
    torch._foreach_copy_(prev, grads)
    if t < 2:
        return
    v = torch._foreach_div([state["exp_avg_sq"].float() for state in states], 1 - beta2**t)
    own = v if decay is None else torch._foreach_div(squares, 1 - decay**t)
    f = length_factors(own, torch._foreach_div(lag, 1 - beta ** (t - 1)), nodes)
    torch._foreach_sqrt_(v)
    torch._foreach_add_(v, group["eps"])
    displacement = torch._foreach_div([state["exp_avg"].float() for state in states], 1 - beta1**t)
    torch._foreach_div_(displacement, v)
    torch._foreach_sub_(f, 1.0)
    torch._foreach_addcmul_(extra, displacement, f, value=-group["lr"])


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

    def after_inner(self, stacks: list[Stack]) -> None:
        """After each inner AdamW step."""

    def positions(self, stack: Stack) -> list[Tensor]:
        """Where the exchange counts each replica of ``stack``."""
        return stack.shards()

    def restart(self, stacks: list[Stack]) -> None:
        """The replicas restart from the anchor."""


class BatchScaled(Unscaled):
    """``progress_scale="batch"`` among ``nodes`` nodes, its estimate's EMAs of ``decay`` (None: the inner AdamW's
    ``beta2``; the module docstring)."""

    def __init__(self, nodes: int, decay: float | None = None) -> None:
        self.nodes, self.decay = nodes, decay
        self.per_node = PER_NODE if decay is None else (*PER_NODE, SQUARES)

    def new_state(self, state: dict[str, Any], shard: Tensor) -> dict[str, Any]:
        return new_state(state, shard, (*self.per_node, EXTRA))

    def after_inner(self, stacks: list[Stack]) -> None:
        accumulate(stacks, self.nodes, self.decay)

    def positions(self, stack: Stack) -> list[Tensor]:
        return positions(stack)

    def restart(self, stacks: list[Stack]) -> None:
        restart(stacks)


def for_option(value: Literal["none", "batch"], nodes: int, decay: float | None = None) -> Unscaled:
    """The object for ``progress_scale=value`` among ``nodes`` nodes (``decay``: ``progress_scale_decay``)."""
    return BatchScaled(nodes, decay) if value == "batch" else Unscaled()
