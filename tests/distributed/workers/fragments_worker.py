"""``outer_fragments=F > 1`` on 4 gloo ranks (2 nodes x 2 processes, FSDP2 shards of the tiny T5); each rank saves
what ``tests/distributed/test_fragments_distributed.py`` asserts on to OUT/rank{r}.pt: each fragment's parameters, every
landing's restarted shards (and the others' at that moment), the traffic counters per step, the drift checks, and a
resume with a fragment's exchange in flight."""

from __future__ import annotations

import torch
import torch.distributed as dist
from habits_worker import batch, finished, full, main, sharded, through_bytes
from optimizer_worker import local

from hf_flexdemo import FlexDeMo
from hf_flexdemo.policies import CompressionPolicy, GuardPolicy, OuterPolicy, from_knobs


def _train(model, opt, steps) -> None:
    for step in steps:
        model(**batch(step, dist.get_rank())).loss.backward()
        opt.step()
        opt.zero_grad()


def case_landings(args) -> dict:
    """3 rounds: at every landing (inside the step, after the replicas restart), the restarted local shards and the
    other parameters' local shards; the traffic counters of every step."""
    model, group = sharded()
    names = {id(p): n for n, p in model.named_parameters()}
    opt = FlexDeMo(model.parameters(), lr=1e-3, replicate_group=group, local_steps=int(args.local_steps),
                   outer=OuterPolicy(fragments=int(args.fragments), delay=int(args.outer_delay)),
                   compression=CompressionPolicy(rate=0.25, chunk=8, value_dtype="int2"),
                   guards=GuardPolicy(drift_check_every=0))
    landings: list[dict] = []

    def spy(stacks, *, clean, __restart=opt.mode._restart):
        __restart(stacks, clean=clean)
        restarted = {names[id(p)] for stack in stacks for p in stack.params}
        landings.append({"done": opt.steps + 1,
                         "restarted": {names[id(p)]: local(p).detach().clone() for s in stacks for p in s.params},
                         "others": {n: local(p).detach().clone() for n, p in model.named_parameters()
                                    if n not in restarted}})

    opt.mode._restart = spy
    stats = []
    for step in range(3 * int(args.local_steps)):
        _train(model, opt, [step])
        stats.append(opt.comm_stats)
    return finished({"members": [[names[id(p)] for p in members] for members in opt.mode.members],
                     "numel": {n: p.numel() for n, p in model.named_parameters()},
                     "local_shapes": {n: tuple(local(p).shape) for n, p in model.named_parameters()},
                     "landings": landings, "comm_stats": stats, "replicas": dist.get_world_size(group)},
                    opt)  # the last step's exchange in flight


def case_resume(args) -> dict:
    """12 straight steps vs 5, ``state_dict`` through bytes into a fresh optimizer built with other knobs (the
    parameters overwritten), then the rest: bitwise equal. H = 4, F = 2, tau = 2: saved while fragment 1's first
    exchange is in flight. The exact drift check runs at every landing (drift_check_every=1): which parameters."""
    kwargs = dict(lr=3e-3, local_steps=4, outer_fragments=2, outer_delay=2, value_dtype="int4", outer_lr=0.7,
                  outer_momentum=0.9, compression_rate=0.25, compression_chunk=8, drift_check_every=1)
    model, group = sharded()
    names = {id(p): n for n, p in model.named_parameters()}
    straight = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs(kwargs))
    checks: list = []

    def spy(only=None, __check=straight.check_drift):
        checks.append((straight.steps + 1, None if only is None else sorted(names[id(p)] for p in only)))
        __check(only)

    straight.check_drift = spy
    _train(model, straight, range(12))
    expected = {n: full(p) for n, p in model.named_parameters()}
    members = [sorted(names[id(p)] for p in fragment) for fragment in straight.mode.members]
    straight_checks = list(checks)  # the straight run's: its finish() below checks again
    straight.finish()  # the last step's exchange in flight (see finished())

    model, group = sharded()
    first = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs(kwargs))
    _train(model, first, range(5))
    saved = through_bytes(first.state_dict())
    index_names = [n for n, _ in model.named_parameters()]
    with torch.no_grad():
        for p in model.parameters():
            local(p).fill_(0.5)
    resumed = FlexDeMo(model.parameters(), replicate_group=group, lr=1.0)
    resumed.load_state_dict(saved)
    _train(model, resumed, range(5, 12))
    return finished({"checks": straight_checks, "members": members, "options": resumed.options,
                     "in_flight": sorted(index_names[i] for i, s in saved["state"].items() if "pending_update" in s),
                     "equal": all(torch.equal(expected[n], full(p)) for n, p in model.named_parameters())}, resumed)


if __name__ == "__main__":
    main(globals(), {"local_steps": "4", "fragments": "2", "outer_delay": "1"})
