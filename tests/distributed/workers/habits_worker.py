"""What a GPU cluster needs from ``FlexDeMo.step()``, observed on 4 gloo ranks (2 nodes x 2 processes).

Each rank saves what the test asserts on to OUT/rank{r}.pt: the collectives each steady-state step
issued (with the global ranks of their group), the host syncs (``Tensor.item/tolist/__bool__``), the
traffic counters, the drift-check schedule across a resume, and the parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from hf_flexdemo import FlexDeMo, build_hybrid_mesh, shard_model
from hf_flexdemo.optim.mesh import init_process_group
from hf_flexdemo.policies import from_knobs
from hf_flexdemo.testing import VOCAB_SIZE, tiny_t5


# FlexDeMo in its step-wise mode (an exchange every step), which these tests pin; a local_steps= argument
# overrides it.
def step_wise(params, **knobs):
    """FlexDeMo in the step-wise mode, its knobs spelt flat (FlexDeMoConfig's names)."""
    return FlexDeMo(params, **from_knobs({"local_steps": 1, **knobs}))

COLLECTIVES = ("all_reduce", "all_gather_single", "all_gather_into_tensor", "all_gather", "broadcast",
               "all_gather_object", "reduce_scatter_tensor", "barrier", "all_to_all_single", "send", "recv")
SYNCS = ("item", "tolist", "__bool__")


def batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(1, VOCAB_SIZE, (4, 12), generator=g)
    return {"input_ids": ids, "labels": ids.flip(1)}


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


@contextlib.contextmanager
def observed(log: dict[str, list], host_resident: set[int]) -> Iterator[None]:
    """Record every collective (name, global ranks of its group) and every host sync while inside.

    ``host_resident``: ids of tensors that live on the CPU by design on any machine (the ``step`` counters,
    which torch's AdamW keeps on the host and reads with ``.item()``); reading them is not a device sync.
    """
    saved = {}
    depth = [0]  # a collective implemented through another (all_gather_single -> all_gather_into_tensor) counts once
    for name in COLLECTIVES:
        if not hasattr(dist, name):
            continue  # all_gather_single is new in recent torch
        original = saved[name] = getattr(dist, name)

        def collective(*args, __name=name, __original=original, **kwargs):
            if not depth[0]:
                group = kwargs.get("group")
                log["collectives"].append((__name, tuple(dist.get_process_group_ranks(group or dist.group.WORLD))))
            depth[0] += 1
            try:
                return __original(*args, **kwargs)
            finally:
                depth[0] -= 1

        setattr(dist, name, collective)
    for name in SYNCS:
        original = saved["Tensor." + name] = getattr(torch.Tensor, name)

        def sync(self, *args, __name=name, __original=original, **kwargs):
            if id(self) not in host_resident:
                log["syncs"].append(__name)
            return __original(self, *args, **kwargs)

        setattr(torch.Tensor, name, sync)
    try:
        yield
    finally:
        for name, original in saved.items():
            if name.startswith("Tensor."):
                setattr(torch.Tensor, name.removeprefix("Tensor."), original)
            else:
                setattr(dist, name, original)


def train(model: nn.Module, opt: FlexDeMo, steps: range, logs: list | None = None) -> None:
    for step in steps:
        model(**batch(step, dist.get_rank())).loss.backward()
        if logs is None:
            opt.step()
        else:
            log = {"collectives": [], "syncs": []}
            with observed(log, {id(state["step"]) for state in opt.state.values()}):
                opt.step()
            logs.append(log)
        opt.zero_grad()


def finished(result: dict, *optimizers: FlexDeMo) -> dict:
    """``result`` as it is now, after each of ``optimizers`` has landed its exchanges in flight (``finish()``; called on
    every rank, after the case's last ``step()`` and measurements). A streamed exchange launched at a case's last
    step is otherwise never waited for: the worker destroys the process group and exits while gloo's worker thread may
    still run it, and a gloo work that finishes during interpreter shutdown aborts the rank ("terminate called without
    an active exception", exit -6). ``finish()`` may run a final round (and the case's spies with it): the result is
    copied first."""
    result = copy.deepcopy(result)
    for opt in optimizers:
        opt.finish()
    return result


def through_bytes(state: dict) -> dict:
    """``state`` saved with ``torch.save`` and loaded back, as a checkpoint would be."""
    blob = io.BytesIO()
    torch.save(state, blob)
    blob.seek(0)
    return torch.load(blob, weights_only=True)


def sharded(shard_size: int = 2) -> tuple[nn.Module, dist.ProcessGroup]:
    mesh = build_hybrid_mesh(shard_size=shard_size)
    model = tiny_t5()
    if shard_size > 1:
        shard_model(model, mesh)
    return model, mesh["dp_replicate"].get_group()


def case_habits(args) -> dict:
    """Steady-state steps (after the step-0 drift check): collectives per group, host syncs."""
    model, group = sharded()
    opt = step_wise(model.parameters(), lr=1e-3, replicate_group=group, replicator=args.replicator,
                   update=args.update, drift_check_every=100)
    train(model, opt, range(2))
    logs: list = []
    train(model, opt, range(2, 5), logs)
    return {"logs": logs, "params": {n: full(p) for n, p in model.named_parameters()}}


def case_bytes(args) -> dict:
    """Traffic counters of one step, with the local shard shapes they follow from."""
    shard_size = {"2x2": 2, "1x4": 1}[args.topology]
    model, group = sharded(shard_size)
    opt = step_wise(model.parameters(), lr=1e-3, replicate_group=group, replicator=args.replicator,
                   compression_rate=0.25, compression_chunk=8)
    train(model, opt, range(2))
    shapes = [tuple((p.to_local() if isinstance(p, DTensor) else p).shape) for p in model.parameters()]
    return {"comm_stats": opt.comm_stats, "local_shapes": shapes, "replicas": dist.get_world_size(group),
            "value_dtype": opt.options["value_dtype"]}


def case_resume_drift(args) -> dict:
    """8 straight steps vs 5 steps, state_dict through bytes into a fresh optimizer, 3 more; drift every 3."""
    kwargs = dict(lr=3e-3, drift_check_every=3, replicator=args.replicator)

    def checked_steps(opt: FlexDeMo) -> list[int]:
        fired: list[int] = []
        original = opt.check_drift
        opt.check_drift = lambda only=None: (fired.append(opt.steps), original(only))[1]
        return fired

    model, group = sharded()
    straight = step_wise(model.parameters(), replicate_group=group, **kwargs)
    straight_checks = checked_steps(straight)
    train(model, straight, range(8))
    expected = {n: full(p) for n, p in model.named_parameters()}

    model, group = sharded()
    first = step_wise(model.parameters(), replicate_group=group, **kwargs)
    train(model, first, range(5))
    resumed = step_wise(model.parameters(), replicate_group=group, lr=1.0, drift_check_every=1000)
    resumed.load_state_dict(through_bytes(first.state_dict()))
    resumed_checks = checked_steps(resumed)
    train(model, resumed, range(5, 8))
    return {"straight_checks": straight_checks, "resumed_checks": resumed_checks,
            "knobs": {**{k: v for k, v in resumed.param_groups[0].items() if k != "params"}, **resumed.options},
            "equal": all(torch.equal(expected[n], full(p)) for n, p in model.named_parameters())}


def case_empty_rank(args) -> dict:
    """A model whose every parameter has one row: the second rank of each node holds only empty shards."""
    mesh = build_hybrid_mesh(shard_size=2)
    torch.manual_seed(0)
    model = shard_model(nn.Sequential(nn.Linear(6, 1, bias=False)), mesh)
    opt = step_wise(model.parameters(), lr=1e-2, replicate_group=mesh["dp_replicate"].get_group(),
                   replicator=args.replicator)
    for step in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step * 10 + dist.get_rank()))
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return {"local_numel": sum(p.to_local().numel() for p in model.parameters()),
            "params": [full(p) for p in model.parameters()], "collectives": opt.comm_stats["collectives"]}


def main(cases: dict | None = None, defaults: dict | None = None) -> None:
    """``--case name,key=value,...`` (repeatable): run ``case_<name>`` of ``cases`` (default: this module's)
    with ``defaults`` overridden by the keys, save ``{case string: result}``."""
    cases = cases or globals()
    defaults = defaults or {"replicator": "demo", "update": "sign", "topology": "2x2"}
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", action="append", required=True)
    args = parser.parse_args()
    init_process_group("cpu")
    results = {}
    for spec in args.case:
        name, *options = spec.split(",")
        options = {**defaults, **dict(o.split("=") for o in options)}
        results[spec] = cases[f"case_{name}"](argparse.Namespace(**options))
    torch.save(results, args.out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
