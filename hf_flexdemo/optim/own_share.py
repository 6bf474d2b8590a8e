"""A node's own share of a round whose consensus lands a round late: local steps' eager restart.

On a wire that lands a round's consensus with the exchange after it (a replicator's ``lag``, ``replicator="owner"``),
replicas that restarted from the anchor would walk the round in flight again: the anchor still lacks it. Both
rounds' means then land one after the other, and every direction the rounds share counts twice (a delayed outer
step). So each node restarts instead from where the anchor would be if the round in flight's mean were its own
share: ``anchor - outer_lr * sent``, where ``sent`` is what it sent of that round's pseudo-gradient (its error
feedback keeps the rest). Its next pseudo-gradient is measured from that restart point; when the consensus lands,
the anchor takes the replicas' mean in place of the node's own share. With identical replicas this is exactly the
trajectory of a wire that lands at once; the replicas' anchors stay bit-identical, and their parameters differ by
their own shares (the consensus, to evaluate and save, is the anchor).

The share is per-parameter state (:data:`KEY`, float32, as large as the local shard), created only where the
optimizer's wire lags. An exchange on a wire that lands at once (a dense final round) leaves no share, and a
skipped round drops it. The own share moves the restart point by ``outer_lr`` alone: an outer momentum applies
to the consensus when it lands.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .plan import Stack, stack_rows

KEY = "own_sent"


def new_state(state: dict[str, Tensor], anchor: Tensor) -> None:
    """A lagging wire's share, zero before the first round."""
    state.setdefault(KEY, torch.zeros_like(anchor))


def held(stack: Stack) -> Tensor | None:
    """The stack's ``(P, *shape)`` shares, or ``None`` where the wire lands at once."""
    return stack_rows(stack.states, KEY) if KEY in stack.states[0] else None


def restart_point(stack: Stack, out: Tensor, outer_lr: float) -> Tensor:
    """``out`` (the anchor, or a sum that holds it) moved by this node's share: where its replica restarted."""
    share = held(stack)
    return out if share is None else out.sub_(share, alpha=outer_lr)


def capture(stack: Stack, pseudo_gradient: Tensor) -> None:
    """Before compression: the round's pseudo-gradient, which :func:`keep_sent` turns into what was sent."""
    share = held(stack)
    if share is not None:
        share.copy_(pseudo_gradient)


def keep_sent(stacks: list[Stack], *, lags: bool) -> None:
    """After the exchange started: the share becomes what was sent (the pseudo-gradient less what error feedback
    kept, ``stack.momentum``); on a wire that lands at once (``lags`` false) nothing is left to lean on."""
    for stack in stacks:
        share = held(stack)
        if share is not None:
            share.sub_(stack.momentum) if lags else share.zero_()


def settle(stacks: list[Stack], *, lean: bool, outer_lr: float) -> None:
    """After every replica restarted from the anchor: on to its restart point (``lean``), or the shares are dropped
    (a skipped round, the last restart of a run)."""
    if not lean:
        forget(stacks)
        return
    for stack in stacks:
        share = held(stack)
        if share is not None:
            torch._foreach_add_(stack.shards(), list(share.unbind(0)), alpha=-outer_lr)


def forget(stacks: list[Stack]) -> None:
    """The shares are dropped: a skipped round, the end of a run, weights loaded from outside."""
    for stack in stacks:
        share = held(stack)
        if share is not None:
            share.zero_()
