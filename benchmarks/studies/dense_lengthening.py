"""In the dense limit, does ``progress_scale="batch"`` turn the mean of R nodes' AdamW steps into AdamW's step on their
mean gradient, as its factor is meant to?

Every step of the dense step-wise rule, each of R nodes takes AdamW's step on its own batch at the shared weights and
the weights move by the mean of those steps. On a noisy element that mean is up to sqrt(R) shorter than AdamW's step
on the nodes' mean gradient, and ``progress_scale="batch"`` lengthens each node's step by ``f = sqrt(R v / (v + (R - 1)
s))``. With the true signal this is ``sqrt(v / v_mean)``, ``v_mean`` the second moment of the nodes' mean gradient, and
the mean of the lengthened steps is AdamW's step on that mean, up to each node clipping its own gradient. This trains
the quick model in one process on R simulated nodes of ``--batch`` sequences (lr 3e-3, warmup 100, linear decay over
2,000 steps, clip 1.0: the horizon preset's), four ways from one initialisation and one data order. With ``--rounds H``
each node takes H steps from the anchor at its own weights (its own path unlengthened, as ``progress_scale`` keeps it,
or lengthened too with ``--lengthen_path``) before the anchor moves by the mean of their lengthened progress and every
node restarts from it, a round waited for; at the default of 1 every node is at the same weights each step:

* ``adamw``: torch's AdamW on the nodes' mean gradient, clipped as one (AdamW-HSDP);
* ``oracle``: each node's step lengthened by ``sqrt(v / v_mean)``, ``v_mean`` an EMA of the square of the mean of the
  nodes' clipped gradients: algebraically AdamW on that mean, so it differs from ``adamw`` by the clipping alone;
* ``estimated``: lengthened as ``progress_scale="batch"`` does, ``s`` from the node's consecutive gradients;
* ``mean``: not lengthened (the dense step-wise rule).

Each row is a way's validation loss at a checkpoint; for ``estimated`` also the mean over the elements, weighted by the
size of the node's step, of ``f`` and of the oracle's factor on the same weights (``f_estimated``, ``f_oracle``).

    python -m benchmarks.studies.dense_lengthening   # ~20 minutes on 2 cores, writes
                                                     # benchmarks/results/dense_lengthening.json
    python -m benchmarks.studies.dense_lengthening --rounds 2 --ways estimated oracle mean \
        --out benchmarks/results/dense_lengthening_rounds2.json
    python -m benchmarks.studies.dense_lengthening --rounds 2 --lengthen_path --ways estimated oracle \
        --out benchmarks/results/dense_lengthening_rounds2_path.json
    python -m benchmarks.studies.dense_lengthening --rounds 8 --at 200 400 --ways estimated mean \
        --out benchmarks/results/dense_lengthening_rounds8.json
    python -m benchmarks.studies.dense_lengthening --rounds 8 --at 200 400 --lengthen_path --ways estimated \
        --out benchmarks/results/dense_lengthening_rounds8_path.json
    python -m benchmarks.studies.dense_lengthening --at 200 400 600 800 1000 1200 1400 1600 1800 2000 \
        --ways adamw estimated mean --out benchmarks/results/dense_lengthening_long.json   # ~60 minutes
    python -m benchmarks.studies.dense_lengthening --at 200 400 600 800 1000 1200 1400 1600 1800 2000 \
        --ways oracle --out benchmarks/results/dense_lengthening_long_oracle.json           # ~22 minutes

A study (``benchmarks/studies/README.md``): its figures are in docs/results.md ("Weak scaling").
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.studies.length_factor import BETA2, HORIZON, LR, WARMUP, quick_splits, quick_training
from hf_flexdemo.optim.progress_scale import length_factors

WAYS = ("adamw", "oracle", "estimated", "mean")
BETA1, EPS, CLIP = 0.9, 1e-8, 1.0


class Nodes:
    """R nodes' AdamW moments, own weights and (lengthened) progress in the round, and the lengthening's EMAs, per
    parameter; the anchor they restart from after each round."""

    def __init__(self, params: list[torch.Tensor], nodes: int, lengthen_path: bool = False) -> None:
        def zeros() -> list[list[torch.Tensor]]:
            return [[torch.zeros_like(p) for p in params] for _ in range(nodes)]

        self.m, self.v, self.lag, self.prev, self.moved = zeros(), zeros(), zeros(), zeros(), zeros()
        self.anchor = [p.detach().clone() for p in params]
        self.local = [[p.detach().clone() for p in params] for _ in range(nodes)]
        self.v_mean = [torch.zeros_like(p) for p in params]
        self.lengthen_path = lengthen_path  # each node's own weights move by its lengthened step too

    def step(self, grads: list[list[torch.Tensor]], t: int, lr: float, way: str, weights: list[float]) -> None:
        """Each node's AdamW step on its clipped ``grads`` at its own weights; its progress in the round grows by the
        step, lengthened by ``way``'s factor."""
        nodes = len(grads)
        for i in range(len(self.anchor)):
            mean = sum(g[i] for g in grads) / nodes
            self.v_mean[i].mul_(BETA2).addcmul_(mean, mean, value=1 - BETA2)
            for r, g in enumerate(grads):
                m, v = self.m[r][i], self.v[r][i]
                m.mul_(BETA1).add_(g[i], alpha=1 - BETA1)
                v.mul_(BETA2).addcmul_(g[i], g[i], value=1 - BETA2)
                v_hat = v / (1 - BETA2**t)
                step = lr * (m / (1 - BETA1**t)) / (v_hat.sqrt() + EPS)
                moved = step * self.factor(r, i, g[i], v_hat, t, way, step, weights)
                self.local[r][i].sub_(moved if self.lengthen_path else step)
                self.moved[r][i].add_(moved)

    def factor(self, r: int, i: int, g: torch.Tensor, v_hat: torch.Tensor, t: int, way: str, step: torch.Tensor,
               weights: list[float]) -> torch.Tensor | float:
        """How much longer node ``r``'s step on parameter ``i`` enters its progress, by ``way``."""
        if way == "mean":
            return 1.0
        oracle = (v_hat / (self.v_mean[i] / (1 - BETA2**t)).clamp_min(1e-30)).sqrt()
        if way == "oracle":
            return oracle
        if t >= 2:
            self.lag[r][i].mul_(BETA2).addcmul_(g, self.prev[r][i], value=1 - BETA2)
        self.prev[r][i].copy_(g)
        estimated = (length_factors([v_hat], [self.lag[r][i] / (1 - BETA2 ** (t - 1))], len(self.local))[0]
                     if t >= 2 else torch.ones_like(g))
        weight = step.abs()
        weights[0] += float((weight * estimated).sum())
        weights[1] += float((weight * oracle).sum())
        weights[2] += float(weight.sum())
        return estimated

    def land(self) -> None:
        """The round ends: the anchor moves by the mean of the nodes' progress and every node restarts from it."""
        for i, anchor in enumerate(self.anchor):
            anchor.sub_(sum(moved[i] for moved in self.moved) / len(self.moved))
            for local, moved in zip(self.local, self.moved):
                local[i].copy_(anchor)
                moved[i].zero_()


def load(model: torch.nn.Module, weights: list[torch.Tensor]) -> None:
    with torch.no_grad():
        torch._foreach_copy_(list(model.parameters()), weights)


def node_gradients(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]],
                   local: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Each node's gradient on its batch at its own weights, clipped to norm ``CLIP`` as its own Trainer clips it."""
    grads = []
    for batch, weights in zip(batches, local):
        load(model, weights)
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        grads.append([p.grad.detach().clone() for p in model.parameters()])
    return grads


def train(way: str, args: argparse.Namespace, data: tuple[object, dict[str, object], object]) -> list[dict]:
    tokenizer, splits, collate = data
    model, adamw, schedule, order = quick_training(tokenizer, args.seed)
    params = list(model.parameters())
    nodes = Nodes(params, args.nodes, args.lengthen_path)
    train_split, validation = splits["train"], splits["validation"]
    held_out = [collate([validation[i] for i in range(start, min(start + 64, args.validation))])
                for start in range(0, args.validation, 64)]
    rows, weights = [], [0.0, 0.0, 0.0]
    for t in range(1, max(args.at) + 1):
        batches = [collate([train_split[i] for i in torch.randint(len(train_split), (args.batch,),
                                                                  generator=order).tolist()])
                   for _ in range(args.nodes)]
        if way == "adamw":
            model.zero_grad(set_to_none=True)
            for batch in batches:
                (model(**batch).loss / args.nodes).backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            adamw.step()
        else:
            grads = node_gradients(model, batches, nodes.local)
            with torch.no_grad():
                nodes.step(grads, t, schedule.get_last_lr()[0], way, weights)
                if t % args.rounds == 0:
                    nodes.land()
                    load(model, nodes.anchor)
        schedule.step()
        if t in args.at:
            with torch.no_grad():
                loss = sum(float(model(**batch).loss) for batch in held_out) / len(held_out)
            row = {"way": way, "step": t, "eval_loss": loss}
            if way == "estimated":
                row |= {"f_estimated": weights[0] / weights[2], "f_oracle": weights[1] / weights[2]}
                weights = [0.0, 0.0, 0.0]
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="sequences per node and step")
    parser.add_argument("--at", type=int, nargs="+", default=[100, 200, 300, 400], help="checkpoint steps")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--rounds", type=int, default=1, help="steps each node takes from the anchor before the mean "
                        "of their progress moves it (1: the dense step-wise rule; adamw's way has no rounds)")
    parser.add_argument("--lengthen_path", action="store_true", help="each node's own weights move by its lengthened "
                        "step too, so that its later steps in a round are taken where the mean has moved")
    parser.add_argument("--validation", type=int, default=512, help="validation pairs the loss is taken on")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "dense_lengthening.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    if args.rounds < 1 or any(step % args.rounds for step in args.at):
        parser.error(f"--rounds {args.rounds}: checkpoints fall at the ends of rounds; pass --at steps that are "
                     "multiples of a positive --rounds")
    bench = harness.Run.start(args.out, args.allow_dirty)
    # the schedule only gives the nodes' lr where torch's AdamW does not step
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
    data = quick_splits(args.seed)
    rows = [row for way in args.ways for row in train(way, args, data)]
    bench.write(args.out, {"lr": LR, "warmup": WARMUP, "horizon": HORIZON, "nodes": args.nodes, "batch": args.batch,
                           "rounds": args.rounds, "lengthen_path": args.lengthen_path, "validation": args.validation,
                           "seed": args.seed, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
