"""``local_steps=H`` on 4 gloo ranks (2 nodes x 2 processes, FSDP2 shards); each rank saves what the test asserts on
to OUT/rank{r}.pt: parameters against a float64 reference of periodic averaging, the collectives and host syncs
of inner and exchange steps, the traffic counters per step, and a resume in the middle of a round."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from habits_worker import batch, finished, full, main, observed, sharded, through_bytes
from optimizer_worker import local, mlp, mlp_loss

from hf_flexdemo import FlexDeMo, build_hybrid_mesh, shard_model
from hf_flexdemo.policies import CompressionPolicy, GuardPolicy, OuterPolicy, from_knobs

NODES = ((0, 1), (2, 3))  # global ranks, node-major


def loss64(model, step: int, rank: int) -> torch.Tensor:
    """``mlp_loss`` on the same data, in float64."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 10, generator=g).double(), torch.randn(8, 3, generator=g).double()
    return ((model(x) - y) ** 2).mean()


@torch.no_grad()
def lengthen(adamw: torch.optim.AdamW, extra: list[torch.Tensor], stats: list[dict], *, nodes: int,
             decay: float | None, micro: bool = False) -> None:
    """progress_scale="batch" on a reference replica after its AdamW step, in float64: AdamW's displacement times
    (f - 1) joins ``extra``, f = sqrt(R w / (w + (R - 1) s)), s the EMA of consecutive gradients' products in [0, w]
    and w AdamW's second moment, or with ``decay`` both EMAs of that decay; ``micro``: s and w the EMAs
    :func:`observe` keeps."""
    (beta1, beta2), eps, lr = adamw.defaults["betas"], adamw.defaults["eps"], adamw.defaults["lr"]
    beta = beta2 if decay is None else decay
    for p, more, kept in zip(adamw.param_groups[0]["params"], extra, stats):
        state, t = adamw.state[p], int(adamw.state[p]["step"])
        if not micro:
            kept["sq"] = beta * kept["sq"] + (1 - beta) * p.grad * p.grad
            if t >= 2:
                kept["lag"] = beta * kept["lag"] + (1 - beta) * p.grad * kept["prev"]
            kept["prev"] = p.grad.clone()
            if t < 2:
                continue
        v = state["exp_avg_sq"] / (1 - beta2**t)
        w = v if decay is None and not micro else kept["sq"] / (1 - beta**t)
        s = torch.minimum((kept["lag"] / (1 - beta ** (t - (0 if micro else 1)))).clamp(min=0), w)
        f = torch.sqrt(nodes * w / (w + (nodes - 1) * s))
        more -= lr * (f - 1) * (state["exp_avg"] / (1 - beta1**t)) / (v.sqrt() + eps)


@torch.no_grad()
def observe(adamw: torch.optim.AdamW, firsts: list[torch.Tensor], stats: list[dict], decay: float | None) -> None:
    """progress_scale_estimate="micro_batches" on a reference replica at its step's last micro-batch, in float64:
    ``firsts`` the first micro-batch's gradient (half of the step's), the EMAs of 4 a (g - a) and of g^2."""
    beta = adamw.defaults["betas"][1] if decay is None else decay
    for p, first, kept in zip(adamw.param_groups[0]["params"], firsts, stats):
        kept["lag"] = beta * kept["lag"] + (1 - beta) * first * (p.grad - first) * 4
        kept["sq"] = beta * kept["sq"] + (1 - beta) * p.grad * p.grad


def decay_of(args) -> float | None:
    """The case's ``progress_scale_decay`` ("none": None)."""
    return None if args.progress_scale_decay == "none" else float(args.progress_scale_decay)


def parts_of(args) -> int:
    """Micro-batches per step: 2 with ``progress_scale_estimate="micro_batches"``, else 1."""
    return 2 if args.progress_scale_estimate == "micro_batches" else 1


def case_averaging(args) -> dict:
    """``replicator="full"`` and outer SGD at lr 1: periodic averaging of two AdamW replicas, in float64.

    Each reference replica runs torch's AdamW on its node's mean gradient for H steps; then every replica's
    parameters become the replicas' mean (the inner AdamW keeps its moments across rounds). With
    ``progress_scale="batch"``, the mean of where the replicas are counted: their parameters plus the extra progress
    of :func:`lengthen` (``progress_scale_path="lengthened"``: each replica walks it). With
    ``progress_scale_estimate="micro_batches"``, each step's two micro-batches (half the loss each), every one reduced
    inside the node, and the estimate from their products (:func:`observe`)."""
    steps, rounds, parts = int(args.steps), int(args.local_steps), parts_of(args)
    mesh = build_hybrid_mesh(shard_size=2)
    model = mlp()
    replicas = [copy.deepcopy(model).double() for _ in NODES]
    shard_model(model, mesh)
    lr, wd = 0.05, 0.1
    opt = FlexDeMo(model.parameters(), lr=lr, weight_decay=wd, replicate_group=mesh["dp_replicate"].get_group(),
                   local_steps=rounds, overlap="none", compression=CompressionPolicy(replicator="full"),
                   guards=GuardPolicy(drift_check_every=1), outer=OuterPolicy(
                       progress_scale=args.progress_scale, progress_scale_decay=decay_of(args),
                       progress_scale_estimate=args.progress_scale_estimate,
                       progress_scale_path=args.progress_scale_path))
    inner = [torch.optim.AdamW(r.parameters(), lr=lr, weight_decay=wd) for r in replicas]
    extra = [[torch.zeros_like(p) for p in r.parameters()] for r in replicas]  # progress_scale="batch"'s
    stats = [[dict.fromkeys(("prev", "lag", "sq"), torch.zeros_like(p)) for p in r.parameters()] for r in replicas]
    for step in range(steps):
        for part in range(parts):
            (mlp_loss(model, parts * step + part, dist.get_rank()) / parts).backward()
            opt.observe_micro_batch(last=part == parts - 1)
        opt.step()
        opt.zero_grad()
        for replica, adamw, ranks, more, kept in zip(replicas, inner, NODES, extra, stats):
            adamw.zero_grad()
            for part in range(parts):
                for rank in ranks:
                    (loss64(replica, parts * step + part, rank) / len(ranks) / parts).backward()
                if part < parts - 1:
                    firsts = [p.grad.clone() for p in replica.parameters()]
            if parts > 1:
                observe(adamw, firsts, kept, decay_of(args))
            adamw.step()
            if args.progress_scale == "batch":
                lengthen(adamw, more, kept, nodes=len(NODES), decay=decay_of(args), micro=parts > 1)
            if args.progress_scale_path == "lengthened":  # the replica walks its extra progress
                with torch.no_grad():
                    for p, m in zip(replica.parameters(), more):
                        p += m
                        m.zero_()
        if (step + 1) % rounds == 0:
            with torch.no_grad():
                for ps, mores in zip(zip(*(r.parameters() for r in replicas)), zip(*extra)):
                    mean = sum(p + more for p, more in zip(ps, mores)) / len(ps)
                    for p, more in zip(ps, mores):
                        p.copy_(mean)
                        more.zero_()
    return {"flexdemo": [full(p) for p in model.parameters()],
            "reference": [p.detach().clone() for p in replicas[0].parameters()],
            "initial": [p.detach().clone() for p in mlp().parameters()]}


def procs_per_node(topology: str) -> int:
    """``"RxS"`` (R nodes x S processes, node-major ranks): S, checked against the world size."""
    nodes, procs = map(int, topology.split("x"))
    assert nodes * procs == dist.get_world_size(), topology
    return procs


def case_habits(args) -> dict:
    """Per step of rounds 2 and 3: the collectives and host syncs of ``step()`` and the traffic counters; after every
    exchange the full parameters (gathered outside the observed step). The whole model in one round (fragments'
    schedule: fragments_worker.py)."""
    model, group = sharded(procs_per_node(args.topology))
    opt = FlexDeMo(model.parameters(), lr=1e-3, replicate_group=group, local_steps=int(args.local_steps),
                   overlap=args.overlap,
                   compression=CompressionPolicy(rate=float(args.rate), chunk=8, value_dtype=args.value_dtype,
                                                 replicator=args.replicator),
                   guards=GuardPolicy(drift_check_every=0),
                   outer=OuterPolicy(delay=int(args.outer_delay), fragments=1, progress_scale=args.progress_scale,
                                     progress_scale_estimate=args.progress_scale_estimate,
                                     progress_scale_path=args.progress_scale_path))
    logs, stats, after_exchange, parts = [], [], [], parts_of(args)
    for step in range(3 * int(args.local_steps)):  # the first round unobserved: it creates the state
        log = {"collectives": [], "syncs": []}
        for part in range(parts):  # each micro-batch's reduce inside the node unobserved: FSDP2's
            model(**batch(parts * step + part, dist.get_rank())).loss.backward()
            with observed(log, {id(state["step"]) for state in opt.state.values()}):
                opt.observe_micro_batch(last=part == parts - 1)
        with observed(log, {id(state["step"]) for state in opt.state.values()}):
            opt.step()
        opt.zero_grad()
        if step >= opt.options["local_steps"]:
            logs.append(log)
            stats.append(opt.comm_stats)
        rounds, streaming = opt.options["local_steps"], args.overlap == "delayed"
        landed = (opt.steps % rounds == int(args.outer_delay) % rounds and opt.steps > rounds if streaming
                  else opt.steps % rounds == 0)
        if landed:  # the anchor an exchange just moved (streaming: where every replica restarted in this step)
            with opt.consensus_parameters():
                after_exchange.append({n: full(p) for n, p in model.named_parameters()})
    shapes = [tuple(local(p).shape) for p in model.parameters()]
    return finished({"logs": logs, "comm_stats": stats, "after_exchange": after_exchange, "local_shapes": shapes,
                     "replicas": dist.get_world_size(group), "outer_lr": opt.options["outer_lr"]},
                    opt)  # streamed: the last round's exchange in flight


def case_resume(args) -> dict:
    """2H straight steps vs H + 1 steps, ``state_dict`` through bytes into a fresh optimizer built with other knobs
    (the parameters overwritten, as a checkpoint of one replica's would), then the rest: bitwise equal. (Streaming
    with outer_delay 2: saved while round 1's exchange is in flight.)"""
    rounds = int(args.local_steps)
    kwargs = dict(lr=3e-3, local_steps=rounds, value_dtype=args.value_dtype, replicator=args.replicator,
                  outer_lr=0.7, outer_momentum=0.9,
                  compression_rate=float(args.rate), compression_chunk=8, overlap=args.overlap,
                  outer_delay=int(args.outer_delay), progress_scale=args.progress_scale,
                  progress_scale_decay=decay_of(args), progress_scale_estimate=args.progress_scale_estimate,
                  progress_scale_path=args.progress_scale_path,
                  drift_check_every=1)  # the exact check, wherever replicas agree (streaming: in the landing step)
    parts = parts_of(args)

    def train(model, opt, steps):
        for step in steps:
            for part in range(parts):
                model(**batch(parts * step + part, dist.get_rank())).loss.backward()
                opt.observe_micro_batch(last=part == parts - 1)
            opt.step()
            opt.zero_grad()

    model, group = sharded(procs_per_node(args.topology))
    straight = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs(kwargs))
    train(model, straight, range(2 * rounds))
    expected = {n: full(p) for n, p in model.named_parameters()}
    straight.finish()  # streamed (overlap="delayed"): the last round's exchange in flight
    model, group = sharded(procs_per_node(args.topology))
    first = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs(kwargs))
    train(model, first, range(rounds + 1))
    saved = through_bytes(first.state_dict())
    with torch.no_grad():
        for p in model.parameters():
            local(p).fill_(0.5)
    resumed = FlexDeMo(model.parameters(), replicate_group=group, lr=1.0)
    resumed.load_state_dict(saved)
    train(model, resumed, range(rounds + 1, 2 * rounds))
    return finished({"keys": sorted(saved["state"][0]), "options": resumed.options,
                     "equal": all(torch.equal(expected[n], full(p)) for n, p in model.named_parameters())}, resumed)


def case_finals(args) -> dict:
    """Every value in float32 on ``args.replicator``'s wire, streamed: 2 rounds and a step (an exchange in flight),
    then ``finish()`` on the compressed wire, and from the same ``state_dict`` on the dense one. On the uncompressed
    wire both end at the same model (``replicator="owner"``: two exchanges, or the pipeline handed back first)."""
    rounds = int(args.local_steps)
    kwargs = dict(lr=3e-3, local_steps=rounds, value_dtype="float32", replicator=args.replicator, compression_rate=1.0,
                  compression_chunk=8, compression_transform="none", overlap="delayed", outer_delay=1)
    model, group = sharded(procs_per_node(args.topology))
    opt = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs(kwargs))
    for step in range(2 * rounds + 1):
        model(**batch(step, dist.get_rank())).loss.backward()
        opt.step()
        opt.zero_grad()
    saved, params = through_bytes(opt.state_dict()), [local(p).detach().clone() for p in model.parameters()]
    with opt.consensus_parameters():
        before = {n: full(p) for n, p in model.named_parameters()}
    ended = {}
    for final in ("compressed", "dense"):
        with torch.no_grad():
            for p, value in zip(model.parameters(), params):
                local(p).copy_(value)
        again = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs(kwargs))
        again.load_state_dict(saved)
        again.finish(final=final)
        ended[final] = {n: full(p) for n, p in model.named_parameters()}
    return {"before": before, **ended}


def case_lean(args) -> dict:
    """Every node on the same data, every value in float32: ``args.replicator`` and ``replicator="demo"`` from the
    same model, the full parameters after every step and after ``finish()``. A wire that lands a round late, whose
    replicas lean on their own shares, walks the same trajectory as one that lands at once."""
    rounds, procs = int(args.local_steps), procs_per_node(args.topology)
    kwargs = dict(lr=3e-3, local_steps=rounds, value_dtype="float32", compression_rate=1.0, compression_chunk=8,
                  compression_transform="none", overlap=args.overlap, outer_lr=0.7, outer_delay=1)
    walked = {}
    for replicator in (args.replicator, "demo"):
        model, group = sharded(procs)
        opt = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs({**kwargs, "replicator": replicator}))
        steps = []
        for step in range(3 * rounds + 1):
            model(**batch(step, dist.get_rank() % procs)).loss.backward()  # a node's data: the same on every node
            opt.step()
            opt.zero_grad()
            steps.append({n: full(p) for n, p in model.named_parameters()})
        opt.finish()
        walked[replicator] = {"steps": steps, "final": {n: full(p) for n, p in model.named_parameters()},
                              "keys": sorted({k for state in opt.state.values() for k in state})}
    return walked


def case_nonfinite(args) -> dict:
    """The defaults (streamed local steps): rank 1's gradient is NaN at step ``bad``; every rank skips that round
    once and trains on. The anchors (what replicas share) after it and at the end, and whether all state is finite."""
    model, group = sharded()
    opt = FlexDeMo(model.parameters(), replicate_group=group, lr=1e-3, compression=CompressionPolicy(chunk=8),
                   guards=GuardPolicy(drift_check_every=1))
    rounds, anchors = opt.options["local_steps"], []
    for step in range(4 * rounds):
        model(**batch(step, dist.get_rank())).loss.backward()
        if step == int(args.bad) and dist.get_rank() == 1:
            next(model.parameters()).grad.to_local().view(-1)[0] = float("nan")
        opt.step()
        opt.zero_grad()
        if step in (2 * rounds, 4 * rounds - 1):
            with opt.consensus_parameters():
                anchors.append({n: full(p) for n, p in model.named_parameters()})
    tensors = [t for s in opt.state.values() for t in s.values() if t.is_floating_point()]
    finite = all(bool(t.isfinite().all()) for t in [*tensors, *(local(p) for p in model.parameters())])
    return finished({"skipped": opt.skipped_steps, "anchors": anchors, "finite": finite},
                    opt)  # streamed: the last round's exchange in flight


if __name__ == "__main__":
    main(globals(), {"steps": "6", "local_steps": "3", "topology": "2x2", "value_dtype": "int2", "overlap": "none",
                     "outer_delay": "1", "bad": "5", "rate": "0.25", "replicator": "demo",
                     "progress_scale": "none", "progress_scale_decay": "none",
                     "progress_scale_estimate": "consecutive", "progress_scale_path": "own"})
