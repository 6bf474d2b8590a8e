"""Time to a target validation loss: AdamW-HSDP against FlexDeMo in wall-clock training seconds on slow links.

What and why: FlexDeMo's claim is not fewer bytes for their own sake but reaching a given loss *sooner* when
the link between nodes is slow. This benchmark trains the quick convergence preset (``convergence.py
--quick``: Multi30k en->fr, a T5 of 2 + 2 layers, d_model 128, vocab 4,000, 1.4 M parameters, 16 sentences
per rank per step, same seed and data order for every run) with ``method=adamw`` (FSDP2 HSDP, dense fp32
all-reduce across nodes) and ``method=flexdemo`` at the package defaults (no FlexDeMo flag is passed, so
``FlexDeMoConfig``'s defaults apply), as 2 nodes x 2 CPU ranks in the two network namespaces of
``emulated_link.py`` joined by a veth, rate-limited by ``tc tbf`` on the slow links (one ``torchrun --nnodes 2
--node_rank i --nproc_per_node 2 --rdzv_backend static --master_addr 10.77.0.1`` per namespace, gloo on the
veth, the worker ``convergence_worker.py``). Needs root and iproute2 (``ip``, ``tc``; ``apt-get install -y
iproute2``).

    python benchmarks/time_to_target.py                  # as root; links 10, 25 and 1000 Mbit/s, <= 39 min
    python benchmarks/time_to_target.py --budget_s 3600  # AdamW at 10 Mbit/s trained to the target too
    python benchmarks/time_to_target.py --flexdemo local_steps=1 --out ...  # another FlexDeMo: the step-wise mode

Target and schedule: the target is AdamW's validation loss at the preset's last step (``--max_steps``, 300)
+ ``--margin_pct`` (2 %), but every run trains with a learning-rate schedule of ``--steps_factor`` (1.5) x
that many steps (450: the preset's 15 warmup steps, then linear decay to 0 at step 450), and may train up
to step 450 before it is counted as not reaching the target. One schedule for every run, the target-setting
run included, keeps the methods comparable step for step; taking the target at step 300 of it leaves 150
steps after it, so a method slower per step than AdamW (FlexDeMo) is not judged at its last evaluation. (A
300-step schedule with runs continuing past step 300 would continue at its final learning rate, 0, which
trains nothing.) A crossing at a run's last possible evaluation (its step limit, or the evaluation forced by
its time cap) is flagged ``at_boundary`` in the JSON and the table: the time to target is then an upper
bound of what a longer run would show, and the crossing may be an artefact of the length.

Compute-only reference: the target comes from AdamW on an *unshaped* veth (no ``tc`` qdisc, the veth at memory
speed: the exchange costs next to nothing), trained the whole 450 steps. Its time to target is the time no
inter-node method can beat on this machine: ``vs_compute_only[link]`` = a method's seconds to target on that
link / the compute-only seconds to target (1.0: the link costs nothing). (``bandwidth.py``'s
``compute_only`` times steps without any exchange, which does not train a replicated model to a loss; here
the replicas must stay in sync, so the reference is AdamW with its exchange on a free link.) Runs are
deterministic, so a method's loss at a step does not depend on the link (``determinism_across_links`` in the
JSON checks this on the steps two runs share). Every other run stops at its first evaluation at or below the
target (``convergence_worker.py --stop_at_eval_loss``). The time to target is in training seconds (the
worker's ``train_clock``: wall clock since ``train()`` was called, evaluations excluded) and the steps to
target in optimizer steps, both linearly interpolated between the two evaluations around the crossing
(``--eval_steps`` 25: at most 25 steps apart); the first evaluation at or below the target is recorded too
(``seconds_first_eval``, ``step_first_eval``). ``speedup_to_target[link]`` = AdamW seconds / FlexDeMo seconds
on that link, or null, with the reason in ``speedup_to_target_detail``. Learning rates:
``convergence.DEFAULT_LRS`` (3e-3 for both) unless ``--lrs adamw=... flexdemo=...``.

Order and time budget (``--budget_s``, default 2340 s): the compute-only AdamW run, FlexDeMo on every link,
then AdamW on the links, fastest first (AdamW on an ``unlimited`` link in ``--links`` is the compute-only run).
Each run is capped (``convergence_worker.py --max_train_seconds``: every rank stops at the same step, after a
last evaluation) at what is left of the budget minus the start-up/evaluation overhead (``--overhead_s``, then
the largest measured) of every run still to come and the training seconds reserved for them
(``--reserve_flexdemo_s`` 300, ``--reserve_adamw_s`` 120). AdamW at 10 Mbit/s does not fit: its dense exchange
(2.8 MB per rank, 5.8 MB each way per step for the two ranks of a node) takes >= 4.6 s per step at line rate,
and it needs ~250 steps to reach the target: ~21 min on its own. It gets what is left of the budget (~6 min,
~65 steps); when it stops short, ``speedup_to_target`` is null for that link and the detail gives the
measured lower bound (AdamW had not reached the target after the training seconds it ran, so the speedup is
at least that / FlexDeMo's seconds) and a projection (AdamW's step at the target on the compute-only run x its
measured seconds per step on this link; labelled "not measured", drawn dotted in the plot).

Duration estimate, from ``--links 25 200`` on the quiet 2-core machine (300-step runs, 1328 s for 4 runs):
each run has ~25 s of start-up, data loading and teardown plus its evaluations (~2 s each, up to 19 at
``--eval_steps`` 25); per step AdamW takes ~0.37 s unshaped, ~0.42 s at 1000 Mbit/s, 2.49 s at 25 Mbit/s and
~5 s at 10 Mbit/s; FlexDeMo (1/10.6 of AdamW's bytes) ~0.40 s at 1000 Mbit/s, 0.67 s at 25 Mbit/s, ~0.9 s at
10 Mbit/s. With AdamW crossing near step 250 and FlexDeMo near 350-400: compute-only ~230 s, FlexDeMo ~210,
~310 and ~390 s, AdamW at 1000 and 25 Mbit/s ~155 and ~670 s: ~33 min, then AdamW at 10 Mbit/s until the
budget (39 min) is spent. On a loaded machine (twice the step time) the budget runs out earlier (a FlexDeMo
run can then be stopped short of the target, which the JSON says): run it alone, or raise ``--budget_s``.

Writes ``benchmarks/results/time_to_target_quick.json`` (command, machine, versions, settings, schedule rule,
target, compute-only reference, per run: validation loss against training seconds and steps, the stop
reason, veth counters before/after, the ``flexdemo/*`` byte logs; per link: seconds and steps to target with
``at_boundary``, ``vs_compute_only``, the speedup, AdamW's exchange against its compute) and a ``.png`` plot
(validation loss against training seconds, one panel per link, the compute-only run in grey, the target as a
line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import convergence
import harness
from emulated_link import EmulatedLink, LinkCounters, LinkSetupError, link_label, link_rate

HERE = Path(__file__).resolve().parent
NODES, RANKS_PER_NODE = 2, 2
MASTER_PORT = 29500
METHODS = ("adamw", "flexdemo")


def method_lr(text: str) -> tuple[str, float]:
    method, value = convergence.method_lr(text)
    if method not in METHODS:
        raise argparse.ArgumentTypeError(f"--lrs takes adamw=LR or flexdemo=LR, got {text!r}")
    return method, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", nargs="+", type=link_rate, default=[10.0, 25.0, 1000.0],
                        help="link rates in Mbit/s (or 'unlimited'); the compute-only AdamW run that sets the "
                             "target is on an unshaped link whatever this says")
    parser.add_argument("--lrs", nargs="+", type=method_lr, default=[], metavar="METHOD=LR",
                        help="default: convergence.DEFAULT_LRS (3e-3 for both)")
    parser.add_argument("--margin_pct", type=float, default=2.0,
                        help="target = AdamW's loss at step --max_steps x (1 + this/100)")
    parser.add_argument("--max_steps", type=int, help="the step whose AdamW loss sets the target; default: the "
                        "quick preset's 300")
    parser.add_argument("--steps_factor", type=float, default=1.5, help="every run's schedule and step limit: this "
                        "x --max_steps (rounded up to a multiple of --eval_steps and --logging_steps)")
    parser.add_argument("--eval_steps", type=int, default=25)
    parser.add_argument("--logging_steps", type=int, help="default: --eval_steps (the flexdemo/* byte logs)")
    parser.add_argument("--warmup_steps", type=int, help="default: the quick preset's 15")
    parser.add_argument("--budget_s", type=float, default=2340.0, help="wall-clock budget of the whole run")
    parser.add_argument("--overhead_s", type=float, default=90.0, help="first estimate of a run's start-up, "
                        "evaluation and teardown seconds (then the largest measured)")
    parser.add_argument("--reserve_flexdemo_s", type=float, default=300.0,
                        help="training seconds reserved for each FlexDeMo run still to come when capping a run")
    parser.add_argument("--reserve_adamw_s", type=float, default=120.0,
                        help="training seconds reserved for each slow-link AdamW run still to come (enough steps "
                             "to measure its step time)")
    harness.add_flexdemo_flag(parser, "FlexDeMoConfig fields of the FlexDeMo runs (default: the package defaults), "
                                      "e.g. --flexdemo local_steps=4 value_dtype=int2")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "time_to_target_quick.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args(argv)
    argv_conv = ["--quick", "--bleu_samples", "0", "--eval_steps", str(args.eval_steps),
                 "--logging_steps", str(args.logging_steps or args.eval_steps)]
    for name in ("max_steps", "warmup_steps"):
        if getattr(args, name) is not None:
            argv_conv += [f"--{name}", str(getattr(args, name))]
    args.convergence_argv = argv_conv
    args.convergence = convergence.parse_args(argv_conv)  # validates --eval_steps against the target step
    args.convergence.methods = list(METHODS)
    args.convergence.flexdemo = args.flexdemo
    if args.steps_factor < 1:
        parser.error(f"--steps_factor must be >= 1, got {args.steps_factor:g}")
    args.target_step = args.convergence.max_steps
    unit = math.lcm(args.convergence.eval_steps, args.convergence.logging_steps)
    args.convergence.max_steps = unit * math.ceil(args.steps_factor * args.target_step / unit - 1e-9)
    args.lrs = {**{m: convergence.DEFAULT_LRS[m] for m in METHODS}, **dict(args.lrs)}
    if len(set(args.links)) != len(args.links):
        parser.error("--links has a rate twice")
    return args


def speed(rate: float | None) -> float:
    return math.inf if rate is None else rate


def key(rate: float | None) -> str:
    return "unlimited" if rate is None else f"{rate:g}"


def plan(links: list[float | None]) -> list[tuple[str, float | None, bool]]:
    """``(method, link, stop at target)``: the compute-only AdamW run (unshaped link, to the end), FlexDeMo on
    every link, then AdamW on the shaped links; fastest links first, so the slowest AdamW run gets what is left
    of the budget."""
    ordered = sorted(links, key=speed, reverse=True)
    return [("adamw", None, False), *(("flexdemo", r, True) for r in ordered),
            *(("adamw", r, True) for r in ordered if r is not None)]


def worker_command(args: argparse.Namespace, link: EmulatedLink, node: int, method: str, out: Path,
                   scratch: Path, target: float | None, max_train_seconds: float) -> list[str]:
    """``convergence.py``'s worker and options (same preset, data and seed), launched as node ``node`` of 2."""
    options = args.convergence if method == "flexdemo" else argparse.Namespace(**{**vars(args.convergence),
                                                                                 "flexdemo": []})
    worker = convergence.worker_args(options, method, args.lrs[method], 0, out, scratch / f"output-node{node}")
    worker.append(f"--max_train_seconds={max_train_seconds:.1f}")
    if target is not None:
        worker.append(f"--stop_at_eval_loss={target!r}")
    return link.command(node, harness.torchrun(worker, RANKS_PER_NODE, nnodes=NODES, node_rank=node,
                                               master_addr=link.addresses[0], master_port=MASTER_PORT))


def counters(c: LinkCounters) -> dict[str, int]:
    return {"tx_bytes": c.tx_bytes, "rx_bytes": c.rx_bytes}


def run(args: argparse.Namespace, method: str, rate: float | None, target: float | None, max_train_seconds: float,
        timeout_s: float, scratch: Path) -> dict[str, Any]:
    """One run of ``method`` on a fresh link: the worker's result summarised, the veth counters, the stop reason."""
    tag = f"{method}-{key(rate)}"
    out = scratch / f"{tag}.json"
    logs = [scratch / f"{tag}-node{node}.log" for node in range(NODES)]
    print(f"[time_to_target] {method} on {link_label(rate)} (max {max_train_seconds:.0f} training s) ...", flush=True)
    with EmulatedLink(rate) as link:
        before = link.counters(0)
        commands = [worker_command(args, link, node, method, out, scratch, target, max_train_seconds)
                    for node in range(NODES)]
        envs = [harness.worker_env(gloo_interface=link.interfaces[node],
                                   datasets_cache=scratch / f"datasets-node{node}")  # each node its own cache
                for node in range(NODES)]
        job = harness.run_job(commands, logs, timeout_s, envs, expect=out)
        after = link.counters(0)
        described = link.describe()
    seconds = job["launch_seconds"]
    record: dict[str, Any] = {"method": method, "link": described, "lr": args.lrs[method],
                              "stop_at_eval_loss": target, "max_steps": args.convergence.max_steps,
                              "max_train_seconds": max_train_seconds,
                              "launch_seconds": seconds,
                              "veth_counters_node0": {"before": counters(before), "after": counters(after),
                                                      "total_bytes": after.total - before.total}}
    if job["status"] != harness.OK:
        print(f"[time_to_target] {tag}: {job['status']} (exit codes {job['returncodes']}) after {seconds:.0f} s",
              flush=True)
        return {**record, **job}
    result = json.loads(out.read_text())
    summary = convergence.summarize({"status": "ok", **result, "launch_seconds": seconds})
    clock = {p["step"]: p["train_seconds"] for p in result["train_clock"]}
    points = [{"step": p["step"], "eval_loss": p["eval_loss"], "train_seconds": clock[p["step"]]}
              for p in summary["curve"] if p["step"] in clock]
    comm = [e["flexdemo/comm_seconds"] for e in result["log_history"] if "flexdemo/comm_seconds" in e]
    steps = result["global_step"]
    record |= {
        "status": "ok",
        "stopped_by": result["stop_rule"]["stopped_by"] or f"max_steps {args.convergence.max_steps}",
        "global_step": steps,
        "points": points,
        "final_eval_loss": points[-1]["eval_loss"],
        "final_train_seconds": points[-1]["train_seconds"],
        "seconds_per_step": seconds_per_step(points),
        "overhead_seconds": seconds - points[-1]["train_seconds"],
        "eval_seconds": summary["eval_seconds_during_training"],
        "bytes_sent": summary["bytes_sent"],
        "flexdemo_log_bytes_sent_per_step": [e["flexdemo/bytes_sent"] for e in result["log_history"]
                                             if "flexdemo/bytes_sent" in e],
        "flexdemo_comm_seconds_per_step": sum(comm) / len(comm) if comm else None,
        "dense_allreduce_bytes_per_step": result["dense_allreduce_bytes_per_step"],
        "veth_bytes_per_step": (after.total - before.total) / max(steps, 1),
        "parameters": result["parameters"],
        "topology": result["topology"],
        "flexdemo_config": result["flexdemo_config"] if method != "adamw" else None,
        "training_args": result["training_args"],
    }
    print(f"[time_to_target] {tag}: {record['stopped_by']}; step {steps}, loss {record['final_eval_loss']:.4f} "
          f"after {record['final_train_seconds']:.1f} training s ({record['seconds_per_step']:.3f} s/step), "
          f"{seconds:.0f} s in all", flush=True)
    return record


def seconds_per_step(points: list[dict[str, float]]) -> float:
    """Training seconds per step between the first and the last evaluation (start-up excluded)."""
    first, last = points[0], points[-1]
    return (last["train_seconds"] - first["train_seconds"]) / max(last["step"] - first["step"], 1)


def reach(points: list[dict[str, float]], target: float) -> dict[str, Any]:
    """When the validation loss first reaches ``target``: interpolated, and at the first evaluation at or below."""
    for i, p in enumerate(points):
        if p["eval_loss"] > target:
            continue
        if i == 0:
            return {"reached": True, "seconds": p["train_seconds"], "step": p["step"],
                    "seconds_first_eval": p["train_seconds"], "step_first_eval": p["step"]}
        q = points[i - 1]
        share = (q["eval_loss"] - target) / (q["eval_loss"] - p["eval_loss"])
        return {"reached": True, "seconds": q["train_seconds"] + share * (p["train_seconds"] - q["train_seconds"]),
                "step": q["step"] + share * (p["step"] - q["step"]),
                "seconds_first_eval": p["train_seconds"], "step_first_eval": p["step"]}
    return {"reached": False, "seconds": None, "step": None}


def run_to_target(r: dict[str, Any], target: float) -> dict[str, Any]:
    """:func:`reach` for one run, with ``at_boundary``: reached at the run's last evaluation, and that evaluation
    was the last the run could make (its step limit, or the one its time cap forced), so a longer run might
    have crossed later or not at all."""
    entry = reach(r["points"], target)
    last = r["points"][-1]
    entry["at_boundary"] = entry["reached"] and entry["step_first_eval"] == last["step"] and (
        last["step"] >= r["max_steps"] or last["train_seconds"] >= r["max_train_seconds"])
    return entry


def time_to_target(runs: list[dict[str, Any]], target: float, reference: dict[str, Any],
                   links: list[float | None]) -> dict[str, Any]:
    """Per link: each method's time and steps to target (or why not), the speedup and the detail behind it,
    and each method's time against the compute-only run's (``reference``)."""
    times: dict[str, Any] = {}
    speedups: dict[str, float | None] = {}
    detail: dict[str, Any] = {}
    vs_compute_only: dict[str, Any] = {}
    compute_only = run_to_target(reference, target)
    crossing_step = compute_only["step"]
    for rate in links:
        by_method = {r["method"]: r for r in runs if r["link"]["rate_mbit"] == rate}
        times[key(rate)] = {}
        for method in METHODS:
            r = by_method.get(method)
            if r is None or r["status"] != "ok":
                times[key(rate)][method] = {"reached": False, "at_boundary": False,
                                            "reason": "not run" if r is None else r["status"]}
                continue
            entry = run_to_target(r, target)
            if not entry["reached"]:
                last = r["points"][-1]
                entry["lower_bound_seconds"] = last["train_seconds"]
                entry["reason"] = (f"not reached: {r['stopped_by']}; last evaluation step {last['step']}, loss "
                                   f"{last['eval_loss']:.4f} > target {target:.4f} after {last['train_seconds']:.1f} s")
                if method == "adamw" and crossing_step is not None:
                    entry["projected_seconds"] = r["points"][0]["train_seconds"] + crossing_step * r["seconds_per_step"]
                    entry["projection"] = (f"start-up point + AdamW's step at the target on the compute-only run "
                                           f"({crossing_step:.1f}) x this run's {r['seconds_per_step']:.3f} s/step; "
                                           "not measured")
            times[key(rate)][method] = entry
        adamw, flexdemo = times[key(rate)]["adamw"], times[key(rate)]["flexdemo"]
        info: dict[str, Any] = {}
        if adamw["reached"] and flexdemo["reached"]:
            speedups[key(rate)] = adamw["seconds"] / flexdemo["seconds"]
            info["first_eval_speedup"] = adamw["seconds_first_eval"] / flexdemo["seconds_first_eval"]
        else:
            speedups[key(rate)] = None
            info["reason"] = "; ".join(f"{m}: {t.get('reason', 'reached')}"
                                       for m, t in (("adamw", adamw), ("flexdemo", flexdemo)) if not t["reached"])
            if flexdemo["reached"] and "lower_bound_seconds" in adamw:
                info["speedup_lower_bound"] = adamw["lower_bound_seconds"] / flexdemo["seconds"]
            if flexdemo["reached"] and "projected_seconds" in adamw:
                info["speedup_projected"] = adamw["projected_seconds"] / flexdemo["seconds"]
        if any(t["at_boundary"] for t in (adamw, flexdemo)):
            info["at_boundary"] = [m for m, t in (("adamw", adamw), ("flexdemo", flexdemo)) if t["at_boundary"]]
        detail[key(rate)] = {"speedup": speedups[key(rate)], **info}
        vs_compute_only[key(rate)] = versus(compute_only["seconds"], adamw, flexdemo)
    return {"compute_only": compute_only, "times": times, "speedups": speedups, "detail": detail,
            "vs_compute_only": vs_compute_only}


def versus(compute_only: float | None, adamw: dict[str, Any], flexdemo: dict[str, Any]) -> dict[str, Any]:
    """Each method's seconds to target / the compute-only seconds to target (>= 1: what the link costs), null
    when not reached; for an AdamW run stopped short, the ratio of its lower bound and of its projection."""
    out: dict[str, Any] = {}
    for method, t in (("flexdemo", flexdemo), ("adamw", adamw)):
        out[method] = t["seconds"] / compute_only if t["reached"] and compute_only else None
        for bound in ("lower_bound", "projected"):
            if not t["reached"] and compute_only and f"{bound}_seconds" in t:
                out[f"{method}_{bound}"] = t[f"{bound}_seconds"] / compute_only
    return out


def exchange_vs_compute(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Is each link slow enough that AdamW's exchange costs more than its compute? A conservative check.

    The exchange takes at least its bytes at line rate: per step each direction carries half of the ring
    all-reduce bytes of all ranks. So ``step - that`` is an upper bound on the rest (compute, FSDP, overheads):
    if the lower bound of the exchange exceeds it, the exchange certainly costs more than the compute.
    """
    checks = {}
    for r in runs:
        if r["method"] != "adamw" or r["status"] != "ok":
            continue
        rate = r["link"]["rate_mbit"]
        per_direction = r["dense_allreduce_bytes_per_step"] / 2
        exchange = 0.0 if rate is None else per_direction / (rate * 1e6 / 8)
        step = r["seconds_per_step"]
        checks[key(rate)] = {
            "adamw_seconds_per_step": step,
            "exchange_bytes_each_way_per_step": per_direction,
            "exchange_seconds_at_line_rate": exchange,
            "compute_seconds_upper_bound": step - exchange,
            "exchange_exceeds_compute": exchange > step - exchange,
        }
    return checks


def determinism(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method, the largest validation-loss difference between its runs on different links at the steps they
    share (0.0: the link changes the timing only, so AdamW's final loss on one link is its final loss on all)."""
    checks = {}
    for method in METHODS:
        ok = [r for r in runs if r["method"] == method and r["status"] == "ok"]
        if len(ok) < 2:
            checks[method] = {"checked": False, "why": f"fewer than two {method} runs"}
            continue
        curves = [{p["step"]: p["eval_loss"] for p in r["points"]} for r in ok]
        shared = sorted(set(curves[0]).intersection(*curves[1:]))
        diff = max((abs(c[s] - curves[0][s]) for c in curves[1:] for s in shared), default=0.0)
        checks[method] = {"checked": True, "shared_steps": shared, "max_abs_eval_loss_difference": diff}
    return checks


def plot(runs: list[dict[str, Any]], links: list[float | None], target: float, found: dict[str, Any],
         title: str, path: Path) -> None:
    """Validation loss against training seconds, one panel per link, the target as a horizontal line, the
    compute-only run (``runs[0]``) in grey with its time to target as a vertical line.

    A projected AdamW time (a run stopped by the budget) is drawn dotted: the compute-only run's later points
    at this run's seconds per step, ending with an x at the target."""
    order = sorted(links, key=speed)
    colours = {"adamw": "tab:blue", "flexdemo": "tab:orange"}
    with harness.figure(path, len(order), (max(7.5, 6 * len(order)), 4.8), title) as panels:
        for axes, rate in zip(panels, order):
            draw_link(axes, runs, rate, target, found, colours)


def draw_link(axes: Any, runs: list[dict[str, Any]], rate: float | None, target: float, found: dict[str, Any],
              colours: dict[str, str]) -> None:
    """One panel of :func:`plot`: the runs on the link of ``rate``."""
    times, ratios, compute_only = found["times"][key(rate)], found["vs_compute_only"][key(rate)], found["compute_only"]
    reference = runs[0]
    if rate is not None:
        axes.plot([p["train_seconds"] for p in reference["points"]], [p["eval_loss"] for p in reference["points"]],
                  color="grey", linewidth=1, alpha=0.7, label="compute-only (adamw, unshaped link)")
    if compute_only["reached"]:
        axes.axvline(compute_only["seconds"], color="grey", linestyle=":", linewidth=1,
                     label=f"compute-only at target: {compute_only['seconds']:.0f} s")
    for r in runs:
        if r["link"]["rate_mbit"] != rate or r["status"] != "ok":
            continue
        seconds = [p["train_seconds"] for p in r["points"]]
        losses = [p["eval_loss"] for p in r["points"]]
        method = r["method"]
        t = times[method]
        if t["reached"]:
            label = f"{method}: target at {t['seconds']:.0f} s, step {t['step']:.0f}"
            if ratios[method] is not None:
                label += f", {ratios[method]:.2f}x compute-only"
            if t["at_boundary"]:
                label += " (at its last evaluation)"
        else:
            label = f"{method}: target not reached"
        axes.plot(seconds, losses, marker="o", markersize=3, color=colours[method], label=label)
        if t["reached"]:
            axes.plot([t["seconds"]], [target], marker="*", markersize=12, color=colours[method])
        elif "projected_seconds" in t:
            start, pace, last = r["points"][0]["train_seconds"], r["seconds_per_step"], r["points"][-1]["step"]
            later = [(start + p["step"] * pace, p["eval_loss"]) for p in reference["points"]
                     if last < p["step"] and p["eval_loss"] > target]
            xs, ys = zip(*[(seconds[-1], losses[-1]), *later, (t["projected_seconds"], target)])
            axes.plot(xs, ys, marker="x", markevery=[len(xs) - 1], markersize=10, linestyle=":", color=colours[method],
                      label=f"{method}: projected {t['projected_seconds']:.0f} s, "
                            f"{ratios.get(method + '_projected', math.nan):.2f}x compute-only (not measured)")
    axes.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:.3f}")
    axes.set_title(f"link {link_label(rate)}", fontsize=10)
    axes.set_xlabel("training seconds (evaluations excluded)")
    axes.set_ylabel("validation loss")
    axes.set_ylim(top=min(axes.get_ylim()[1], target * 2.2))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)


def cell(t: dict[str, Any], ratio: dict[str, Any], method: str) -> list[str]:
    """Table cells of one method on one link: seconds (step) to target, and / compute-only."""
    if t["reached"]:
        boundary = " (at its last evaluation)" if t["at_boundary"] else ""
        return [f"{t['seconds']:.1f} (step {t['step']:.0f}){boundary}",
                "-" if ratio[method] is None else f"{ratio[method]:.2f}"]
    if "projected_seconds" in t:
        return [f"> {t['lower_bound_seconds']:.0f} (projected {t['projected_seconds']:.0f})",
                f">= {ratio.get(method + '_lower_bound', math.nan):.2f} "
                f"(projected {ratio.get(method + '_projected', math.nan):.2f})"]
    return ["not reached", "-"]


def print_table(links: list[float | None], found: dict[str, Any]) -> None:
    compute_only = found["compute_only"]
    if compute_only["reached"]:
        print(f"[time_to_target] compute-only (adamw, unshaped link): target at {compute_only['seconds']:.1f} "
              f"training s, step {compute_only['step']:.1f}" + (" (at its last evaluation)"
                                                                  if compute_only["at_boundary"] else ""))
    rows = []
    for rate in sorted(links, key=speed):
        cells = [link_label(rate)]
        for method in METHODS:
            cells += cell(found["times"][key(rate)][method], found["vs_compute_only"][key(rate)], method)
        d = found["detail"][key(rate)]
        if d["speedup"] is not None:
            cells.append(f"{d['speedup']:.2f}")
        elif "speedup_lower_bound" in d:
            cells.append(f">= {d['speedup_lower_bound']:.2f} (projected {d.get('speedup_projected', math.nan):.2f})")
        else:
            cells.append("-")
        rows.append(cells)
    print(harness.markdown_table(["link", "adamw s (step) to target", "adamw / compute-only",
                                  "flexdemo s (step) to target", "flexdemo / compute-only", "speedup"], rows))


def target_loss(record: dict[str, Any], step: int) -> float | None:
    """The run's validation loss at ``step``, or None (the run failed or stopped before it)."""
    if record["status"] != "ok":
        return None
    return next((p["eval_loss"] for p in record["points"] if p["step"] == step), None)


def main() -> None:
    args = parse_args()
    bench = harness.Run.start(args.out, args.allow_dirty)  # the machine's load average: other jobs slow the ranks
    steps = plan(args.links)
    runs: list[dict[str, Any]] = []
    overhead = args.overhead_s
    target = None
    with tempfile.TemporaryDirectory(prefix="fdm-time-to-target-") as scratch:
        for i, (method, rate, stops) in enumerate(steps):
            later = steps[i + 1:]
            remaining = args.budget_s - bench.seconds
            reserved = sum(overhead + (args.reserve_flexdemo_s if m == "flexdemo" else args.reserve_adamw_s)
                           for m, _, _ in later)
            cap = remaining - overhead - reserved
            if i == 0 and cap < 10:
                sys.exit(f"[time_to_target] --budget_s {args.budget_s:g} leaves {cap:.0f} s for the compute-only run "
                         "run after the reserves for the other runs: raise it")
            if cap < 10 or (stops and target is None):
                why = "no target (the compute-only run failed)" if stops and target is None else "budget spent"
                runs.append({"method": method, "link": {"rate_mbit": rate}, "status": f"skipped: {why}"})
                print(f"[time_to_target] {method} on {link_label(rate)}: skipped ({why})", flush=True)
                continue
            timeout = cap + 2 * overhead + 300
            try:
                record = run(args, method, rate, target if stops else None, cap, timeout, Path(scratch))
            except LinkSetupError as err:
                sys.exit(f"[time_to_target] cannot set the emulated link up: {err}")
            runs.append(record)
            if record["status"] == "ok":
                overhead = max(overhead, record["overhead_seconds"])
            if i == 0:
                at_step = target_loss(record, args.target_step)
                if at_step is None:
                    why = record.get("stopped_by") or record["status"]
                    bench.write(args.out, {"error": why, "runs": runs})
                    sys.exit(f"[time_to_target] the compute-only run did not reach step {args.target_step} ({why}): "
                             f"no target; see {args.out}, raise --budget_s")
                target = at_step * (1 + args.margin_pct / 100)
                print(f"[time_to_target] target: {at_step:.4f} (step {args.target_step}) x "
                      f"{1 + args.margin_pct / 100:g} = {target:.4f}", flush=True)
    reference = runs[0]
    found = time_to_target(runs, target, reference, args.links)
    report = bench.write(args.out, {
        "budget_s": args.budget_s,
        "plan": [f"{m} on {link_label(r)}" + (", stop at the target" if s else ", to the end (compute-only)")
                 for m, r, s in steps],
        "topology": f"{NODES} nodes x {RANKS_PER_NODE} CPU ranks, one torchrun per network namespace, gloo on a "
                    "veth, tc tbf rate-limited but for the unshaped compute-only run (emulated_link.py)",
        "settings": {
            **{k: v for k, v in convergence.settings(args.convergence).items() if k != "methods"},
            "convergence_argv": args.convergence_argv, "methods": list(METHODS), "learning_rates": args.lrs,
            "links_mbit": args.links, "margin_pct": args.margin_pct, "target_step": args.target_step,
            "steps_factor": args.steps_factor, "overhead_s": args.overhead_s,
            "reserve_flexdemo_s": args.reserve_flexdemo_s, "reserve_adamw_s": args.reserve_adamw_s,
            "flexdemo": args.flexdemo or "FlexDeMoConfig defaults (no FlexDeMo flag passed)",
        },
        "schedule": f"every run: {args.convergence.warmup_steps} warmup steps, then linear decay to 0 at step "
                    f"{args.convergence.max_steps} (--steps_factor {args.steps_factor:g} x the target step "
                    f"{args.target_step}, rounded up to a multiple of --eval_steps and --logging_steps); a run "
                    f"that has not reached the target by step {args.convergence.max_steps} has not reached it",
        "target": {"adamw_eval_loss_at_target_step": target_loss(reference, args.target_step),
                   "target_step": args.target_step, "margin_pct": args.margin_pct, "target_eval_loss": target,
                   "from": f"adamw on an unshaped link (the compute-only run), its evaluation at step "
                           f"{args.target_step} of {args.convergence.max_steps}"},
        "time_to_target_method": "training seconds (train_clock: evaluations excluded) and optimizer steps where "
                                 "the validation loss first reaches the target, linearly interpolated between the "
                                 "two evaluations around the crossing; seconds_first_eval, step_first_eval: the "
                                 "first evaluation at or below it; at_boundary: that evaluation was the run's last "
                                 "possible one (its step limit, or the one its time cap forced)",
        "compute_only": {"method": "adamw", "link": "unshaped veth (no tc qdisc)",
                         "why": "the exchange costs next to nothing: the time no inter-node method can beat here",
                         **found["compute_only"]},
        "vs_compute_only": found["vs_compute_only"],
        "speedup_to_target": found["speedups"],
        "speedup_to_target_detail": found["detail"],
        "time_to_target": found["times"],
        "adamw_exchange_vs_compute": exchange_vs_compute(runs),
        "determinism_across_links": determinism(runs),
        "runs": runs,
    })
    title = (f"Time to AdamW's validation loss at step {args.target_step} + {args.margin_pct:g} % (schedule "
             f"{args.convergence.max_steps} steps)\nT5 d{args.convergence.d_model} "
             f"{args.convergence.num_layers}+{args.convergence.num_layers} layers, Multi30k en->fr, {NODES} nodes x "
             f"{RANKS_PER_NODE} CPU ranks, FlexDeMo " + (" ".join(args.flexdemo) or "at the package defaults"))
    plot(runs, args.links, target, found, title, args.out.with_suffix(".png"))
    print_table(args.links, found)
    for link, check in report["adamw_exchange_vs_compute"].items():
        print(f"[time_to_target] adamw on {link}: {check['adamw_seconds_per_step']:.3f} s/step, exchange >= "
              f"{check['exchange_seconds_at_line_rate']:.3f} s at line rate: exchange "
              f"{'>' if check['exchange_exceeds_compute'] else '<='} compute")
    print(f"[time_to_target] wrote {args.out} and {args.out.with_suffix('.png')} in {report['duration_seconds']:.0f} s",
          flush=True)
    if any(r["status"] != "ok" for r in runs):
        sys.exit("[time_to_target] some runs failed or were skipped: see their status in the JSON")


if __name__ == "__main__":
    main()
