"""Replicas on unlike hardware, on 4 gloo ranks (2 nodes x 2): node 1's inverse DCT rounds differently in the last
bit (the emulation ``benchmarks/replica_drift.py`` measures with), node 1's replica of every parameter is moved by
one ulp in one element, or one parameter is corrupted on one node.

Each rank saves to OUT/rank{r}.pt: the error the run stopped with, the optimizer's measurement at each check, the full
parameters just before each check, and the collectives, host syncs and bytes of a checking and a plain step.
"""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import torch
import torch.distributed as dist
from habits_worker import full, main, observed
from optimizer_worker import mlp, mlp_loss, train_perturbed

from hf_flexdemo import FlexDeMo, build_hybrid_mesh, shard_model
from hf_flexdemo.optim import guards
from hf_flexdemo.policies import from_knobs
from hf_flexdemo.testing import unlike_inverse_dct


# FlexDeMo in its step-wise mode (an exchange every step), which these tests pin; a local_steps= argument
# overrides it.
def step_wise(params, **knobs):
    """FlexDeMo in the step-wise mode, its knobs spelt flat (FlexDeMoConfig's names)."""
    return FlexDeMo(params, **from_knobs({"local_steps": 1, **knobs}))

LR, EVERY = 3e-3, 20


def _optimizer(on_drift: str, every: int) -> tuple[torch.nn.Module, FlexDeMo]:
    mesh = build_hybrid_mesh(shard_size=2)
    model = shard_model(mlp(), mesh)
    return model, step_wise(model.named_parameters(), lr=LR, replicate_group=mesh["dp_replicate"].get_group(),
                           drift_check_every=every, on_drift=on_drift)


def nudge_every_parameter(model: torch.nn.Module) -> None:
    """Move the first element of each of this rank's local shards one ulp up (``torch.nextafter``): a difference in
    the last bit of every parameter, on any CPU (replicas bit-identical before it differ in exactly those elements,
    each parameter's 8-byte fingerprint by exactly one)."""
    with torch.no_grad():
        for p in model.parameters():
            shard = p.to_local().view(-1)
            if shard.numel():
                shard[:1] = torch.nextafter(shard[:1], torch.full_like(shard[:1], math.inf))


def case_lastbit(args) -> dict:
    """``steps`` steps, a check every 20, node 1's inverse DCT one ulp off on every non-zero output."""
    return _train(args, unlike_dct=True, nudge=False)


def case_ulp(args) -> dict:
    """As ``lastbit`` on one kind of hardware (replicas bit-identical), but after step 19, just before the check of
    step 20, node 1 moves every parameter by one ulp in one element (:func:`nudge_every_parameter`). Which
    parameters the inverse DCT's last-bit differences reach by a check, and whether their sum-of-bits fingerprints
    cancel, depends on how the CPU rounds; this difference reaches every parameter on any CPU."""
    return _train(args, unlike_dct=False, nudge=True)


def _train(args, unlike_dct: bool, nudge: bool) -> dict:
    model, opt = _optimizer(args.on_drift, EVERY)
    rank, error, checks, before, logs, stats = dist.get_rank(), None, [], [], {}, {}
    unlike = unlike_inverse_dct(1.0, seed=rank) if unlike_dct and rank >= 2 else contextlib.nullcontext()
    other = {**guards.hardware(torch.device("cpu")), "device": "another device model"}
    # node 1 reports another device model (on_drift="auto" decides by it)
    mixed = mock.patch.object(guards, "hardware", lambda device: other) if args.mixed == "1" and rank >= 2 \
        else contextlib.nullcontext()
    with unlike, mixed:
        for step in range(int(args.steps)):
            mlp_loss(model, step, rank).backward()
            log = {"collectives": [], "syncs": []}
            try:
                with observed(log, {id(state["step"]) for state in opt.state.values() if "step" in state}):
                    opt.step()
            except RuntimeError as exc:
                error = str(exc)
                break
            opt.zero_grad()
            if step % EVERY == 0:
                checks.append(dict(opt.replica_drift))
            if step in (EVERY, EVERY + 1):
                logs[step], stats[step] = log, opt.comm_stats
            if nudge and step == EVERY - 1 and rank >= 2:
                nudge_every_parameter(model)
            if step % EVERY == EVERY - 1:
                before.append({n: full(p) for n, p in model.named_parameters()})
    return {"error": error, "step": step, "checks": checks, "before_checks": before, "logs": logs, "stats": stats,
            "policy": opt.drift.policy, "after": {n: full(p) for n, p in model.named_parameters()},
            "local_numel": sum(p.to_local().numel() for p in model.parameters()),
            "params": len(list(model.parameters()))}


def case_corrupt(args) -> dict:
    """A check every 2 steps; before step 3, node 1 adds 0.1 (33 steps of lr) to one weight of ``0.weight``."""
    model, opt = _optimizer("tolerate", 2)
    error, step = train_perturbed(model, opt, lambda step, rank: mlp_loss(model, step, rank), 0.1)
    return {"error": error, "step": step}


if __name__ == "__main__":
    main(globals(), {"on_drift": "tolerate", "steps": "200", "mixed": "0"})
