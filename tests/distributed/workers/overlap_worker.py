"""Overlap, delayed application and the bandwidth budget on 4 gloo ranks (2 nodes x 2 processes).

Each rank saves what tests/distributed/test_overlap.py asserts on to OUT/rank{r}.pt: parameters after training with
and without overlap, the collectives issued during backward and during step(), the rates a budget chose.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from habits_worker import batch, finished, full, main, observed, sharded, through_bytes
from torch import nn

from hf_flexdemo import FlexDeMo
from hf_flexdemo.policies import BudgetPolicy, CompressionPolicy, GuardPolicy, from_knobs
from hf_flexdemo.wire.replicators import exchange_bytes


# FlexDeMo in its step-wise mode (an exchange every step), which these tests pin; a local_steps= argument
# overrides it.
def step_wise(params, **knobs):
    """FlexDeMo in the step-wise mode, its knobs spelt flat (FlexDeMoConfig's names)."""
    return FlexDeMo(params, **from_knobs({"local_steps": 1, **knobs}))

SMALL_BUCKETS = 0.02  # MB: the tiny T5 falls into several exchange buckets


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: full(p) for n, p in model.named_parameters()}


def train(model: nn.Module, opt: FlexDeMo, steps: range, micro: int = 1, sync_every_micro: bool = False,
          logs: list | None = None) -> None:
    """``micro`` micro-batches per step; gradients are reduced on the last one only unless ``sync_every_micro``."""
    for step in steps:
        log = {"collectives": [], "syncs": []}
        state_steps = {id(s["step"]) for s in opt.state.values()}
        for m in range(micro):
            model.set_requires_gradient_sync(sync_every_micro or m == micro - 1)
            with observed(log if logs is not None else {"collectives": [], "syncs": []}, state_steps):
                model(**batch(step * micro + m, dist.get_rank())).loss.backward()
        in_backward = len(log["collectives"])
        with observed(log if logs is not None else {"collectives": [], "syncs": []}, state_steps):
            opt.step()
        if logs is not None:
            logs.append({**log, "in_backward": in_backward, "comm_stats": opt.comm_stats})
        opt.zero_grad()


def run(overlap: str, replicator: str, steps: int = 20, micro: int = 1, **kwargs) -> tuple[dict, list, int]:
    model, group = sharded()
    opt = step_wise(model.parameters(), lr=3e-3, replicate_group=group, replicator=replicator, overlap=overlap,
                   bucket_cap_mb=SMALL_BUCKETS, **kwargs)
    logs: list = []
    train(model, opt, range(steps), micro=micro, logs=logs)
    return params(model), logs, len(opt.exchange_plan())


def case_equal(args) -> dict:
    """20 steps with overlap "none" and "backward" (the same buckets), gradient accumulation of ``micro``."""
    micro = int(args.micro)
    plain, plain_logs, buckets = run("none", args.replicator, micro=micro)
    overlapped, logs, _ = run("backward", args.replicator, micro=micro)
    return {"equal": all(torch.equal(plain[n], overlapped[n]) for n in plain), "buckets": buckets,
            "logs": logs[2:], "plain_logs": plain_logs[2:], "params": overlapped}


def case_accumulate_without_no_sync(args) -> dict:
    """Gradients reduced on every micro-batch: overlap="backward" must refuse, naming the fix."""
    model, group = sharded()
    opt = step_wise(model.parameters(), lr=3e-3, replicate_group=group, overlap="backward")
    try:
        train(model, opt, range(1), micro=2, sync_every_micro=True)
    except RuntimeError as err:
        opt.adopt_parameters()  # wait for and drop the exchange the refused backward started (see finished())
        return {"error": str(err)}
    return {"error": None}


def case_delayed(args) -> dict:
    """Delayed application: the first step changes nothing; 8 straight steps == 5 + state_dict + 3."""
    kwargs = dict(lr=3e-3, overlap="delayed", replicator=args.replicator)
    model, group = sharded()
    before = params(model)
    straight = step_wise(model.parameters(), replicate_group=group, **kwargs)
    train(model, straight, range(1))
    first_step_unchanged = all(torch.equal(before[n], v) for n, v in params(model).items())
    train(model, straight, range(1, 8))
    expected = params(model)
    straight.finish()  # the last step's exchange in flight (see finished())

    model, group = sharded()
    first = step_wise(model.parameters(), replicate_group=group, **kwargs)
    train(model, first, range(5))
    saved = through_bytes(first.state_dict())
    resumed = step_wise(model.parameters(), replicate_group=group, lr=1.0)
    resumed.load_state_dict(saved)
    train(model, resumed, range(5, 8))
    got = params(model)
    resumed.finish()

    model, group = sharded()
    synchronous = step_wise(model.parameters(), replicate_group=group, **{**kwargs, "overlap": "none"})
    train(model, synchronous, range(8))
    return {"first_step_unchanged": first_step_unchanged,
            "resumed_equal": all(torch.equal(expected[n], got[n]) for n in expected),
            "differs_from_synchronous": any(not torch.equal(expected[n], v) for n, v in params(model).items()),
            "pending_keys": sorted({k for s in saved["state"].values() for k in s}),
            "params": got}


def case_budget_bytes(args) -> dict:
    budget = int(args.budget)
    model, group = sharded()
    opt = step_wise(model.parameters(), lr=3e-3, replicate_group=group, replicator=args.replicator,
                   budget_bytes=budget, compression_chunk=8, value_dtype="bfloat16",  # the budgets' calibration
                   drift_check_every=0)  # the exchange's bytes alone
    logs: list = []
    train(model, opt, range(3), logs=logs)
    shapes = [tuple(p.to_local().shape) for p in model.parameters()]
    formula = {rate: exchange_bytes(args.replicator, shapes, 2, rate=rate, topk=None, chunk=8, value_dtype="bfloat16")
               for rate in (opt.rate, min(opt.rate * 1.05, 1.0))}
    return {"rate": opt.rate, "sent": [log["comm_stats"]["bytes_sent"] for log in logs], "formula": formula}


def case_budget_bytes_local(args) -> dict:
    """The defaults (8 local steps in 4 fragments, int2) under ``budget_bytes``: what each step sent over a
    round, and each fragment's exchange bytes at the chosen rate and at a 5 % larger one."""
    model, group = sharded()
    # drift checks off: the exchanges' bytes alone
    opt = FlexDeMo(model.parameters(), lr=3e-3, replicate_group=group, budget=BudgetPolicy(bytes=int(args.budget)),
                   compression=CompressionPolicy(chunk=8), guards=GuardPolicy(drift_check_every=0))
    logs: list = []
    train(model, opt, range(8), logs=logs)
    fragments = [[tuple(p.to_local().shape) for p in members] for members in opt.mode.members]
    formula = {rate: [exchange_bytes("demo", shapes, 2, rate=rate, topk=None, chunk=8, value_dtype="int2")
                      for shapes in fragments] for rate in (opt.rate, min(opt.rate * 1.05, 1.0))}
    return finished({"rate": opt.rate, "local_steps": opt.options["local_steps"],
                     "fragments": opt.options["outer_fragments"], "formula": formula,
                     "sent": [log["comm_stats"]["bytes_sent"] for log in logs]}, opt)  # the last exchange in flight


def case_budget_fraction(args) -> dict:
    model, group = sharded()
    opt = step_wise(model.parameters(), lr=3e-3, replicate_group=group, replicator=args.replicator,
                   budget_fraction=float(args.fraction), budget_min_rate=1 / 64, budget_max_rate=1 / 4)
    rates = []
    logs: list = []
    for step in range(12):
        train(model, opt, range(step, step + 1), logs=logs)
        rates.append(opt.rate)
    return {"rates": rates, "params": params(model), "syncs": [log["syncs"] for log in logs[1:]]}


if __name__ == "__main__":
    main(globals(), {"replicator": "demo", "micro": "1"})
