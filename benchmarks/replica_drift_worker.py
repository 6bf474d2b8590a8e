"""Two replicas of a tiny T5 whose second node's inverse DCT rounds differently; see ``replica_drift.py``.

Runs under ``torchrun --nproc_per_node 2`` (two nodes of one process each, so every rank is a replica). On rank 1
the blockwise inverse DCT (the decode of the consensus ``Q`` and the error feedback's estimate) returns its result
moved by one unit in the last place (``torch.nextafter``) on a ``--fraction`` of its non-zero elements, up or down at
random: what a GPU of another model, whose GEMMs round differently, does (an exact zero, a block nobody sent, stays
zero on any hardware; ``hf_flexdemo.testing.unlike_inverse_dct``, the emulation the tests use too). Every
``--every`` steps the ranks gather their parameters (outside the optimizer, for the measurement only) and rank 0
records how far they are apart. Each ``--updates`` rule runs under each ``--policies`` drift policy (``none``: no
check, the free drift); rank 0 writes one JSON record per run to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import T5ForConditionalGeneration

from hf_flexdemo import FlexDeMo
from hf_flexdemo.knobs import DRIFT_ACTIONS, UPDATES
from hf_flexdemo.policies import CompressionPolicy, GuardPolicy, StepRulePolicy
from hf_flexdemo.seq2seq.tiny_t5 import tiny_t5_config
from hf_flexdemo.testing import unlike_inverse_dct

VOCAB = 32


def batch(step: int, rank: int) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(1, VOCAB, (8, 12), generator=generator)
    return {"input_ids": ids, "labels": ids.flip(1)}


def ulp(x: Tensor) -> Tensor:
    """The spacing of ``x``'s dtype at ``|x|``."""
    magnitude = x.abs()
    return torch.nextafter(magnitude, torch.full_like(magnitude, math.inf)) - magnitude


def apart(model: torch.nn.Module, lr: float) -> dict[str, float]:
    """How far the two replicas' parameters are apart (every rank calls it; rank 0's answer is the record)."""
    flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    first, second = gathered
    diff = (second - first).abs()
    return {"max_abs": diff.max().item(), "max_over_lr": diff.max().item() / lr,
            "max_ulps": (diff / ulp(first)).max().item(), "rms": diff.square().mean().sqrt().item(),
            "fraction_differing": (diff > 0).float().mean().item()}


def run(update: str, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--steps`` steps of one update rule under one drift policy (``"none"``: no check, the free drift)."""
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(tiny_t5_config(VOCAB, d_model=32, num_layers=2, num_heads=4, d_ff=64))
    every = 0 if policy == "none" else args.drift_check_every
    opt = FlexDeMo(model.named_parameters(), lr=args.lr, replicate_group=dist.group.WORLD, local_steps=1,
                   step_rule=StepRulePolicy(update=update), compression=CompressionPolicy(chunk=8),
                   guards=GuardPolicy(drift_check_every=every, on_drift="raise" if policy == "none" else policy))
    rank, trajectory, checks, check_bytes, step_bytes, losses = dist.get_rank(), [], [], 0, 0, []
    record: dict[str, Any] = {"update": update, "policy": policy, "lr": args.lr, "drift_check_every": every,
                              "drift_tolerance": opt.options["drift_tolerance"], "error": None, "stopped_at": None}
    start = time.perf_counter()
    for step in range(args.steps):
        loss = model(**batch(step, rank)).loss
        loss.backward()
        checking = every and step % every == 0
        try:
            opt.step()
        except RuntimeError as exc:
            record |= {"error": str(exc), "stopped_at": step}
            break
        opt.zero_grad()
        losses.append(loss.item())
        if checking and opt.replica_drift:
            checks.append({"step": step, **opt.replica_drift})
        if checking:
            check_bytes = opt.comm_stats["bytes_sent"]
        else:
            step_bytes = opt.comm_stats["bytes_sent"]
        if (step + 1) % args.every == 0:
            trajectory.append({"step": step + 1, **apart(model, args.lr)})
    record |= {"seconds": time.perf_counter() - start, "first_loss": losses[0], "last_loss": losses[-1],
               "bytes_sent_per_step": step_bytes, "bytes_sent_checking_step": check_bytes,
               "trajectory": trajectory, "optimizer_checks": checks}
    if trajectory:
        record["worst"] = {key: max(row[key] for row in trajectory) for key in trajectory[0] if key != "step"}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--updates", nargs="+", default=["sgd"], choices=UPDATES)
    parser.add_argument("--policies", nargs="+", default=["none"], choices=("none", *DRIFT_ACTIONS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10, help="steps between two measurements of the drift")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--fraction", type=float, default=1.0, help="of the inverse DCT's outputs moved by one ulp")
    parser.add_argument("--drift_check_every", type=int, default=50)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    unlike = dist.get_rank() == 1 and args.fraction > 0
    with unlike_inverse_dct(args.fraction, seed=1) if unlike else contextlib.nullcontext():
        records = [run(update, policy, args) for update in args.updates for policy in args.policies]
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps(records, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
