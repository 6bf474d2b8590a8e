"""``progress_scale="batch"``: what a node sends of a round, lengthened per element to the R nodes' batch.

Each node's inner AdamW divides its first moment by its own gradient's second moment ``v = s + n``: the signal ``s``
(the square of the expected gradient) plus the noise ``n`` of the node's batch. AdamW on the mean gradient of R nodes,
whose noise is ``n / R``, divides by ``s + n / R``. So where noise dominates, the mean of R nodes' normalised steps is
up to sqrt(R) times shorter than the step of one AdamW on their batch, and a uniform outer step cannot lengthen the
noisy elements without overshooting the others. Here every inner step's displacement (weight decay excluded) enters
the round's pseudo-gradient multiplied, per element, by

    f = sqrt(R v / (v + (R - 1) s)),   in [1, sqrt(R)],

with ``v`` and ``s`` bias-corrected. ``s`` comes from the node's own gradients: consecutive steps' batches are
independent, so ``E[g_t * g_{t-1}] = s``, averaged by an EMA of ``beta2`` as ``v`` is and clipped to ``[0, v]``.

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

PREV, LAG, EXTRA = "prev_grad", "lag_product", "extra_progress"
KEYS = (PREV, LAG, EXTRA)
PER_NODE = (PREV, LAG)  # each node's own gradients, as the inner moments


def new_state(state: dict[str, Any], shard: Tensor) -> dict[str, Any]:
    """``state`` with the last gradient, the EMA of consecutive gradients' products and the extra progress (float32,
    zero) added where missing."""
    for key in KEYS:
        if key not in state:
            state[key] = torch.zeros_like(shard, dtype=torch.float32)
    return state


def length_factor(v: Tensor, s: Tensor, nodes: int) -> Tensor:
    """``sqrt(R v / (v + (R - 1) s))`` with ``s`` clipped to ``[0, v]``: how much longer AdamW's step on the mean
    gradient of ``nodes`` nodes is than one node's, per element (1 where ``v`` is 0)."""
    s = torch.minimum(s.clamp(min=0), v)
    f = (v * nodes).div_(v + (nodes - 1) * s).sqrt_()
    return f.nan_to_num_(nan=1.0)


def accumulate(stacks: list[Stack], nodes: int) -> None:
    """After the inner AdamW step: update the products' EMA with this step's gradient and add ``(f - 1)`` times the
    step's displacement to ``extra_progress``, for every shard with a gradient."""
    for stack in stacks:
        beta1, beta2 = stack.group["betas"]
        lr, eps = stack.group["lr"], stack.group["eps"]
        for p, state in zip(stack.params, stack.states):
            if p.grad is None:
                continue
            grad, t = local_shard(p.grad).float(), int(state["step"].item())  # the step count is on the host
            if t >= 2:
                state[LAG].mul_(beta2).addcmul_(grad, state[PREV], value=1 - beta2)
            state[PREV].copy_(grad)
            if t < 2:
                continue
            v = state["exp_avg_sq"].float().div(1 - beta2**t)
            f = length_factor(v, state[LAG].div(1 - beta2 ** (t - 1)), nodes)
            displacement = state["exp_avg"].float().div(1 - beta1**t).div_(v.sqrt_().add_(eps))
            state[EXTRA].addcmul_(displacement, f.sub_(1), value=-lr)


def positions(stack: Stack) -> list[Tensor]:
    """Where the exchange counts each replica: its local shard plus the extra progress."""
    return [shard + state[EXTRA] for shard, state in zip(stack.shards(), stack.states)]


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
    """``progress_scale="batch"`` among ``nodes`` nodes (the module docstring)."""

    per_node = PER_NODE

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def new_state(self, state: dict[str, Any], shard: Tensor) -> dict[str, Any]:
        return new_state(state, shard)

    def after_inner(self, stacks: list[Stack]) -> None:
        accumulate(stacks, self.nodes)

    def positions(self, stack: Stack) -> list[Tensor]:
        return positions(stack)

    def restart(self, stacks: list[Stack]) -> None:
        restart(stacks)


def for_option(value: Literal["none", "batch"], nodes: int) -> Unscaled:
    """The object for ``progress_scale=value`` among ``nodes`` nodes."""
    return BatchScaled(nodes) if value == "batch" else Unscaled()
