"""Elastic resume: the optimizer state of one rank of a new topology, from every rank's state of an old one.

A FlexDeMo checkpoint holds one optimizer ``state_dict`` per rank, each over that rank's FSDP2 shards. Ranks are
node-major (node ``n`` = ranks ``n * S .. n * S + S - 1``) and FSDP2 cuts dim 0 like ``torch.chunk`` over the
``S`` ranks of a node, the last shards possibly empty. So a node's full per-parameter tensor is the
concatenation of its ``S`` shards in rank order, and a new rank's shard is FSDP2's cut of its new node's tensor.

State of two kinds moves between nodes differently:

* replicated state is identical on every node and reshards exactly: ``anchor`` and ``outer_avg`` (local steps),
  ``exp_avg`` / ``exp_avg_sq`` of ``update="adamw"`` / ``"rmsprop"`` (fed the consensus), the consensus still to
  apply (``pending_update``), ``step`` (zeroed by ``reset`` where it counts per-node moments only) and the
  optimizer-wide counters;
* per-node state differs between nodes (:func:`per_node_keys`): the error feedback ``delta``, the replica's
  gradient moments, with local steps the inner AdamW's moments, the mid-round ``local`` shard and the error
  feedback a streamed exchange in flight holds (``pending_delta``: relative to the ``local`` shard, so that it
  moves with it). A
  :data:`ResumePolicy` says what a new node starts from: ``average`` (the mean over the old
  nodes), ``reset`` (zeros, as a fresh optimizer) or ``keep`` (new node ``n`` takes old node ``n``'s: only when
  the number of nodes is unchanged). With ``average`` and ``reset`` a mid-round ``local`` shard restarts from the
  anchor: no new node has a trajectory of its own to continue, and the anchor is the point every old node agreed on.

``replicator="leader"``'s agreed positions are in the old shards' blocks: they are dropped, and the first exchange
after the resume draws new ones from the shared seed, as a run's first exchange does. ``replicator="owner"``'s nodes
each hold a share of the consensus still to land: its checkpoints are refused here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from ..wire.replicators.leader import STATE_KEYS as LEADER_KEYS
from ..wire.replicators.owner import STATE_KEYS as OWNER_KEYS
from . import progress_scale
from .exchange import MOMENT_KEYS
from .local_shards import LOCAL_KEY

# What a new node's per-node optimizer state starts from when a checkpoint resumes on another topology
# (hf_flexdemo.optim.reshard).
ResumePolicy = Literal["average", "reset", "keep"]
RESUME_POLICIES: tuple[str, ...] = get_args(ResumePolicy)

# Keys that differ between nodes in every mode (the step-wise delayed exchange's candidates are refused before
# they get here).
PER_NODE = ("delta", *MOMENT_KEYS, LOCAL_KEY)
# Local steps: the inner AdamW runs on each node's own gradients, so its moments are per node too, and so is the
# error feedback a streamed exchange in flight holds until it lands (its consensus, ``pending_update``, is not).
PENDING_DELTA = "pending_delta"
LOCAL_STEPS_PER_NODE = ("exp_avg", "exp_avg_sq", PENDING_DELTA, *progress_scale.KEYS)


def per_node_keys(options: dict[str, Any]) -> frozenset[str]:
    """The per-parameter state keys that differ between nodes under the optimizer-wide ``options``."""
    local = options.get("local_steps", 1) > 1
    return frozenset(PER_NODE + (LOCAL_STEPS_PER_NODE if local else ()))


def _position(saved: dict[str, Any]) -> Tensor:
    """Where a mid-round replica's saved state counts it (:meth:`~hf_flexdemo.optim.local_steps.LocalSteps.save`):
    its local shard, plus the extra progress of ``progress_scale="batch"``."""
    local = saved[LOCAL_KEY]
    return local + saved[progress_scale.EXTRA] if progress_scale.EXTRA in saved else local


def cut(full: Tensor, shard_size: int, index: int) -> Tensor:
    """FSDP2's shard ``index`` of ``full`` over ``shard_size`` ranks: ``torch.chunk`` on dim 0, empty ``(0, ...)``
    shards past the last chunk (``fully_shard``'s ``_chunk_with_empty``). A 0-dim tensor is not sharded."""
    if full.dim() == 0:
        return full.clone()
    chunks = torch.chunk(full, shard_size, dim=0)
    if index < len(chunks):
        return chunks[index].clone()
    return full.new_empty((0, *full.shape[1:]))


def assemble(shards: Sequence[Tensor], shard_size: int) -> list[Tensor]:
    """Each node's full tensor from every rank's shard (rank order, node-major); a 0-dim tensor is whole."""
    if len(shards) % shard_size:
        raise ValueError(f"{len(shards)} rank shards do not form nodes of shard_size={shard_size}.")
    nodes = [shards[n:n + shard_size] for n in range(0, len(shards), shard_size)]
    return [node[0] if node[0].dim() == 0 else torch.cat(list(node), dim=0) for node in nodes]


def combine(nodes: Sequence[Tensor], policy: ResumePolicy, node: int, replicate_size: int) -> Tensor:
    """What new node ``node`` (of ``replicate_size``) starts from, given the old nodes' full tensors."""
    if policy == "average":
        return torch.stack([t.float() for t in nodes]).mean(0).to(nodes[0].dtype)
    if policy == "reset":
        return torch.zeros_like(nodes[0])
    if policy == "keep":
        check_keep(len(nodes), replicate_size)
        return nodes[node]
    raise ValueError(f"invalid resume_policy={policy!r}; accepted: {' | '.join(RESUME_POLICIES)}.")


def check_keep(old_nodes: int, new_nodes: int) -> None:
    """``keep`` maps old node ``n`` to new node ``n``: the node counts must agree."""
    if old_nodes != new_nodes:
        raise ValueError(f"resume_policy='keep' needs one new node per old node, but the checkpoint has {old_nodes} "
                         f"node(s) and this run {new_nodes}; accepted: 'average' | 'reset' when the number of nodes "
                         "changes.")


def reshard_tensor(shards: Sequence[Tensor], *, old_shard_size: int, rank: int, shard_size: int, replicate_size: int,
                   policy: ResumePolicy | None) -> Tensor:
    """New ``rank``'s shard from every old rank's shard; ``policy=None``: replicated (old node 0's, exactly)."""
    nodes = assemble(shards, old_shard_size)
    full = nodes[0] if policy is None else combine(nodes, policy, rank // shard_size, replicate_size)
    return cut(full, shard_size, rank % shard_size)


def reshard_state_dict(states: Sequence[dict[str, Any]], *, old_shard_size: int, rank: int, shard_size: int,
                       replicate_size: int, policy: ResumePolicy) -> dict[str, Any]:
    """New ``rank``'s ``FlexDeMo.state_dict()`` from every old rank's (in rank order).

    Per-node keys follow ``policy`` (``local`` restarts from the anchor unless ``keep``); everything else is
    old node 0's, resharded exactly. Param groups and the ``flexdemo`` counters carry over from old rank 0.
    """
    if policy == "keep":
        check_keep(len(states) // old_shard_size, replicate_size)
    first = states[0]
    if any(key in OWNER_KEYS for saved in first["state"].values() for key in saved):
        raise ValueError("FlexDeMo: this checkpoint was written with replicator='owner', whose nodes each hold their "
                         "blocks' share of the last round, still to land: it resumes on the topology it was saved on "
                         "only. Resume it on that many nodes x processes, or end that run with trainer.train() "
                         "finishing (its final round lands everything) and start from the saved model.")
    options = first.get("flexdemo", {}).get("options") or {}
    per_node = per_node_keys(options)
    update = {index: group.get("update") for group in first["param_groups"] for index in group["params"]}

    def reshard(shards: list[Tensor], node_policy: ResumePolicy | None) -> Tensor:
        return reshard_tensor(shards, old_shard_size=old_shard_size, rank=rank, shard_size=shard_size,
                              replicate_size=replicate_size, policy=node_policy)

    new_state: dict[int, dict[str, Any]] = {}
    for index, saved in first["state"].items():
        entry: dict[str, Any] = {}
        # A mid-round local shard restarts from the anchor (unless ``keep``): this rank's shard of it, once.
        restart = policy != "keep" and LOCAL_KEY in saved
        anchor = reshard([s["state"][index]["anchor"] for s in states], None) if restart else None
        # ``step`` is the bias correction of the moments it counts: where those are all per node (the inner AdamW
        # of local steps; the replica's gradient moments unless the update keeps an AdamW of the consensus), a
        # reset restarts it with them, as a fresh optimizer would.
        step_per_node = options.get("local_steps", 1) > 1 or update.get(index) not in ("adamw", "rmsprop")
        for key, value in saved.items():
            if key in LEADER_KEYS:  # positions in the old shards' blocks: the next exchange draws new ones
                continue
            if not isinstance(value, Tensor):
                entry[key] = value
                continue
            if key == "step" and policy == "reset" and step_per_node:
                entry[key] = torch.zeros_like(value)
                continue
            node_policy = policy if key in per_node else None
            if key == LOCAL_KEY and restart:
                new = anchor
            elif key == progress_scale.EXTRA and restart:  # the extra progress of the round left
                new = torch.zeros_like(anchor)
            elif key == PENDING_DELTA and restart:  # held as (error feedback + where the replica was counted at its
                # launch): the policy applies to the feedback, which then moves with the replica to the anchor
                new = reshard([s["state"][index][key] - _position(s["state"][index]) for s in states], node_policy)
                new = new + anchor
            else:
                new = reshard([s["state"][index][key] for s in states], node_policy)
            entry[key] = new.to(value.dtype)
        new_state[index] = entry
    return {**first, "state": new_state}
