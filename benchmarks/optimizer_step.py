"""Optimizer-step benchmark (issue #2): ``step()`` time and wire bytes of FlexDeMo, AdamW and the reference DeMo.

One run launches ``torchrun --standalone --nproc_per_node 2`` on CPU/gloo (``OMP_NUM_THREADS=1`` per rank, every
``MALLOC_*`` variable left as the caller has it), builds a T5 from its config (no download), puts fixed random
gradients (seeded per rank) on its parameters and times ``optimizer.step()`` alone, after warm-up steps and a
barrier before each step. A step's time is the slowest rank's. Methods, in this order:

* ``adamw``: ``torch.optim.AdamW`` with torch's defaults but ``weight_decay=0`` (FlexDeMo's default: the same
  work per element), local (no communication);
* ``adamw_foreach``: the same with ``foreach=True``, the implementation the local steps' inner AdamW runs (torch's
  default on CUDA; on CPU torch defaults to the for-loop, which is slower): the exchange's own cost is the
  ``flexdemo`` step over this one (``ratios["flexdemo/adamw_foreach (mean)"]``);
* ``flexdemo``: ``FlexDeMo`` at the package defaults (local steps: eight inner AdamW steps per round, the
  pseudo-gradient's rate ``DEFAULT_RATE`` of ``DEFAULT_CHUNK``-sided blocks of its values in int2, streamed in 4
  fragments: one fragment's exchange every other step), plain tensors,
  the 2 ranks are 2 replicas (shard size 1, replicate group = world: DDP style). Its warm-up and timed steps are
  whole rounds (rounded up to multiples of ``local_steps``) and its figure is the **mean** step over them (a
  median would hide the exchange step), against AdamW's mean. After the timed steps one more round runs under
  ``torch.profiler`` on rank 0: the time of each ``FlexDeMo::`` phase and of the costliest operators go in the
  JSON (``profile_flexdemo_rank0``, seconds per round);
* ``flexdemo_one_round``: the defaults with the whole model in one round (``outer_fragments=1``, the default
  before fragments): seven inner steps, then a step that compresses and sends it all; timed as ``flexdemo``;
* ``flexdemo_step_wise``: ``FlexDeMo(preset="step-wise")``, the exchange of the compressed momentum every step
  (float8 values; the default before local steps), DDP style, profiled as ``flexdemo`` for one step
  (``profile_flexdemo_step_wise_rank0``);
* ``reference``: PyPI ``detonation`` 0.5.2, ``DeToSGD`` + ``DeMoReplicator`` at the same density (top-k
  ``DEFAULT_RATE * DEFAULT_CHUNK**2`` of each block) in DDP mode
  (a size-1 sharding group per rank, replication group = world), imported as its authors ship it: it needs their
  ``mltiming`` too (both in the ``bench`` extra); when it cannot be imported the method is skipped and the JSON
  says why (``reference_skipped``);
* ``flexdemo_sharded``: the step-wise ``FlexDeMo`` on FSDP2 shards (``build_hybrid_mesh(shard_size=2)``, one node:
  no exchange, the compression's compute alone).

``--flexdemo FIELD=VALUE ...`` (``FlexDeMoConfig`` fields, as the other drivers take them) changes the ``flexdemo``
method's knobs from the package defaults, e.g. ``--flexdemo local_steps=8``; the JSON records them
(``settings.flexdemo``). ``--nproc N`` launches N ranks instead of 2. With one rank FlexDeMo's replicate group has
size 1: the exchange is skipped, compression and decode still run (the step's compute cost); ``flexdemo_sharded`` is
skipped (nothing to shard) and the JSON says so (``methods_skipped``). ``--device cuda`` puts rank r on
``cuda:{LOCAL_RANK % device_count}`` over NCCL (one GPU per rank: ``--nproc`` may not exceed the GPUs), times each
step between ``torch.cuda.synchronize()`` calls (the optimizer itself never synchronizes), profiles CUDA activity
too and records the GPU, CUDA and NCCL (``cuda``); a ``reference`` that fails there is skipped with the error as
reason.

    python benchmarks/optimizer_step.py                              # T5-small shape (60.5 M), a few minutes
    python benchmarks/optimizer_step.py --model tiny --steps 3       # smoke, seconds
    python benchmarks/optimizer_step.py --device cuda --nproc 1      # one GPU (benchmarks/gpu_check.sh)

Prints a table (median, IQR and mean step seconds, their ratios to AdamW, bytes each rank sends per step, kept
coefficients per step, bytes per kept coefficient), the ratios FlexDeMo/AdamW, reference/AdamW, reference/FlexDeMo,
and whether the targets are met (issue #20: the defaults' mean step <= 1.5x AdamW's; issue #2: the step-wise step
<= 2x AdamW, <= 4 bytes per kept coefficient). Writes all of it, the per-step times, the machine and the exact
command to ``benchmarks/results/optimizer_step[_tiny][_cuda][_Nranks].json``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from transformers import T5ForConditionalGeneration

from hf_flexdemo import FlexDeMo, build_hybrid_mesh, shard_model
from hf_flexdemo.knobs import DEFAULT_CHUNK, DEFAULT_RATE
from hf_flexdemo.policies import from_knobs
from hf_flexdemo.seq2seq.tiny_t5 import T5_VOCAB_SIZE, named_t5_config

HERE = Path(__file__).resolve().parent
NPROC = 2
LR = 1e-3
# FlexDeMo at the package defaults; the reference at the same density (its fixed top-k per chunk x chunk block).
CHUNK = DEFAULT_CHUNK
TOPK = round(DEFAULT_RATE * CHUNK * CHUNK)
# --model: a configuration name of hf_flexdemo.seq2seq.tiny_t5 (published shapes there) -> vocabulary size
MODELS = {"t5-small": T5_VOCAB_SIZE, "tiny": 4096}
METHODS = ("adamw", "adamw_foreach", "flexdemo", "flexdemo_one_round", "flexdemo_step_wise", "reference",
           "flexdemo_sharded")
PRESETS = {"flexdemo": "default", "flexdemo_one_round": "default", "flexdemo_step_wise": "step-wise",
           "flexdemo_sharded": "step-wise"}
KNOBS = {"flexdemo_one_round": {"outer_fragments": 1}}  # besides the preset's
# issue #20: the defaults' mean step over a round; issue #2: the step-wise step and its bytes per coefficient
TARGET_STEP_RATIO, TARGET_STEP_WISE_RATIO, TARGET_BYTES_PER_COEFFICIENT = 1.5, 2.0, 4.0


def reference_unavailable() -> str | None:
    """Why the authors' ``detonation`` cannot be imported here, or None."""
    try:
        import detonation  # noqa: F401
    except ImportError as err:
        return f"{err} (pip install -e .[bench]: detonation==0.5.2 and its authors' mltiming)"
    return None


@contextlib.contextmanager
def counting_all_gathers(sent: dict[str, Any]) -> Iterator[None]:
    """Count what goes through ``dist.all_gather`` (the reference's only collective): a ring all-gather over R
    ranks puts ``(R - 1) * nbytes`` of each rank's input on its link, as ``FlexDeMo.comm_stats`` counts."""
    original = dist.all_gather

    def all_gather(tensor_list: list[Tensor], tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        sent["bytes_sent"] += (len(tensor_list) - 1) * tensor.nbytes
        sent["collectives"] += 1
        sent["peers"] = len(tensor_list) - 1
        sent["dtypes"][str(tensor.dtype)] = sent["dtypes"].get(str(tensor.dtype), 0) + tensor.numel()
        if tensor.is_floating_point():
            sent["coefficients"] += tensor.numel()
        return original(tensor_list, tensor, *args, **kwargs)

    dist.all_gather = all_gather
    try:
        yield
    finally:
        dist.all_gather = original


def random_grad(param: Tensor, generator: torch.Generator) -> Tensor:
    """A fixed random gradient shaped like ``param`` (a ``DTensor`` like it for FSDP2 shards), drawn on the CPU
    (the same values on every device) and put on ``param``'s device."""
    if isinstance(param, DTensor):
        local = torch.randn(param.to_local().shape, generator=generator).to(param.device)
        return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())
    return torch.randn(param.shape, generator=generator).to(param.device)


def rank_device(args: argparse.Namespace) -> torch.device:
    """This rank's device: the CPU, or ``cuda:{LOCAL_RANK % device_count}``."""
    if args.device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (a benchmark's clock only: the optimizer never does this)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, then time ``args.steps`` optimizer steps of ``method``; this rank's times and traffic."""
    device = rank_device(args)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(named_t5_config(args.model, MODELS[args.model])).to(device)
    if method == "flexdemo_sharded":
        shard_model(model, build_hybrid_mesh(shard_size=args.nproc, device_type=device.type))
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    grads = [random_grad(p, generator) for p in params]
    sent: dict[str, Any] = {"bytes_sent": 0, "collectives": 0, "coefficients": 0, "peers": 0, "dtypes": {}}
    if method in ("adamw", "adamw_foreach"):
        # adamw_foreach: the implementation the local steps' inner AdamW runs (torch's default on CUDA, not on CPU);
        # weight decay 0 as FlexDeMo's default (torch's 1e-2 adds a pass over the parameters to AdamW's step alone)
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0,
                                                             foreach=True if method == "adamw_foreach" else None)
    elif method == "reference":
        from detonation import DeMoReplicator, DeToSGD

        sharding_group, _ = dist.new_subgroups(group_size=1)
        replicator = DeMoReplicator(compression_topk=TOPK, compression_chunk=CHUNK)
        optimizer = DeToSGD(params, lr=LR, replicator=replicator, sharding_parallel_group=sharding_group,
                              replication_parallel_group=dist.group.WORLD)
    else:
        group = None if method == "flexdemo_sharded" else dist.group.WORLD
        knobs = {**KNOBS.get(method, {}), **(harness.parse_flexdemo(harness.flexdemo_flags(args.flexdemo))[1]
                                             if method == "flexdemo" else {})}
        optimizer = FlexDeMo(params, replicate_group=group, preset=PRESETS[method], **from_knobs({"lr": LR, **knobs}))
    # whole rounds: every exchange counted
    rounds = optimizer.options["local_steps"] if method.startswith("flexdemo") else 1
    warmup, steps = (-(-n // rounds) * rounds for n in (args.warmup, args.steps))
    times = []
    for step in range(warmup + steps):
        for param, grad in zip(params, grads):
            param.grad = grad  # the reference replaces .grad by its update: put the same gradient back
        counting = counting_all_gathers(sent) if method == "reference" and step == 0 else contextlib.nullcontext()
        dist.barrier()
        with counting:
            synchronize(device)
            start = time.perf_counter()
            optimizer.step()
            synchronize(device)
            elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
    profiled = method in ("flexdemo", "flexdemo_step_wise")
    profile = profiled_round(optimizer, params, grads, device, rounds) if profiled else None
    value_dtype = local_steps = None
    if method.startswith("flexdemo"):
        value_dtype, local_steps = optimizer.options["value_dtype"], optimizer.options["local_steps"]
        stats = optimizer.comm_stats
        sent = {key: stats[key] for key in ("bytes_sent", "collectives", "coefficients")}
        sent["peers"] = 0 if method == "flexdemo_sharded" else args.nproc - 1
        sent["flag_bytes"] = 1  # the non-finite flag rides in the payload: not a coefficient's bytes
    elif method == "reference":
        sent["replicator_data_transmitted_per_peer"] = replicator.data_transmitted[0]
    numel = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
    return {"seconds": times, "traffic": sent, "local_numel": numel, "profile": profile, "value_dtype": value_dtype,
            "local_steps": local_steps}


def device_seconds(event: Any, inclusive: bool) -> float:
    """An averaged profiler event's GPU time in seconds (``*_device_time_total``; ``*_cuda_time_total`` before)."""
    name = "device_time_total" if inclusive else "self_device_time_total"
    if not hasattr(event, name):
        name = name.replace("device", "cuda")
    return getattr(event, name, 0) / 1e6


def profiled_round(optimizer: torch.optim.Optimizer, params: list[Tensor], grads: list[Tensor],
                   device: torch.device, steps: int) -> dict[str, Any]:
    """One more round (``steps`` steps) under ``torch.profiler``: seconds per ``FlexDeMo::`` phase (inclusive) and
    the costliest operators (self time), to show where the round goes; on CUDA also the GPU time per phase and of
    the costliest kernels."""
    dist.barrier()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            for param, grad in zip(params, grads):
                param.grad = grad
            optimizer.step()
        synchronize(device)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    operators = sorted((e for e in events if e.key.startswith("aten::")), key=lambda e: -e.self_cpu_time_total)
    profile = {"steps": steps, "total_s": total,
               "phases_s": {e.key: e.cpu_time_total / 1e6 for e in events if e.key.startswith("FlexDeMo::")},
               "operators_self_s": {e.key: e.self_cpu_time_total / 1e6 for e in operators[:8]}}
    if device.type == "cuda":
        kernels = sorted(events, key=lambda e: -device_seconds(e, inclusive=False))
        profile |= {"device_total_s": sum(device_seconds(e, inclusive=False) for e in events),
                    "phases_device_s": {e.key: device_seconds(e, inclusive=True) for e in events
                                        if e.key.startswith("FlexDeMo::")},
                    "kernels_self_device_s": {e.key: device_seconds(e, inclusive=False) for e in kernels[:8]
                                              if device_seconds(e, inclusive=False) > 0}}
    return profile


def default_run(args: argparse.Namespace) -> bool:
    """The configuration the committed results and the README come from: 2 CPU ranks."""
    return args.device == "cpu" and args.nproc == NPROC


def backend(device: torch.device) -> str:
    """gloo on the CPU; NCCL when every rank has a GPU of its own."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return "nccl" if device.type == "cuda" and ranks <= torch.cuda.device_count() else "gloo"


def rank_facts(device: torch.device) -> dict[str, Any]:
    """This rank's device and process group, with the GPU's name and the CUDA and NCCL versions on CUDA."""
    facts: dict[str, Any] = {"rank": dist.get_rank(), "device": str(device), "backend": dist.get_backend()}
    if device.type == "cuda":
        nccl = torch.cuda.nccl.version()
        facts |= {"device_name": torch.cuda.get_device_name(device),
                  "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
                  "memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30,
                  "torch": torch.__version__, "cuda_version": torch.version.cuda,
                  "nccl_version": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)}
    return facts


def worker(args: argparse.Namespace) -> None:
    """One rank: measure every method, rank 0 writes all ranks' results to ``args.worker``."""
    device = rank_device(args)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    pg_backend = backend(device)
    dist.init_process_group(pg_backend, **({"device_id": device} if pg_backend == "nccl" else {}))
    args.nproc = dist.get_world_size()  # not passed on: torchrun would take `--nproc` for its own flag
    results: dict[str, Any] = {}
    for method in methods(args):
        try:
            mine = measure(method, args)
        except Exception as err:  # only the reference, and only off the default run: say why it could not run
            if method != "reference" or default_run(args):
                raise
            mine = {"error": f"{type(err).__name__}: {err}"}
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        results[method] = gathered
    facts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(facts, rank_facts(device))
    results["ranks"] = facts
    if dist.get_rank() == 0:
        Path(args.worker).write_text(json.dumps(results))
    dist.destroy_process_group()


def skipped(args: argparse.Namespace) -> dict[str, str]:
    """The methods this run cannot measure, with why."""
    why = {}
    unavailable = reference_unavailable()
    if unavailable is not None:
        why["reference"] = unavailable
    if args.nproc == 1:
        why["flexdemo_sharded"] = "one rank: nothing to shard"
    return why


def methods(args: argparse.Namespace) -> tuple[str, ...]:
    """``METHODS``, less those this run skips (``reference`` when detonation cannot be imported, the sharded
    method on one rank)."""
    return tuple(m for m in METHODS if m not in skipped(args))


def summarize(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and IQR of the per-step slowest-rank time, and rank 0's traffic (with every rank's bytes)."""
    seconds = [max(ranks) for ranks in zip(*(r["seconds"] for r in per_rank))]
    q1, median, q3 = statistics.quantiles(seconds, n=4, method="inclusive")
    traffic = per_rank[0]["traffic"]
    payload = traffic["bytes_sent"] / traffic["peers"] - traffic.get("flag_bytes", 0) if traffic["peers"] else None
    return {
        "median_s": median,
        "mean_s": statistics.fmean(seconds),
        "iqr_s": q3 - q1,
        "step_seconds": seconds,
        "step_seconds_per_rank": [r["seconds"] for r in per_rank],
        "bytes_sent_per_rank": [r["traffic"]["bytes_sent"] for r in per_rank],
        "coefficients": traffic["coefficients"],
        "bytes_per_coefficient": payload / traffic["coefficients"] if payload and traffic["coefficients"] else None,
        "traffic_rank0": traffic,
        "local_numel_per_rank": [r["local_numel"] for r in per_rank],
    }


def table(methods: dict[str, dict[str, Any]]) -> str:
    # the defaults' figure is the mean over whole rounds (their median is an inner step): both ratios shown
    columns = ["method", "median s", "IQR s", "/AdamW (median)", "mean s", "/AdamW (mean)", "B sent/rank",
               "kept coef", "B/coef", "colls"]
    adamw = methods["adamw"]
    rows = [[name, f"{m['median_s']:.4f}", f"{m['iqr_s']:.4f}", f"{m['median_s'] / adamw['median_s']:.2f}",
             f"{m['mean_s']:.4f}", f"{m['mean_s'] / adamw['mean_s']:.2f}",
             f"{m['bytes_sent_per_rank'][0]:,}", f"{m['coefficients']:,}",
             "-" if m["bytes_per_coefficient"] is None else f"{m['bytes_per_coefficient']:.2f}",
             m["traffic_rank0"]["collectives"]] for name, m in methods.items()]
    return harness.markdown_table(columns, rows)


def check_device(args: argparse.Namespace) -> None:
    """Exit with a clear message unless ``--device`` and ``--nproc`` can run here."""
    if args.device == "cpu":
        return
    if not torch.cuda.is_available():
        sys.exit(f"[optimizer_step] --device cuda: no CUDA device here (torch {torch.__version__}, built with CUDA "
                 f"{torch.version.cuda}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                 "use --device cpu")
    if args.nproc > torch.cuda.device_count():
        sys.exit(f"[optimizer_step] --nproc {args.nproc} > {torch.cuda.device_count()} CUDA device(s): with "
                 f"--device cuda every rank needs a GPU of its own; pass --nproc {torch.cuda.device_count()} or less")


def default_path(args: argparse.Namespace) -> Path:
    """``benchmarks/results/optimizer_step[_MODEL][_cuda][_Nranks].json`` (t5-small, CPU, 2 ranks: no suffix)."""
    suffix = "" if args.model == "t5-small" else "_" + args.model
    suffix += "_cuda" if args.device == "cuda" else ""
    suffix += "" if args.nproc == NPROC else f"_{args.nproc}ranks"
    return HERE / "results" / f"optimizer_step{suffix}.json"


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The harness's rank environment (OMP_NUM_THREADS=1; MALLOC_* as the caller has them), GPUs visible on CUDA."""
    env = harness.worker_env()
    if args.device == "cuda":
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def driver(args: argparse.Namespace) -> None:
    """Launch the ranks, then report and write the results."""
    check_device(args)
    path = args.out or default_path(args)
    bench = harness.Run.start(path, args.allow_dirty)
    env = worker_env(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ranks.json"
        launch = harness.torchrun([__file__, "--model", args.model, "--steps", args.steps, "--warmup", args.warmup,
                                   "--device", args.device, "--worker", out,
                                   *(("--flexdemo", *args.flexdemo) if args.flexdemo else ())], args.nproc)
        job = harness.run_job([launch], [Path(tmp) / "ranks.log"], args.timeout_s, env, expect=out)
        if job["status"] != harness.OK:
            sys.exit(f"[optimizer_step] ranks {job['status']} (exit codes {job['returncodes']}):\n"
                     f"{job['log_tails'][0]}")
        ranks = json.loads(out.read_text())
    why_skipped = skipped(args)
    failed = [r["error"] for r in ranks.get("reference", []) if "error" in r]
    if failed:  # it could not run here (off the default run only): skipped, with the first rank's error
        why_skipped["reference"] = f"failed on {args.device} with {args.nproc} rank(s): {failed[0]}"
        del ranks["reference"]
    methods = {name: summarize(ranks[name]) for name in METHODS if name in ranks}
    step = {name: m["median_s"] for name, m in methods.items()}
    pairs = (("flexdemo_step_wise", "adamw"), ("reference", "adamw"), ("reference", "flexdemo_step_wise"),
             ("flexdemo_sharded", "adamw"))
    ratios = {f"{a}/{b}": step[a] / step[b] for a, b in pairs if a in step and b in step}
    # the defaults' figure: a round's mean step (the exchange step is one in local_steps), against AdamW's mean
    ratios["flexdemo/adamw (mean)"] = methods["flexdemo"]["mean_s"] / methods["adamw"]["mean_s"]
    ratios["flexdemo_one_round/adamw (mean)"] = methods["flexdemo_one_round"]["mean_s"] / methods["adamw"]["mean_s"]
    ratios["flexdemo/adamw_foreach (mean)"] = methods["flexdemo"]["mean_s"] / methods["adamw_foreach"]["mean_s"]
    per_coefficient = methods["flexdemo_step_wise"]["bytes_per_coefficient"]  # None on one rank: nothing is sent
    targets = {
        "flexdemo_mean_step_le_1.5x_adamw": {"value": ratios["flexdemo/adamw (mean)"], "target": TARGET_STEP_RATIO,
                                             "met": ratios["flexdemo/adamw (mean)"] <= TARGET_STEP_RATIO},
        "flexdemo_step_wise_step_le_2x_adamw": {"value": ratios["flexdemo_step_wise/adamw"],
                                                "target": TARGET_STEP_WISE_RATIO,
                                                "met": ratios["flexdemo_step_wise/adamw"] <= TARGET_STEP_WISE_RATIO},
        "flexdemo_step_wise_bytes_per_coefficient_le_4": {
            "value": per_coefficient, "target": TARGET_BYTES_PER_COEFFICIENT,
            "met": None if per_coefficient is None else per_coefficient <= TARGET_BYTES_PER_COEFFICIENT},
    }
    cuda = args.device == "cuda"
    extra = {} if default_run(args) else {
        "device": args.device,
        "ranks": ranks["ranks"],
        "cuda": {key: ranks["ranks"][0].get(key) for key in ("device_name", "capability", "memory_gib", "torch",
                                                               "cuda_version", "nccl_version", "backend")}
        if cuda else None,
        "methods_skipped": why_skipped,
    }
    bench.write(path, {
        "torchrun_command": shlex.join(launch[:-2]),
        "nproc_per_node": args.nproc,
        **extra,
        "omp_num_threads_per_rank": 1,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "model": args.model,
        "model_config": named_t5_config(args.model, MODELS[args.model]).to_diff_dict(),
        "model_numel": methods["adamw"]["local_numel_per_rank"][0],
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "settings": {"lr": LR, "compression_rate": DEFAULT_RATE, "compression_chunk": CHUNK, "reference_topk": TOPK,
                     "presets": PRESETS, "knobs": KNOBS, "flexdemo": args.flexdemo,
                     "flexdemo_local_steps": ranks["flexdemo"][0]["local_steps"],
                     "flexdemo_step_wise_update": inspect.signature(FlexDeMo).parameters["update"].default,
                     # as the optimizers resolved them
                     "value_dtype": {m: ranks[m][0]["value_dtype"] for m in PRESETS if m in ranks},
                     "adamw": "torch.optim.AdamW defaults but weight_decay=0 (FlexDeMo's default) "
                              + ("(on CUDA: the foreach implementation)" if cuda else
                                 "(on CPU: the for-loop implementation)")},
        "timing": "optimizer.step() wall time after a barrier"
                  + (", between torch.cuda.synchronize() calls" if cuda else "")
                  + "; per step the slowest rank; median and IQR over steps (flexdemo: the mean over whole rounds)",
        "bytes_sent": "per rank and step, (R - 1) x the rank's all-gather input (ring), R = replicas; "
                      "flexdemo: comm_stats['bytes_sent']; reference: counted at dist.all_gather",
        "reference_skipped": why_skipped.get("reference"),
        "profile_flexdemo_rank0": ranks["flexdemo"][0]["profile"],
        "profile_flexdemo_step_wise_rank0": ranks["flexdemo_step_wise"][0]["profile"],
        "methods": methods,
        "ratios": ratios,
        "targets": targets,
    })
    print(table(methods))
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}")
    for name, why in why_skipped.items():
        print(f"{name}: skipped: {why}")
    for name, target in targets.items():
        if target["value"] is None:
            print(f"target {name}: not measured ({args.nproc} rank: nothing is sent)")
            continue
        print(f"target {name}: {target['value']:.2f} vs {target['target']} -> {'met' if target['met'] else 'NOT met'}")
    print(f"wrote {path}")


def positive(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text}")
        return value

    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=tuple(MODELS), default="t5-small")
    parser.add_argument("--steps", type=positive(2), default=10, help="timed steps per method (>= 2)")
    parser.add_argument("--warmup", type=positive(1), default=3, help="untimed steps before them")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: rank r on cuda:{LOCAL_RANK %% device_count}, NCCL, one GPU per rank")
    parser.add_argument("--nproc", type=positive(1), default=NPROC,
                        help="ranks (torchrun --nproc_per_node); 1: no exchange, no sharded method")
    parser.add_argument("--out", type=Path, help="results JSON (default benchmarks/results/optimizer_step*.json)")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="kill the ranks after this many seconds")
    harness.add_flexdemo_flag(parser, "FlexDeMoConfig fields for the flexdemo method (default: the package "
                                      "defaults), e.g. --flexdemo local_steps=8")
    harness.add_provenance_flags(parser)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # set by the driver for the torchrun ranks
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
