"""The exchange plan: which local shards travel together (buckets) and which are transformed together (stacks).

A bucket holds about ``bucket_cap_mb`` of local shards, in reverse parameter order (about the order
backward finishes them, as DDP buckets), so that ``overlap="backward"`` can start a bucket's exchange
while backward computes the rest. Inside a bucket, shards of one parameter group with one block layout
form a stack: their momentum buffers are the rows of one tensor, so a stack is transformed, selected and
decoded in a few large kernels instead of one small kernel per parameter.

The plan depends only on the parameters' local shapes and the groups' block sizes, so every replica of a
shard builds the same plan and issues the same sequence of collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from .dct import BlockLayout


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

    def shards(self) -> list[Tensor]:
        """The parameters' local shards."""
        return [local_shard(p) for p in self.params]

    def grads(self) -> list[Tensor]:
        """The parameters' local gradient shards (zeros for a parameter without a gradient this step)."""
        return [torch.zeros_like(local_shard(p)) if p.grad is None else local_shard(p.grad) for p in self.params]

    def candidate(self) -> dict[str, list[Tensor]]:
        """The state the step in flight commits, per key: the new momentum's rows and any new moments."""
        return {"delta": list(self.momentum.unbind(0)), **(self.moments or {})}


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


def build_plan(
    param_groups: list[dict[str, Any]], state_for: Callable[[Tensor, dict[str, Any]], dict[str, Tensor]], *,
    bucket_cap_mb: float, hook_shards: bool,
) -> list[Bucket]:
    """The buckets of the trainable parameters, each cut into stacks; ``state_for(p, group)`` creates a
    parameter's state. ``hook_shards``: a bucket whose parameters are all FSDP2 shards is ``hooked``."""
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
        stacks: dict[tuple[int, BlockLayout], Stack] = {}
        for g, p in bucket_members:
            group = param_groups[g]
            state = state_for(p, group)
            shard = local_shard(p)
            if not shard.numel():
                continue  # an empty shard: its replicas are empty too, nothing to send or update
            layout = BlockLayout.for_shape(tuple(shard.shape), group["compression_chunk"])
            if (g, layout) not in stacks:
                stacks[g, layout] = Stack(index, layout, group)
                index += 1
            stacks[g, layout].params.append(p)
            stacks[g, layout].states.append(state)
        for stack in stacks.values():
            stack.delta = stack_rows(stack.states, "delta")
        hooked = hook_shards and all(isinstance(p, DTensor) for _, p in bucket_members)
        plan.append(Bucket([p for _, p in bucket_members], list(stacks.values()), hooked))
    return plan
