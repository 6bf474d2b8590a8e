"""Multi-rank checks of FlexDeMo; each rank saves what the test asserts on to OUT/rank{r}.pt."""

from __future__ import annotations

import argparse
import copy
import io
from pathlib import Path

import torch
import torch.distributed as dist
from reference import import_detonation, reference_demo_step, reference_update
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


def t5_batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(1, VOCAB_SIZE, (4, 12), generator=g)
    return {"input_ids": ids, "labels": ids.flip(1)}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 12), nn.Tanh(), nn.Linear(12, 6), nn.Tanh(), nn.Linear(6, 3))


def mlp_loss(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 10, generator=g), torch.randn(8, 3, generator=g)
    return ((model(x) - y) ** 2).mean()


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train_t5(steps: int, shard_size: int, **opt_kwargs):
    mesh = build_hybrid_mesh(shard_size=shard_size)
    model = shard_model(tiny_t5(), mesh)
    opt = step_wise(model.parameters(), replicate_group=mesh["dp_replicate"].get_group(), **opt_kwargs)
    losses = []
    for step in range(steps):
        loss = model(**t5_batch(step, dist.get_rank())).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return mesh, model, opt, losses


def case_replicas(args) -> dict:
    """2 x 2: train a sharded tiny T5 and report full parameters, shard shapes and traffic."""
    _, model, opt, losses = train_t5(args.steps, 2, lr=3e-3, compression_topk=2, compression_chunk=8,
                                     value_dtype=args.value_dtype)
    return {
        "params": {n: full(p) for n, p in model.named_parameters()},
        "local_shapes": [tuple(p.to_local().shape) for p in model.parameters()],
        "comm_stats": opt.comm_stats,
        "losses": losses,
        "initial": {n: p.detach().clone() for n, p in tiny_t5().named_parameters()},
    }


def mean_gradient(reference: nn.Module, step: int, world: int) -> list[torch.Tensor]:
    grads = None
    for rank in range(world):
        reference.zero_grad()
        mlp_loss(reference, step, rank).backward()
        local = [p.grad.clone() for p in reference.parameters()]
        grads = local if grads is None else [a + b for a, b in zip(grads, local)]
    return [g / world for g in grads]


def case_dense_limit(args) -> dict:
    """2 x 2, no compression: FlexDeMo must equal the dense rule on the global mean gradient.

    ``replicator="demo"``: top-k = whole block and decay 0; ``"full"``: the dense momentum average, which
    is spent every step, so its decay (0.9 here) never acts.
    """
    mesh = build_hybrid_mesh(shard_size=2)
    model = mlp()
    reference = copy.deepcopy(model)
    shard_model(model, mesh)
    lr, wd = 0.05, 0.1
    opt = step_wise(model.parameters(), lr=lr, weight_decay=wd, replicate_group=mesh["dp_replicate"].get_group(),
                   compression_topk=64 * 64, momentum_decay=0.0 if args.replicator == "demo" else 0.9,
                   update=args.update, replicator=args.replicator, value_dtype="float32", momentum="lr")
    dense = {"sgd": torch.optim.SGD(reference.parameters(), lr=lr, weight_decay=0.0),
             "adamw": torch.optim.AdamW(reference.parameters(), lr=lr, weight_decay=wd),
             "sign": None}[args.update]
    grads_log = []
    for step in range(3):
        mlp_loss(model, step, dist.get_rank()).backward()
        opt.step()
        opt.zero_grad()
        grads = mean_gradient(reference, step, dist.get_world_size())
        grads_log.append(grads)
        with torch.no_grad():
            if dense is None:
                for p, g in zip(reference.parameters(), grads):
                    p.mul_(1 - lr * wd).sub_(lr * g.sign())
            else:
                if args.update == "sgd":
                    for p in reference.parameters():
                        p.mul_(1 - lr * wd)
                for p, g in zip(reference.parameters(), grads):
                    p.grad = g
                dense.step()
    return {"flexdemo": [full(p) for p in model.parameters()],
            "dense": [p.detach().clone() for p in reference.parameters()],
            "grads": grads_log, "comm_stats": opt.comm_stats,
            "local_numel": sum(local(p).numel() for p in model.parameters())}


SHARD_SIZES = {"one_node": 4, "two_by_two": 2, "one_rank_per_node": 1}


def case_reference(args) -> dict:
    """FlexDeMo against the naive float64 DeMo of ``reference.py``, compression on, on one topology:
    one node (R=1, FSDP over 4 ranks), 2 x 2, or one rank per node (S=1, plain DeMo over 4 replicas)."""
    shard_size = SHARD_SIZES[args.topology]
    mesh = build_hybrid_mesh(shard_size=shard_size)
    replicas = mesh["dp_replicate"]
    rank = dist.get_rank()
    model = mlp()
    if shard_size > 1:
        shard_model(model, mesh)
    lr = {"sign": 0.01, "sgd": 0.5, "adamw": 0.01}[args.update]
    topk, chunk, decay = 3, 4, 0.9
    opt = step_wise(model.parameters(), lr=lr, replicate_group=replicas.get_group(), compression_topk=topk,
                   compression_chunk=chunk, momentum_decay=decay, update=args.update, value_dtype="float32",
                   momentum="lr", consensus=args.consensus,  # DeMo's momentum, as the reference computes it
                   replicator="none" if replicas.size() == 1 else "demo")  # one node: the wire emulated
    params = [local(p) for p in model.parameters()]
    deltas = [[torch.zeros_like(p, dtype=torch.float64)] * replicas.size() for p in params]
    adam_states: list[dict] = [{} for _ in params]
    for step in range(3):
        mlp_loss(model, step, rank).backward()
        local_grads = [local(p.grad).clone() for p in model.parameters()]
        gathered = [[torch.empty_like(g) for _ in range(replicas.size())] for g in local_grads]
        for out, g in zip(gathered, local_grads):
            dist.all_gather(out, g, group=replicas.get_group())
        before = [p.detach().clone() for p in params]
        expected, q_ref = [], []
        for i, (param, grads) in enumerate(zip(before, gathered)):
            if not param.numel():
                expected.append(param.double())
                q_ref.append(param.double())
                continue
            deltas[i], q = reference_demo_step(grads, deltas[i], lr, topk, chunk, decay, consensus=args.consensus)
            expected.append(reference_update(param, q, lr, args.update, adam_states[i]))
            q_ref.append(q)
        opt.step()
        opt.zero_grad()
    return {"flexdemo": [p.detach().clone() for p in params], "expected": expected, "q": q_ref,
            "bytes_sent": opt.comm_stats["bytes_sent"], "collectives": opt.comm_stats["collectives"],
            "delta": [opt.state[p]["delta"].clone() for p in model.parameters()],
            "delta_expected": [d[replicas.get_local_rank()] for d in deltas]}


def case_replicator_none(args) -> dict:
    """2 x 2: ``replicator="none"`` on a replicate group of 2 must be refused at construction."""
    mesh = build_hybrid_mesh(shard_size=2)
    try:
        step_wise(mlp().parameters(), replicate_group=mesh["dp_replicate"].get_group(), replicator="none")
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None}


def case_detonation(args) -> dict:
    """FlexDeMo against the authors' ``detonation`` (DeToSGD + DeMoReplicator, DDP mode: sharding groups of 1)
    on ranks {0, 1} and {2, 3}: two 2-rank plain-DeMo jobs, the same tiny T5, the same random gradients."""
    try:
        de_to_sgd, demo_replicator = import_detonation()
    except ImportError as err:
        return {"skip": f"detonation is not importable ({err}); it is in the bench extra: pip install -e .[bench]"}
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pair = pairs[rank // 2]
    single, _ = dist.new_subgroups(group_size=1)
    lr, topk, chunk = 1e-3, 4, 8  # the preset's 4 of each 8 x 8 block
    ours, theirs = tiny_t5(), tiny_t5()
    opt = step_wise(ours.parameters(), lr=lr, replicate_group=pair, preset="flexdemo-paper")  # DeToSGD's rule
    reference = de_to_sgd(list(theirs.parameters()), lr=lr, replicator=demo_replicator(
        compression_topk=topk, compression_chunk=chunk), sharding_parallel_group=single,
        replication_parallel_group=pair)
    generator = torch.Generator().manual_seed(7 + rank)
    for _ in range(args.steps):
        for a, b in zip(ours.parameters(), theirs.parameters()):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        opt.step()
        reference.step()
    return {"ours": {n: p.detach().clone() for n, p in ours.named_parameters()},
            "theirs": {n: p.detach().clone() for n, p in theirs.named_parameters()},
            "initial": {n: p.detach().clone() for n, p in tiny_t5().named_parameters()},
            "delta_ours": {n: opt.state[p]["delta"].clone() for n, p in ours.named_parameters()},
            "delta_theirs": {n: reference.state[p]["demo_delta"].clone() for n, p in theirs.named_parameters()},
            "lr": lr}


def case_resume(args) -> dict:
    """2 x 2: 2N straight steps vs N steps, state_dict through bytes into a fresh optimizer, N more."""
    n, rank = args.steps, dist.get_rank()
    kwargs = dict(lr=3e-3, compression_topk=2, compression_chunk=8, update=args.update)
    _, straight, _, _ = train_t5(2 * n, 2, **kwargs)

    mesh, first, opt, _ = train_t5(n, 2, **kwargs)
    blob = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "model": {k: v.to_local() for k, v in first.state_dict().items()}}, blob)
    blob.seek(0)
    saved = torch.load(blob, weights_only=True)

    resumed = shard_model(tiny_t5(), mesh)
    with torch.no_grad():
        for name, p in resumed.named_parameters():
            p.to_local().copy_(saved["model"][name])
    opt2 = step_wise(resumed.parameters(), replicate_group=mesh["dp_replicate"].get_group(), **kwargs)
    opt2.load_state_dict(saved["optimizer"])
    for step in range(n, 2 * n):
        resumed(**t5_batch(step, rank)).loss.backward()
        opt2.step()
        opt2.zero_grad()
    return {"straight": {k: full(v) for k, v in straight.named_parameters()},
            "resumed": {k: full(v) for k, v in resumed.named_parameters()},
            "delta_dtypes": {str(s["delta"].dtype) for s in opt2.state.values()}}


def case_drift(args) -> dict:
    """2 x 2: perturb one parameter on node 1; the next check must catch it (raise) or repair it (resync)."""
    mesh = build_hybrid_mesh(shard_size=2)
    model = shard_model(tiny_t5(), mesh)
    opt = step_wise(model.named_parameters(), lr=1e-3, replicate_group=mesh["dp_replicate"].get_group(),
                   compression_topk=2, compression_chunk=8, drift_check_every=2, on_drift=args.action)
    error, step = train_perturbed(model, opt, lambda step, rank: model(**t5_batch(step, rank)).loss, 1e-3)
    return {"error": error, "step": step, "params": {n: full(p) for n, p in model.named_parameters()}}


def train_perturbed(model, opt, loss, amount: float) -> tuple[str | None, int]:
    """6 steps of ``loss(step, rank)``; before step 3 node 1 (rank 2) adds ``amount`` to one weight of the first
    parameter. The error a step raised (training stops there) and the last step."""
    rank, error = dist.get_rank(), None
    for step in range(6):
        if step == 3 and rank == 2:
            with torch.no_grad():
                next(model.parameters()).to_local()[0, 0] += amount
        loss(step, rank).backward()
        try:
            opt.step()
        except RuntimeError as exc:
            error = str(exc)
            break
        opt.zero_grad()
    return error, step


def case_nonfinite(args) -> dict:
    """2 x 2: rank 1 gets a NaN gradient at step 2; every rank must skip that step, or every rank raise."""
    mesh = build_hybrid_mesh(shard_size=2)
    model = shard_model(tiny_t5(), mesh)
    opt = step_wise(model.parameters(), lr=1e-3, replicate_group=mesh["dp_replicate"].get_group(),
                   compression_topk=2, compression_chunk=8, on_nonfinite=args.action)
    rank, error, before = dist.get_rank(), None, None
    for step in range(4):
        model(**t5_batch(step, rank)).loss.backward()
        if step == 2:
            before = {n: full(p) for n, p in model.named_parameters()}
            if rank == 1:
                next(model.parameters()).grad.to_local().view(-1)[0] = float("nan")
        try:
            opt.step()
        except FloatingPointError as exc:
            error = str(exc)
            break
        opt.zero_grad()
        if step == 2:
            unchanged = all(torch.equal(before[n], full(p)) for n, p in model.named_parameters())
    return {"error": error, "skipped": opt.skipped_steps, "unchanged_at_skip": error is None and unchanged,
            "params": {n: full(p) for n, p in model.named_parameters()},
            "deltas_finite": all(bool(s["delta"].isfinite().all()) for s in opt.state.values())}


def main() -> None:
    """``--case name,key=value,...`` (repeatable): run each case, save ``{case string: result}``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", action="append", required=True)
    init_process_group("cpu")
    results = {}
    for spec in parser.parse_args().case:
        name, *options = spec.split(",")
        defaults = {"steps": "50", "update": "sign", "topology": "one_node", "value_dtype": "bfloat16",
                    "action": "raise", "replicator": "demo", "consensus": "choosers"}
        options = {**defaults, **dict(o.split("=") for o in options)}
        options["steps"] = int(options["steps"])
        results[spec] = globals()[f"case_{name}"](argparse.Namespace(**options))
    torch.save(results, parser.parse_args().out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
