"""Pre-flight check of a multi-node setup: ``torchrun ... -m hf_flexdemo.doctor [--shard_size N] [--parameters P]``.

``python -m hf_flexdemo.doctor --parameters 1e9 --step_seconds 1 --nodes 8`` only estimates the link the exchange
needs (:mod:`hf_flexdemo.wire.estimate`), without launching anything.

Prints, from rank 0, the topology FlexDeMo would use (nodes x processes, which ranks form each
shard group and each replicate group, on which hosts), the backend and socket interface (on CUDA also
NCCL's version and the settings that choose its inter-node transport: socket interface, InfiniBand on
or off), and the measured latency and bandwidth of the replicate groups' links; each node's device model and torch,
CUDA and NCCL versions with the drift policy the run will use (``--on_drift``). Warns when a shard group spans
several hosts (FSDP traffic would cross the slow link), a replicate group stays on one host, or nodes of unlike
hardware meet an exact drift policy (their kernels round differently, so bit-identical replicas cannot be kept).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

from .knobs import DEFAULTS, DRIFT_ACTIONS, REPLICATORS
from .optim.guards import hardware
from .optim.mesh import build_hybrid_mesh, default_device_type
from .wire.collectives import all_gather_into
from .wire.estimate import link_estimate


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# NCCL settings that decide the inter-node path: which interface and transport it uses, and how it reports.
NCCL_VARIABLES = ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_NET", "NCCL_NET_GDR_LEVEL",
                  "NCCL_CROSS_NIC", "NCCL_ALGO", "NCCL_PROTO", "NCCL_DEBUG")


def nccl_report() -> list[str]:
    """Lines describing NCCL's version and the environment variables that choose its inter-node transport."""
    version = ".".join(map(str, torch.cuda.nccl.version()))
    settings = ", ".join(f"{name}={os.environ.get(name, '-')}" for name in NCCL_VARIABLES)
    lines = [f"NCCL {version}: {settings}"]
    if os.environ.get("NCCL_IB_DISABLE") == "1":
        lines.append("  note: InfiniBand is disabled (NCCL_IB_DISABLE=1): inter-node traffic uses TCP sockets")
    if "NCCL_SOCKET_IFNAME" not in os.environ:
        lines.append("  note: NCCL_SOCKET_IFNAME is unset: NCCL picks an interface itself; set it to the inter-node "
                     "NIC (e.g. eth0, ib0) if the measured bandwidth is lower than the link's")
    return lines


def hardware_report(records: list[dict[str, str]], nodes: list[list[int]], on_drift: str) -> list[str]:
    """Lines naming each node's hardware (``records`` indexed by rank, ``nodes`` the ranks of each) and the drift
    policy, with a warning when nodes differ while the policy is an exact one (``raise``, ``resync``)."""
    lines, kinds = [], []
    for node, ranks in enumerate(nodes):
        seen = sorted({tuple(records[r].values()) for r in ranks})
        kinds += [kind for kind in seen if kind not in kinds]
        described = "; ".join(f"device {d}, torch {t}, CUDA {c}, NCCL {n}" for d, t, c, n in seen)
        lines.append(f"node {node} (ranks {ranks}): {described}")
    chosen = ("tolerate" if len(kinds) > 1 else "raise") if on_drift == "auto" else on_drift
    lines.append(f"drift policy: on_drift={on_drift!r}" + (f" (here: {chosen!r})" if on_drift == "auto" else ""))
    if len(kinds) > 1 and chosen != "tolerate":
        lines.append(f"  WARNING: the nodes' hardware or versions differ and on_drift={on_drift!r} is exact: their "
                     "kernels can round differently, so replicas part in the last bit and the drift check stops the "
                     "run ('raise') or copies every parameter at each check ('resync'). Use on_drift='tolerate' "
                     "(FlexDeMoConfig / --on_drift tolerate).")
    elif len(kinds) == 1 and chosen == "tolerate":
        lines.append("  note: every node runs the same hardware and versions: on_drift='raise' checks bit for bit "
                     "with an 8-byte fingerprint per parameter instead of a copy of the parameters")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard_size", type=int, default=None, help="processes per node (default: launcher's)")
    parser.add_argument("--megabytes", type=float, default=8.0, help="payload of the bandwidth probe")
    parser.add_argument("--timeout", type=int, default=300, help="seconds before a collective gives up")
    parser.add_argument("--on_drift", default=DEFAULTS["on_drift"], choices=DRIFT_ACTIONS,
                        help="the drift policy the run will use (FlexDeMoConfig.on_drift)")
    parser.add_argument("--parameters", type=float, default=None,
                        help="the model's parameter count (e.g. 1e9): estimate the link the exchange needs")
    parser.add_argument("--step_seconds", type=float, default=1.0, help="a training step's time, for --parameters")
    parser.add_argument("--nodes", type=int, default=None, help="with --parameters: estimate for this many nodes "
                        "and exit, without launching (default: the launched topology's)")
    parser.add_argument("--max_steps", type=int, default=None, help="with --parameters: the run's length (the "
                        "defaults' rounds follow it: a run under 1,000 steps sends twice the bits, one of 2,000 steps "
                        "or more on 8 M parameters or more half; default: not known, rounds of 8)")
    parser.add_argument("--replicator", default=None, choices=REPLICATORS, help="with --parameters: the exchange the "
                        "run will use (FlexDeMoConfig.replicator; default: the package's)")
    args = parser.parse_args(argv)
    overrides = None if args.replicator is None else {"replicator": args.replicator}
    if args.nodes is not None:
        if args.parameters is None:
            parser.error("--nodes needs --parameters (the model's parameter count)")
        print(link_estimate(args.parameters, args.step_seconds, args.nodes, overrides,
                            max_steps=args.max_steps).describe())
        return

    device_type = default_device_type()
    mesh = build_hybrid_mesh(args.shard_size, device_type, datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list[str] = [""] * world
    dist.all_gather_object(hosts, socket.gethostname())
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    records: list[dict[str, str]] = [{}] * world
    dist.all_gather_object(records, hardware(device))
    group = mesh["dp_replicate"].get_group()
    tiny = torch.zeros(1, device=device)
    payload = torch.zeros(int(args.megabytes * 2**20 / 4), device=device)
    out = payload.new_empty(payload.numel() * mesh["dp_replicate"].size())
    latency = _timed(lambda: dist.all_reduce(tiny, group=group), 10)
    seconds = _timed(lambda: all_gather_into(out, payload, group), 3)
    sent = (mesh["dp_replicate"].size() - 1) * payload.numel() * 4
    stats = torch.tensor([latency, seconds], dtype=torch.float64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank == 0:
        rows, cols = mesh.mesh.tolist(), mesh.mesh.T.tolist()
        print(f"world {world} = {len(rows)} node(s) x {len(rows[0])} process(es); backend {dist.get_backend()}, "
              f"device {device_type}, GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME', '-')}, "
              f"NCCL_SOCKET_IFNAME={os.environ.get('NCCL_SOCKET_IFNAME', '-')}")
        if device_type == "cuda":
            print("\n".join(nccl_report()))
        for ranks in rows:
            where = sorted({hosts[r] for r in ranks})
            print(f"shard group (one node) ranks {ranks} on {where}")
            if len(where) > 1:
                print("  WARNING: this shard group spans several hosts: FSDP traffic would cross the slow link")
        for ranks in cols:
            where = [hosts[r] for r in ranks]
            print(f"replicate group ranks {ranks} on {where}")
            if len(ranks) > 1 and len(set(where)) == 1:
                print("  note: this replicate group stays on one host (a simulation, or a wrong shard_size)")
        print("\n".join(hardware_report(records, rows, args.on_drift)))
        latency, seconds = stats.tolist()
        if len(cols[0]) > 1:
            measured = sent * 8 / seconds / 1e6
            print(f"replicate link: latency {latency * 1e3:.2f} ms (1-element all-reduce), "
                  f"bandwidth {measured:.1f} Mbit/s per rank ({args.megabytes:g} MB all-gather), "
                  f"{measured * len(rows[0]):.1f} Mbit/s per node")
            if args.parameters is not None:
                estimate = link_estimate(args.parameters, args.step_seconds, len(cols[0]), overrides,
                                         max_steps=args.max_steps)
                print(estimate.describe())
                if measured * len(rows[0]) < estimate.needed_mbits:
                    print("  note: the measured link is slower: the steps will wait on the exchange (raise "
                          "local_steps, or see docs/multi-node.md)")
        else:
            print("one node: no inter-node link to measure")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
