"""A single node: nothing crosses nodes, so FlexDeMo trains as torch's AdamW.

Where the rule's dense limit is AdamW (local steps, and step-wise ``momentum="adam"`` with ``update="sgd"``), one
replica takes torch's AdamW step (foreach) bit for bit, and still skips a step whose gradient is non-finite on some
rank of the node (``on_nonfinite``, the step's one host sync). ``replicator="none"`` instead emulates the wire.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim.adamw import adamw
from torch.profiler import record_function

from . import guards
from .mode import Mode
from .plan import Bucket, Stack, local_shard

ADAMW_KEYS = ("step", "exp_avg", "exp_avg_sq")


def adamw_state(state: dict[str, Any], p: Tensor, group: dict[str, Any] | None = None) -> dict[str, Any]:
    """``state`` with torch's AdamW moments for ``p`` added where missing (``group``: unused, the plan's state
    fillers' signature)."""
    if "exp_avg" not in state:
        shard = local_shard(p).detach()
        state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU, as torch's AdamW keeps it
        state["exp_avg"] = torch.zeros_like(shard)
        state["exp_avg_sq"] = torch.zeros_like(shard)
    return state


def adamw_step(stacks: list[Stack]) -> None:
    """torch's AdamW (foreach) on every shard of ``stacks`` with a gradient, one call per parameter group: local
    steps' inner step, and a single replica's whole step."""
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
                  beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)


class OneReplica(Mode):
    """One node, whose rule's dense limit is AdamW: torch's AdamW, unless a gradient in the node is non-finite."""

    def new_state(self, state: dict[str, Any], p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        return adamw_state(state, p)

    def load(self, state_dict: dict[str, Any]) -> None:
        """Keep AdamW's state only: what a checkpoint of several nodes adds (local steps' anchor and error feedback, a
        mid-round local shard, a streamed exchange held until it lands) would go stale here, untouched while this
        node trains, and a later resume on several nodes would restart the replicas from that stale anchor instead
        of the weights trained here, or land an exchange whose state is gone."""
        for state in self.optimizer.state.values():
            for key in [key for key in state if key not in ADAMW_KEYS]:
                del state[key]
        self.optimizer.exchange.restore_held(None)

    def step(self, plan: list[Bucket]) -> None:
        opt = self.optimizer
        stacks = [stack for bucket in plan for stack in bucket.stacks]
        with record_function("FlexDeMo::apply"):
            grads = [local_shard(p.grad) for stack in stacks for p in stack.params if p.grad is not None]
            flag = guards.nonfinite(grads, opt.device).to(torch.float32).reshape(1)
            if guards.max_in_group(flag, opt.shard_group, opt.exchange.stats).item() > 0:
                opt.exchange.skip(opt.steps, bool(flag.item()))
                return
            adamw_step(stacks)
