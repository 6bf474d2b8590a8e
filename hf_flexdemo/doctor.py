"""Pre-flight check of a multi-node setup: ``torchrun ... -m hf_flexdemo.doctor [--shard_size N]``.

Prints, from rank 0, the topology FlexDeMo would use (nodes x processes, which ranks form each
shard group and each replicate group, on which hosts), the backend and socket interface (on CUDA also
NCCL's version and the settings that choose its inter-node transport: socket interface, InfiniBand on
or off), and the measured latency and bandwidth of the replicate groups' links. Warns when a shard group spans
several hosts (FSDP traffic would cross the slow link) or a replicate group stays on one host.
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

from .mesh import build_hybrid_mesh, default_device_type
from .replicate import all_gather_into


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard_size", type=int, default=None, help="processes per node (default: launcher's)")
    parser.add_argument("--megabytes", type=float, default=8.0, help="payload of the bandwidth probe")
    parser.add_argument("--timeout", type=int, default=300, help="seconds before a collective gives up")
    args = parser.parse_args(argv)

    device_type = default_device_type()
    mesh = build_hybrid_mesh(args.shard_size, device_type, datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list[str] = [""] * world
    dist.all_gather_object(hosts, socket.gethostname())
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
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
        latency, seconds = stats.tolist()
        if len(cols[0]) > 1:
            print(f"replicate link: latency {latency * 1e3:.2f} ms (1-element all-reduce), "
                  f"bandwidth {sent * 8 / seconds / 1e6:.1f} Mbit/s per rank ({args.megabytes:g} MB all-gather)")
        else:
            print("one node: no inter-node link to measure")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
