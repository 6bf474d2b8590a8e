"""The exchange plan: which local shards travel together (buckets) and which are transformed together (stacks).

A bucket holds about ``bucket_cap_mb`` of local shards, in reverse parameter order (about the order
backward finishes them, as DDP buckets), so that ``overlap="backward"`` can start a bucket's exchange
while backward computes the rest. Inside a bucket, shards of one parameter group with one block layout
form a stack: their momentum buffers are the rows of one tensor, so a stack is transformed, selected and
decoded in a few large kernels instead of one small kernel per parameter.

The plan depends only on the parameters' local shapes and the groups' block sizes, so every replica of a
shard builds the same plan and issues the same sequence of collectives.

A stack also carries its step's state transitions: the candidate momentum (:meth:`Stack.new_momentum`),
its commit or discard, and the update from the consensus (:meth:`Stack.apply`), each reading its group's
knobs and calling :mod:`hf_flexdemo.optim.functional` for the arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw

from ..wire.dct import BlockLayout
from ..wire.workspace import Workspace
from . import functional


def local_shard(tensor: Tensor) -> Tensor:
    """The local shard of an FSDP2 ``DTensor`` (a plain tensor as it is): all arithmetic runs on it, since
    DTensor operations would hide collectives."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@dataclass
class Stack:
    """Parameters of one exchange bucket and parameter group whose local shards share a block layout.

    Their momentum buffers are the rows of one stacked tensor (``delta``; each parameter's
    ``state["delta"]`` is a view of its row). ``momentum`` is the candidate momentum of the step in flight,
    committed only when that step is applied; ``spare`` is the buffer the next candidate is built in.
    """

    index: int  # the stack's place in the plan (replicator="random" seeds its positions with it)
    layout: BlockLayout
    group: dict[str, Any]
    params: list[Tensor] = field(default_factory=list)
    states: list[dict[str, Tensor]] = field(default_factory=list)
    delta: Tensor | None = None
    spare: Tensor | None = None
    momentum: Tensor | None = None
    moments: dict[str, list[Tensor]] | None = None  # momentum "avg"/"adam": the candidate gradient moments
    lr: float = 0.0  # the learning rate ``momentum`` was built with
    positions: Tensor | None = None  # flat positions of the kept coefficients in ``momentum``
    values: Tensor | None = None  # their ``(N, k)`` coefficients, before the wire's rounding
    wire: list[Tensor] = field(default_factory=list)  # what travels: positions ("demo") and encoded values
    fragment: int = 0  # local steps' outer_fragments: the fragment whose round exchanges it

    def shards(self) -> list[Tensor]:
        """The parameters' local shards."""
        return [local_shard(p) for p in self.params]

    def grads(self) -> list[Tensor]:
        """The parameters' local gradient shards (zeros for a parameter without a gradient this step)."""
        return [torch.zeros_like(local_shard(p)) if p.grad is None else local_shard(p.grad) for p in self.params]

    def candidate(self) -> dict[str, list[Tensor]]:
        """The state the step in flight commits, per key: the new momentum's rows and any new moments."""
        return {"delta": list(self.momentum.unbind(0)), **(self.moments or {})}

    def take_spare(self) -> Tensor:
        """The buffer a new candidate momentum is built in (the previous momentum's, once committed)."""
        spare, self.spare = self.spare, None
        return spare if spare is not None and spare.shape == self.delta.shape else torch.empty_like(self.delta)

    def new_momentum(self) -> Tensor:
        """The candidate momentum ``beta * delta + scale * x`` in the spare buffer (``x``: the gradient, or AdamW's
        ``m`` or direction, whose new moments become ``moments``): the old momentum survives a skipped step."""
        group, spare = self.group, self.take_spare()
        if group["momentum"] in ("avg", "adam"):
            (beta1, beta2), states = group["betas"], self.states
            entering, self.moments = functional.adam_direction(
                [g.float() for g in self.grads()], [s["grad_avg"] for s in states],
                [s["grad_avg_sq"] for s in states] if group["momentum"] == "adam" else None,
                step=float(states[0]["step"]) + 1.0, beta1=beta1, beta2=beta2, eps=group["eps"])
        else:
            entering = self.grads()
        scale = functional.entry_scale(group["momentum"], lr=group["lr"], decay=group["momentum_decay"])
        return functional.momentum_step(self.delta, entering, out=spare, decay=group["momentum_decay"], scale=scale)

    def apply(self, q: Tensor, lr: float, workspace: Workspace) -> None:
        """Update the parameters from their ``(P, *shape)`` consensus ``Q`` (built with learning rate ``lr``)."""
        group, params, states = self.group, self.shards(), self.states
        # AdamW's eps and SGD's step are in gradient units: Q divided by the scale it entered the momentum with.
        scale = functional.entry_scale(group["momentum"], lr=lr, decay=group["momentum_decay"])
        to_gradient = 1.0 / scale if scale > 0 else 0.0
        (beta1, beta2), eps = group["betas"], group["eps"]
        if group["update"] == "adamw":
            grads = [(row * to_gradient).to(p.dtype) for row, p in zip(q.unbind(0), params)]
            adamw(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
                  [s["step"] for s in states], amsgrad=False, beta1=beta1, beta2=beta2, lr=lr,
                  weight_decay=group["weight_decay"], eps=eps, maximize=False)
            return
        torch._foreach_add_([s["step"] for s in states], 1.0)
        functional.decay_weights(params, lr=lr, weight_decay=group["weight_decay"])
        if group["update"] == "rmsprop":
            avg_sq = stack_rows(states, "exp_avg_sq")
            functional.rmsprop_step(params, q, avg_sq, workspace("denominator", avg_sq), step=float(states[0]["step"]),
                           lr=lr, scale=to_gradient, beta2=beta2, eps=eps)
        elif group["update"] == "sign":
            functional.sign_step(params, q, lr=lr)
        else:
            functional.sgd_step(params, q, lr=lr, to_gradient=to_gradient)

    def commit(self, spent: bool) -> None:
        """Make the candidate momentum the state (zeroed first if ``spent``); the old buffer becomes the next
        candidate's."""
        if spent:
            self.momentum.zero_()
        for key, rows in self.candidate().items():
            set_rows(self.states, key, rows)
        self.spare, self.delta, self.momentum, self.moments = self.delta, self.momentum, None, None

    def discard(self) -> None:
        """A skipped step: the candidate momentum is dropped (its buffer is reused)."""
        self.spare, self.momentum, self.moments = self.momentum, None, None


@dataclass
class Bucket:
    """Parameters whose exchange starts together: about ``bucket_cap_mb`` of local shards."""

    params: list[Tensor]
    stacks: list[Stack]
    hooked: bool  # overlap="backward" and every parameter an FSDP2 shard, whose final gradient a hook announces
    ready: set[int] = field(default_factory=set)  # ids of the parameters whose gradient arrived this step
    launched: bool = False


def set_rows(states: list[dict[str, Tensor]], key: str, rows: Iterable[Tensor]) -> None:
    """Each parameter's ``state[key]`` becomes its row of ``rows``."""
    for state, row in zip(states, rows):
        state[key] = row


def stack_rows(states: list[dict[str, Tensor]], key: str) -> Tensor:
    """The stacked ``state[key]`` of a stack; re-stacks (once) when the rows are not views of one tensor."""
    rows = [s[key] for s in states]
    base = rows[0]._base
    if (
        base is not None
        and base.shape[0] == len(rows)
        and all(r.data_ptr() == row.data_ptr() for r, row in zip(rows, base))
    ):
        return base
    stacked = torch.stack(rows)
    set_rows(states, key, stacked)
    return stacked


def new_state(state: dict[str, Any], p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
    """``p``'s optimizer ``state``, filled on first use with what the group's rules keep (a single replica's
    AdamW state gains the rest)."""
    if "delta" not in state:
        shard = local_shard(p)
        state.setdefault("step", torch.zeros((), dtype=torch.float32))  # on the CPU, as torch's AdamW keeps it
        state["delta"] = torch.zeros_like(shard, dtype=torch.float32)
        if group["update"] == "adamw":
            state.setdefault("exp_avg", torch.zeros_like(shard))
        if group["update"] in ("adamw", "rmsprop"):
            state.setdefault("exp_avg_sq", torch.zeros_like(shard))
        if group["momentum"] in ("avg", "adam"):  # this replica's AdamW moments of its node-averaged gradient
            state["grad_avg"] = torch.zeros_like(shard, dtype=torch.float32)
            if group["momentum"] == "adam":
                state["grad_avg_sq"] = torch.zeros_like(shard, dtype=torch.float32)
    return state


def build_plan(
    param_groups: list[dict[str, Any]], state_for: Callable[[Tensor, dict[str, Any]], dict[str, Tensor]], *,
    bucket_cap_mb: float, hook_shards: bool, fragment_of: Callable[[Tensor], int] | None = None,
) -> list[Bucket]:
    """The buckets of the trainable parameters, each cut into stacks; ``state_for(p, group)`` creates a
    parameter's state. ``hook_shards``: a bucket whose parameters are all FSDP2 shards is ``hooked``.
    ``fragment_of(p)``: a parameter's fragment (local steps' ``outer_fragments``; default 0): a stack holds
    parameters of one fragment only."""
    cap = bucket_cap_mb * 2**20
    entries = [(g, p) for g, group in enumerate(param_groups) for p in group["params"] if p.requires_grad]
    members: list[list[tuple[int, Tensor]]] = [[]]
    size = 0
    for g, p in reversed(entries):
        if size >= cap:
            members.append([])
            size = 0
        members[-1].append((g, p))
        size += local_shard(p).numel() * 4
    plan: list[Bucket] = []
    index = 0
    for bucket_members in members:
        stacks: dict[tuple[int, int, BlockLayout], Stack] = {}
        for g, p in bucket_members:
            group = param_groups[g]
            state = state_for(p, group)
            shard = local_shard(p)
            if not shard.numel():
                continue  # an empty shard: its replicas are empty too, nothing to send or update
            layout = BlockLayout.for_shape(tuple(shard.shape), group["compression_chunk"],
                                           group["compression_transform"])
            key = (g, 0 if fragment_of is None else fragment_of(p), layout)
            if key not in stacks:
                stacks[key] = Stack(index, layout, group, fragment=key[1])
                index += 1
            stacks[key].params.append(p)
            stacks[key].states.append(state)
        for stack in stacks.values():
            if "delta" in stack.states[0]:  # a single replica's AdamW keeps none
                stack.delta = stack_rows(stack.states, "delta")
        hooked = hook_shards and all(isinstance(p, DTensor) for _, p in bucket_members)
        plan.append(Bucket([p for _, p in bucket_members], list(stacks.values()), hooked))
    return plan
