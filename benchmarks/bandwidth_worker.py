"""One rank of the bandwidth benchmark (launched by ``bandwidth.py`` with ``torchrun``, 2 nodes x 2 ranks).

Probes the link with a plain gloo all-reduce, then trains the same T5 on random tokens with each method in
turn: warm-up steps, then timed steps. FlexDeMo methods also record, per timed step, the seconds the step
waited for its inter-node collectives (``pop_exchange_seconds``), the collectives issued and the rate in use.
Global rank 0 sits on node 0 and reads node 0's end of the veth pair, whose counters hold every byte that
crossed between the nodes; it writes the results as JSON after every method, so a run cut short keeps what
it measured.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import harness
import torch
import torch.distributed as dist
from emulated_link import read_counters
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration

from hf_flexdemo import FlexDeMo, build_hybrid_mesh, shard_model
from hf_flexdemo.policies import from_knobs
from hf_flexdemo.seq2seq.tiny_t5 import T5_VOCAB_SIZE, named_t5_config
from hf_flexdemo.wire.collectives import dense_allreduce_bytes

METHODS = ("adamw", "demo", "flexdemo", "flexdemo_step_wise", "flexdemo_backward", "flexdemo_delayed",
           "flexdemo_random", "flexdemo_budget", "flexdemo_full", "compute_only", "flexdemo_budget_backward",
           "flexdemo_budget_delayed")
DEFAULT_METHODS = METHODS[:-2]  # the time budget with overlap="backward" / "delayed": on request only
# --model -> (configuration name of hf_flexdemo.seq2seq.tiny_t5, where the published shapes are; vocabulary size)
MODEL_SHAPES = {"t5-small": ("t5-small", T5_VOCAB_SIZE), "t5-tiny": ("tiny", 4096)}
NODES = 2
RANKS_PER_NODE = 2
T = TypeVar("T")


@dataclass
class Setup:
    """A method ready to train: the (possibly sharded) model, its optimizer, and its own traffic count.

    ``reported_bytes`` returns the inter-node bytes this rank put on the wire in the last step, as the
    method itself accounts them (FlexDeMo's ``comm_stats``, or the FSDP all-reduce formula for AdamW).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    reported_bytes: Callable[[], float]
    source: str
    options: dict[str, object] = field(default_factory=dict)  # FlexDeMo keywords beyond lr and the group


def flexdemo_options(method: str, args: argparse.Namespace) -> dict[str, object]:
    """The FlexDeMo keywords of ``method``: the package defaults, the driver's ``--flexdemo FIELD=VALUE`` fields
    (``args.flexdemo``), then the variant's own. ``demo`` is DeMo's published rule and density (the ``demo-paper``
    preset, as in ``convergence.py``); the step-wise mode's mechanisms (overlap with backward, one step of delay, a
    time budget) run with ``local_steps=1``; ``random``, ``full`` and ``compute_only`` on the defaults."""
    step_wise = {"local_steps": 1}
    buckets = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    variant: dict[str, object] = {
        "demo": {"preset": "demo-paper"},
        "flexdemo_step_wise": step_wise,
        "flexdemo_backward": {**step_wise, "overlap": "backward", **buckets},
        "flexdemo_delayed": {**step_wise, "overlap": "delayed"},
        "flexdemo_random": {"replicator": "random"},
        "flexdemo_budget": {**step_wise, "budget_fraction": args.budget_fraction},
        "flexdemo_budget_backward": {**step_wise, "budget_fraction": args.budget_fraction, "overlap": "backward",
                                     **buckets},
        "flexdemo_budget_delayed": {**step_wise, "budget_fraction": args.budget_fraction, "overlap": "delayed"},
        "flexdemo_full": {"replicator": "full"},
    }.get(method, {})
    return args.flexdemo | variant


def build_model(shape: str, seed: int) -> nn.Module:
    """The T5 of ``shape`` from config (no download), identically initialised on every rank."""
    torch.manual_seed(seed)
    return T5ForConditionalGeneration(model_config(shape))


def model_config(shape: str) -> T5Config:
    """The T5 configuration of ``shape`` (``MODEL_SHAPES``), dropout off."""
    config = named_t5_config(*MODEL_SHAPES[shape])
    config.dropout_rate = 0.0
    return config


def random_batches(shape: str, args: argparse.Namespace, count: int = 4) -> list[dict[str, torch.Tensor]]:
    """Fixed-shape random-token batches, different on every rank (data parallel)."""
    vocab = MODEL_SHAPES[shape][1]
    generator = torch.Generator().manual_seed(args.seed * 1000 + dist.get_rank())
    return [
        {
            "input_ids": torch.randint(0, vocab, (args.batch_size, args.src_len), generator=generator),
            "labels": torch.randint(0, vocab, (args.batch_size, args.tgt_len), generator=generator),
        }
        for _ in range(count)
    ]


def setup_adamw(model: nn.Module, args: argparse.Namespace) -> Setup:
    """Stock HSDP + ``torch.optim.AdamW``: FSDP all-reduces the gradient shards across the nodes."""
    shard_model(model, build_hybrid_mesh(shard_size=RANKS_PER_NODE), hsdp=True)
    # FSDP2's HSDP all-reduces each rank's fp32 gradient shard over the replicas (padding ignored).
    per_step = dense_allreduce_bytes(sum(p.to_local().numel() for p in model.parameters()), NODES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    return Setup(model, optimizer, lambda: per_step, "ring all-reduce formula 2*(R-1)/R*numel_local*4")


def setup_compute_only(model: nn.Module, args: argparse.Namespace) -> Setup:
    """The compute-only limit: FSDP inside each node and ``torch.optim.AdamW``, nothing across the nodes (each node
    trains on its own), so no method's step can beat it by skipping work this one does."""
    mesh = build_hybrid_mesh(shard_size=RANKS_PER_NODE)
    check_node_local(mesh["dp_shard"].get_group())
    shard_model(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    return Setup(model, optimizer, lambda: 0, "nothing crosses the nodes")


def setup_flexdemo(model: nn.Module, args: argparse.Namespace, method: str) -> Setup:
    """FlexDeMo as ``method`` asks: DeMo (no FSDP, every rank a node), or FSDP inside the node with an exchange
    across (top-k, overlapped with backward, delayed by one step, random positions, a time budget, dense)."""
    options = flexdemo_options(method, args)
    if method == "demo":
        group = dist.group.WORLD
    else:
        mesh = build_hybrid_mesh(shard_size=RANKS_PER_NODE)
        check_node_local(mesh["dp_shard"].get_group())
        shard_model(model, mesh)
        group = mesh["dp_replicate"].get_group()
    optimizer = FlexDeMo(model.parameters(), replicate_group=group, **from_knobs({"lr": args.lr, **options}))
    return Setup(
        model, optimizer, lambda: optimizer.comm_stats["bytes_sent"], "FlexDeMo.comm_stats['bytes_sent']",
        options,
    )


def check_node_local(group: dist.ProcessGroup) -> None:
    """Raise unless every rank of ``group`` is on this rank's node (FSDP must not cross the link)."""
    nodes = {rank // RANKS_PER_NODE for rank in dist.get_process_group_ranks(group)}
    if nodes != {dist.get_rank() // RANKS_PER_NODE}:
        raise RuntimeError(f"shard group spans nodes {sorted(nodes)}; expected node-major rank layout")


def train_step(setup: Setup, batch: dict[str, torch.Tensor]) -> float:
    """One optimizer step on ``batch``; returns the loss."""
    setup.optimizer.zero_grad(set_to_none=True)
    loss = setup.model(**batch).loss
    loss.backward()
    setup.optimizer.step()
    return loss.item()


def measured(action: Callable[[], T], interface: str) -> tuple[T, float, int]:
    """``action``'s result, its seconds on this rank, and the link bytes (this node's veth) it moved.

    The counters are read between two barriers, so the closing barrier's few hundred bytes are included.
    """
    dist.barrier()
    before = read_counters(interface)
    start = time.perf_counter()
    value = action()
    seconds = time.perf_counter() - start
    dist.barrier()
    return value, seconds, read_counters(interface).total - before.total


def probe_link(args: argparse.Namespace) -> dict[str, float]:
    """A plain gloo all-reduce across the link and one inside each node, with the veth bytes of each.

    A 2-rank ring all-reduce sends the whole payload each way: goodput = payload / seconds. The link
    rate counts every byte on the veth (TCP/IP headers, ACKs, the closing barrier).
    """
    cross = dist.new_group([0, RANKS_PER_NODE])
    nodes = [dist.new_group(list(range(n * RANKS_PER_NODE, (n + 1) * RANKS_PER_NODE))) for n in range(NODES)]
    payload = torch.ones(int(args.probe_mb * 1e6 / 4))
    payload_bytes = payload.numel() * 4
    _, _, barrier_bytes = measured(lambda: None, args.iface)
    on_cross = dist.get_rank() % RANKS_PER_NODE == 0
    _, cross_seconds, cross_bytes = measured(
        lambda: dist.all_reduce(payload, group=cross) if on_cross else None, args.iface
    )
    own_node = nodes[dist.get_rank() // RANKS_PER_NODE]
    _, intra_seconds, intra_bytes = measured(lambda: dist.all_reduce(payload, group=own_node), args.iface)
    return {
        "payload_bytes": payload_bytes,
        "barrier_link_bytes": barrier_bytes,
        "cross_node_allreduce_seconds": cross_seconds,
        "cross_node_link_bytes": cross_bytes,
        "cross_node_link_mbit_per_s_each_way": cross_bytes / 2 * 8 / cross_seconds / 1e6,
        "cross_node_goodput_mbit_per_s": payload_bytes * 8 / cross_seconds / 1e6,
        "intra_node_allreduce_seconds": intra_seconds,
        "intra_node_link_bytes": intra_bytes,
    }


def timed_steps(setup: Setup, batches: list[dict[str, torch.Tensor]], steps: int) -> dict[str, list[float]]:
    """Per step: seconds on this rank, loss, and the inter-node bytes the method reports for this rank; for
    FlexDeMo also the seconds the step waited for inter-node collectives, their number, and the rate in use
    (after the step: a time budget's choice for the next one)."""
    record: dict[str, list[float]] = {"seconds": [], "loss": [], "reported_bytes": []}
    optimizer = setup.optimizer if isinstance(setup.optimizer, FlexDeMo) else None
    if optimizer is not None:
        record |= {"exchange_wait_seconds": [], "collectives": [], "rate": []}
        optimizer.pop_exchange_seconds()  # drop what earlier steps left
    for step in range(steps):
        start = time.perf_counter()
        loss = train_step(setup, batches[step % len(batches)])
        record["seconds"].append(time.perf_counter() - start)
        record["loss"].append(loss)
        record["reported_bytes"].append(setup.reported_bytes())
        if optimizer is not None:
            record["exchange_wait_seconds"].append(optimizer.pop_exchange_seconds())
            record["collectives"].append(optimizer.comm_stats["collectives"])
            compresses = optimizer.options["replicator"] in ("demo", "random")  # "full", "none": no rate
            record["rate"].append(optimizer.rate if compresses else None)
    return record


def run_method(method: str, args: argparse.Namespace) -> dict[str, object]:
    """Warm up, plan the timed steps within the budget, time them, and account the traffic."""
    model = build_model(args.model, args.seed)
    numel = sum(p.numel() for p in model.parameters())
    setups = {"adamw": setup_adamw, "compute_only": setup_compute_only}
    setup = setups[method](model, args) if method in setups else setup_flexdemo(model, args, method)
    batches = random_batches(args.model, args)
    warmup = [timed_steps(setup, batches, 1)["seconds"][0] for _ in range(args.warmup_steps)]
    # local steps: whole rounds, so that the mean counts one exchange step in every local_steps
    rounds = setup.optimizer.options["local_steps"] if isinstance(setup.optimizer, FlexDeMo) else 1
    steps = args.steps
    if warmup:
        slowest = torch.tensor([max(warmup)])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # every rank plans the same number of steps
        steps = max(1, min(args.steps, int(args.method_budget_s // slowest.item())))
    steps = max(1, steps // rounds) * rounds
    record, wall, link_bytes = measured(lambda: timed_steps(setup, batches, steps), args.iface)
    reported = torch.tensor([sum(record["reported_bytes"])], dtype=torch.float64)
    dist.all_reduce(reported)
    extra: dict[str, object] = {}
    if "exchange_wait_seconds" in record:
        rates = [r for r in record["rate"] if r is not None]
        extra = {
            "optimizer_options": setup.options,
            "exchange_wait_seconds": record["exchange_wait_seconds"],
            "median_exchange_wait_seconds": statistics.median(record["exchange_wait_seconds"]),
            "mean_exchange_wait_seconds": statistics.fmean(record["exchange_wait_seconds"]),
            "collectives_per_step": record["collectives"][-1],
            "rates": record["rate"],
            "rate_final": rates[-1] if rates else None,
            "rate_mean": statistics.fmean(rates) if rates else None,
        }
    return {
        "params": numel,
        "warmup_step_seconds": warmup,
        "steps_requested": args.steps,
        "steps_timed": steps,
        "step_seconds": record["seconds"],
        "local_steps": rounds,
        "median_step_seconds": statistics.median(record["seconds"]),
        "mean_step_seconds": statistics.fmean(record["seconds"]),
        "timed_wall_seconds": wall,
        "link_bytes_per_step": link_bytes / steps,
        "reported_bytes_per_step": reported.item() / steps,
        "reported_bytes_source": setup.source,
        "loss_first": record["loss"][0],
        "loss_last": record["loss"][-1],
        **extra,
    }


def write_json(path: str, payload: dict[str, object]) -> None:
    """Write atomically, so the driver never reads half a file."""
    partial = f"{path}.partial"
    with open(partial, "w") as handle:
        json.dump(payload, handle, indent=2)
    os.replace(partial, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, epilog="Every other flag is a FlexDeMoConfig field "
                                     "(--compression_rate=0.125 ...) for every FlexDeMo method.")
    parser.add_argument("--methods", nargs="+", choices=METHODS, required=True)
    parser.add_argument("--model", choices=sorted(MODEL_SHAPES), required=True)
    for option in ("--batch_size", "--src_len", "--tgt_len", "--warmup_steps", "--steps"):
        parser.add_argument(option, type=int, required=True)
    parser.add_argument("--method_budget_s", type=float, required=True)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--bucket_cap_mb", type=float, default=None,
                        help="flexdemo_backward's exchange bucket size (default: the package's)")
    parser.add_argument("--budget_fraction", type=float, default=0.1,
                        help="flexdemo_budget: the largest fraction of the step spent waiting on the exchange")
    parser.add_argument("--probe_mb", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collective_timeout_s", type=float, default=1800.0)
    parser.add_argument("--iface", required=True, help="this node's end of the veth pair")
    parser.add_argument("--out", required=True, help="JSON file written by global rank 0")
    args, flexdemo = parser.parse_known_args(argv)
    _, args.flexdemo = harness.parse_flexdemo(flexdemo)
    if {"method", "shard_size"} & args.flexdemo.keys():
        parser.error("--flexdemo takes FlexDeMo's optimizer fields; method and shard_size are the benchmark's")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout_s))
    ranks = (dist.get_world_size(), int(os.environ["LOCAL_WORLD_SIZE"]))
    if ranks != (NODES * RANKS_PER_NODE, RANKS_PER_NODE):
        raise RuntimeError(f"expected {NODES} nodes x {RANKS_PER_NODE} ranks, got (world, per node) {ranks}")
    results: dict[str, object] = {"worker_args": vars(args), "probe": probe_link(args), "methods": {}}
    for method in args.methods:
        try:
            results["methods"][method] = run_method(method, args)
        except Exception as error:  # recorded, and the next method still runs
            where = traceback.extract_tb(error.__traceback__)[-1]
            results["methods"][method] = {
                "error": f"{type(error).__name__}: {error} ({where.filename}:{where.lineno})"
            }
        gc.collect()  # the last method's FSDP model and optimizer hold reference cycles
        dist.barrier()
        if dist.get_rank() == 0:
            write_json(args.out, results)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
