"""Time to a target validation loss: AdamW-HSDP against FlexDeMo in wall-clock training seconds on slow links.

What and why: FlexDeMo's claim is not fewer bytes for their own sake but reaching a given loss *sooner* when
the link between nodes is slow. This benchmark trains the quick convergence preset (``convergence.py
--quick``: Multi30k en->fr, a T5 of 2 + 2 layers, d_model 128, vocab 4,000, 1.4 M parameters, 16 sentences
per rank per step, 300 steps, same seed and data order for every run) with ``method=adamw`` (FSDP2 HSDP,
dense fp32 all-reduce across nodes) and ``method=flexdemo`` at the package defaults (no FlexDeMo flag is
passed, so ``FlexDeMoConfig``'s defaults apply), as 2 nodes x 2 CPU ranks in the two network namespaces of
``emulated_link.py`` joined by a ``tc tbf`` rate-limited veth (one ``torchrun --nnodes 2 --node_rank i
--nproc_per_node 2 --rdzv_backend static --master_addr 10.77.0.1`` per namespace, gloo on the veth, the
worker ``convergence_worker.py``). Needs root and iproute2 (``ip``, ``tc``; ``apt-get install -y iproute2``).

    python benchmarks/time_to_target.py                  # as root; links 10 and 100 Mbit/s, ~28 min on 2 cores
    python benchmarks/time_to_target.py --budget_s 2700  # AdamW at 10 Mbit/s trained to the target: ~45 min

The target is AdamW's final validation loss + ``--margin_pct`` (2 %), taken from the first run: AdamW on the
fastest link, trained to the end (runs are deterministic, so a method's loss at a step does not depend on the
link; ``determinism_across_links`` in the JSON checks this on the steps two runs share). Every later run
stops at its first evaluation at or below the target (``convergence_worker.py --stop_at_eval_loss``). The
time to target is in training seconds (the worker's ``train_clock``: wall clock since ``train()`` was called,
evaluations excluded) at which the validation loss first reaches the target, linearly interpolated between
the two evaluations around the crossing (``--eval_steps`` 25: at most 25 steps apart); the first evaluation at
or below the target is recorded too (``seconds_first_eval``). ``speedup_to_target[link]`` = AdamW seconds /
FlexDeMo seconds on that link, or null, with the reason in ``speedup_to_target_detail``. Learning rates:
``convergence.DEFAULT_LRS`` (3e-3 for both) unless ``--lrs adamw=... flexdemo=...``.

Order and time budget (``--budget_s``, default 1680 s): AdamW on the fastest link, FlexDeMo on every link,
then AdamW on the slower links, fastest links first. Each run is capped (``convergence_worker.py
--max_train_seconds``: every rank stops at the same step, after a last evaluation) at what is left of the
budget minus the start-up/evaluation overhead (``--overhead_s``, then the largest measured) of every run still
to come and the training seconds reserved for them (``--reserve_flexdemo_s`` 400, ``--reserve_adamw_s`` 120).
AdamW at 10 Mbit/s does not fit in 30 minutes: its dense exchange (2.8 MB per rank, 5.8 MB each way per step
for the two ranks of a node) takes >= 4.6 s per step at line rate, and it needs ~240 of the 300 steps to reach
the target: ~20 min on its own. It gets what is left of the budget (~8 min, ~95 steps); when it stops short,
``speedup_to_target`` is null for that link and the detail gives the measured lower bound (AdamW had not
reached the target after the training seconds it ran, so the speedup is at least that / FlexDeMo's seconds)
and a projection (AdamW's step at the target on the reference run x its measured seconds per step on this link;
labelled "not measured", drawn dotted in the plot). ``--budget_s 2700`` measures it instead.

Duration, from smoke runs (``--max_steps 20 --eval_steps 5 --links 10 100``: 552 s for the 4 runs) on this
2-core machine while another 4-rank training job ran beside it (load average ~12), and from the quick
convergence run on the quiet machine (0.5 s/step of compute): each run has ~45-110 s of start-up, data
loading and teardown plus its evaluations (~3-6.5 s each, 13 at ``--eval_steps 25``), and per step ~0.5 s of
compute (1.0-1.3 s under that load) plus the exchange: AdamW +0.5 s at 100 Mbit/s and +4.6 s at 10 Mbit/s
(7.2 s/step measured under load); FlexDeMo at the first release's rate 1/8 sent 1/8 of AdamW's bytes (+0.1 s
at 100 Mbit/s, +0.8 s at 10 Mbit/s; the defaults now send 1/10.6). On the quiet machine: AdamW at 100 Mbit/s
~6 min, FlexDeMo ~4 and ~8 min, AdamW at 10 Mbit/s the rest of the 28 min. On a loaded machine the budget runs
out earlier (FlexDeMo at 10 Mbit/s can then be stopped short of the target, which the JSON says): run it alone,
or raise ``--budget_s``.

Writes ``benchmarks/results/time_to_target_quick.json`` (command, machine, versions, settings, target, per
run: validation loss against training seconds, the stop reason, veth counters before/after, the
``flexdemo/*`` byte logs; per link: the times to target, the speedup, AdamW's exchange against its compute)
and a ``.png`` plot (validation loss against training seconds, one panel per link, the target as a line).
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
    parser.add_argument("--links", nargs="+", type=link_rate, default=[10.0, 100.0],
                        help="link rates in Mbit/s (or 'unlimited'); AdamW's reference run uses the fastest")
    parser.add_argument("--lrs", nargs="+", type=method_lr, default=[], metavar="METHOD=LR",
                        help="default: convergence.DEFAULT_LRS (3e-3 for both)")
    parser.add_argument("--margin_pct", type=float, default=2.0, help="target = AdamW's final loss x (1 + this/100)")
    parser.add_argument("--max_steps", type=int, help="default: the quick preset's 300")
    parser.add_argument("--eval_steps", type=int, default=25)
    parser.add_argument("--logging_steps", type=int, help="default: --eval_steps (the flexdemo/* byte logs)")
    parser.add_argument("--warmup_steps", type=int, help="default: the quick preset's 15")
    parser.add_argument("--budget_s", type=float, default=1680.0, help="wall-clock budget of the whole run")
    parser.add_argument("--overhead_s", type=float, default=120.0, help="first estimate of a run's start-up, "
                        "evaluation and teardown seconds (then the largest measured)")
    parser.add_argument("--reserve_flexdemo_s", type=float, default=400.0,
                        help="training seconds reserved for each FlexDeMo run still to come when capping a run")
    parser.add_argument("--reserve_adamw_s", type=float, default=120.0,
                        help="training seconds reserved for each slow-link AdamW run still to come (enough steps "
                             "to measure its step time)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "time_to_target_quick.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args(argv)
    argv_conv = ["--quick", "--bleu_samples", "0", "--eval_steps", str(args.eval_steps),
                 "--logging_steps", str(args.logging_steps or args.eval_steps)]
    for name in ("max_steps", "warmup_steps"):
        if getattr(args, name) is not None:
            argv_conv += [f"--{name}", str(getattr(args, name))]
    args.convergence_argv = argv_conv
    args.convergence = convergence.parse_args(argv_conv)
    args.convergence.methods = list(METHODS)
    args.lrs = {**{m: convergence.DEFAULT_LRS[m] for m in METHODS}, **dict(args.lrs)}
    if len(set(args.links)) != len(args.links):
        parser.error("--links has a rate twice")
    return args


def speed(rate: float | None) -> float:
    return math.inf if rate is None else rate


def key(rate: float | None) -> str:
    return "unlimited" if rate is None else f"{rate:g}"


def plan(links: list[float | None]) -> list[tuple[str, float | None, bool]]:
    """``(method, link, stop at target)``: AdamW to the end on the fastest link, FlexDeMo on every link, then
    AdamW on the slower links; fastest links first, so the slowest AdamW run gets what is left of the budget."""
    ordered = sorted(links, key=speed, reverse=True)
    return [("adamw", ordered[0], False), *(("flexdemo", r, True) for r in ordered),
            *(("adamw", r, True) for r in ordered[1:])]


def worker_command(args: argparse.Namespace, link: EmulatedLink, node: int, method: str, out: Path,
                   scratch: Path, target: float | None, max_train_seconds: float) -> list[str]:
    """``convergence.py``'s worker and options (same preset, data and seed), launched as node ``node`` of 2."""
    worker = convergence.worker_args(args.convergence, method, args.lrs[method], 0, out, scratch / f"output-node{node}")
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
                              "stop_at_eval_loss": target, "max_train_seconds": max_train_seconds,
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


def time_to_target(runs: list[dict[str, Any]], target: float, reference: dict[str, Any],
                   links: list[float | None]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Per link: each method's time to target (or why not), the speedup, and the detail behind it."""
    times: dict[str, Any] = {}
    speedups: dict[str, float | None] = {}
    detail: dict[str, Any] = {}
    target_step = reach(reference["points"], target)["step"]
    for rate in links:
        by_method = {r["method"]: r for r in runs if r["link"]["rate_mbit"] == rate}
        times[key(rate)] = {}
        for method in METHODS:
            r = by_method.get(method)
            if r is None or r["status"] != "ok":
                times[key(rate)][method] = {"reached": False, "reason": "not run" if r is None else r["status"]}
                continue
            entry = reach(r["points"], target)
            if not entry["reached"]:
                last = r["points"][-1]
                entry["lower_bound_seconds"] = last["train_seconds"]
                entry["reason"] = (f"not reached: {r['stopped_by']}; last evaluation step {last['step']}, loss "
                                   f"{last['eval_loss']:.4f} > target {target:.4f} after {last['train_seconds']:.1f} s")
                if method == "adamw" and target_step is not None:
                    entry["projected_seconds"] = r["points"][0]["train_seconds"] + target_step * r["seconds_per_step"]
                    entry["projection"] = (f"start-up point + AdamW's step at the target on the reference run "
                                           f"({target_step:.1f}) x this run's {r['seconds_per_step']:.3f} s/step; "
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
        detail[key(rate)] = {"speedup": speedups[key(rate)], **info}
    return times, speedups, detail


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


def plot(runs: list[dict[str, Any]], links: list[float | None], target: float, times: dict[str, Any],
         title: str, path: Path) -> None:
    """Validation loss against training seconds, one panel per link, the target as a horizontal line.

    A projected AdamW time (a run stopped by the budget) is drawn dotted: the reference run's later points
    at this run's seconds per step, ending with an x at the target."""
    order = sorted(links, key=speed)
    colours = {"adamw": "tab:blue", "flexdemo": "tab:orange"}
    with harness.figure(path, len(order), (max(7.5, 6 * len(order)), 4.8), title) as panels:
        for axes, rate in zip(panels, order):
            draw_link(axes, runs, rate, target, times, colours)


def draw_link(axes: Any, runs: list[dict[str, Any]], rate: float | None, target: float, times: dict[str, Any],
              colours: dict[str, str]) -> None:
    """One panel of :func:`plot`: the runs on the link of ``rate``."""
    for r in runs:
        if r["link"]["rate_mbit"] != rate or r["status"] != "ok":
            continue
        seconds = [p["train_seconds"] for p in r["points"]]
        losses = [p["eval_loss"] for p in r["points"]]
        t = times[key(rate)][r["method"]]
        label = r["method"] + (f": target at {t['seconds']:.0f} s" if t["reached"] else ": target not reached")
        axes.plot(seconds, losses, marker="o", markersize=3, color=colours[r["method"]], label=label)
        if t["reached"]:
            axes.plot([t["seconds"]], [target], marker="*", markersize=12, color=colours[r["method"]])
        elif "projected_seconds" in t:
            start, pace, last = r["points"][0]["train_seconds"], r["seconds_per_step"], r["points"][-1]["step"]
            later = [(start + p["step"] * pace, p["eval_loss"]) for p in runs[0]["points"]
                     if last < p["step"] and p["eval_loss"] > target]
            xs, ys = zip(*[(seconds[-1], losses[-1]), *later, (t["projected_seconds"], target)])
            axes.plot(xs, ys, marker="x", markevery=[len(xs) - 1], markersize=10, linestyle=":",
                      color=colours[r["method"]],
                      label=f"{r['method']}: projected {t['projected_seconds']:.0f} s (not measured)")
    axes.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:.3f}")
    axes.set_title(f"link {link_label(rate)}", fontsize=10)
    axes.set_xlabel("training seconds (evaluations excluded)")
    axes.set_ylabel("validation loss")
    axes.set_ylim(top=min(axes.get_ylim()[1], target * 2.2))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)


def print_table(links: list[float | None], times: dict[str, Any], detail: dict[str, Any]) -> None:
    rows = []
    for rate in sorted(links, key=speed):
        cells = [link_label(rate)]
        for method in METHODS:
            t = times[key(rate)][method]
            if t["reached"]:
                cells.append(f"{t['seconds']:.1f}")
            elif "projected_seconds" in t:
                cells.append(f"> {t['lower_bound_seconds']:.0f} (projected {t['projected_seconds']:.0f})")
            else:
                cells.append("not reached")
        d = detail[key(rate)]
        if d["speedup"] is not None:
            cells.append(f"{d['speedup']:.2f}")
        elif "speedup_lower_bound" in d:
            cells.append(f">= {d['speedup_lower_bound']:.2f} (projected {d.get('speedup_projected', math.nan):.2f})")
        else:
            cells.append("-")
        rows.append(cells)
    print(harness.markdown_table(["link", "adamw s to target", "flexdemo s to target", "speedup"], rows))


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
                sys.exit(f"[time_to_target] --budget_s {args.budget_s:g} leaves {cap:.0f} s for the reference AdamW "
                         "run after the reserves for the other runs: raise it")
            if cap < 10 or (stops and target is None):
                why = "no target (the reference AdamW run failed)" if stops and target is None else "budget spent"
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
                if record["status"] != "ok" or record["global_step"] < args.convergence.max_steps:
                    why = record.get("stopped_by") or record["status"]
                    bench.write(args.out, {"error": why, "runs": runs})
                    sys.exit(f"[time_to_target] the reference AdamW run did not finish ({why}): no target; "
                             f"see {args.out}, raise --budget_s")
                target = record["final_eval_loss"] * (1 + args.margin_pct / 100)
                print(f"[time_to_target] target: {record['final_eval_loss']:.4f} x {1 + args.margin_pct / 100:g} "
                      f"= {target:.4f}", flush=True)
    reference = runs[0]
    times, speedups, detail = time_to_target(runs, target, reference, args.links)
    report = bench.write(args.out, {
        "budget_s": args.budget_s,
        "plan": [f"{m} on {link_label(r)}" + (", stop at the target" if s else ", to the end") for m, r, s in steps],
        "topology": f"{NODES} nodes x {RANKS_PER_NODE} CPU ranks, one torchrun per network namespace, gloo on a "
                    "tc tbf rate-limited veth (emulated_link.py)",
        "settings": {
            **{k: v for k, v in convergence.settings(args.convergence).items() if k != "methods"},
            "convergence_argv": args.convergence_argv, "methods": list(METHODS), "learning_rates": args.lrs,
            "links_mbit": args.links, "margin_pct": args.margin_pct, "overhead_s": args.overhead_s,
            "reserve_flexdemo_s": args.reserve_flexdemo_s, "reserve_adamw_s": args.reserve_adamw_s,
            "flexdemo": "FlexDeMoConfig defaults (no FlexDeMo flag passed)",
        },
        "target": {"adamw_final_eval_loss": reference["final_eval_loss"], "margin_pct": args.margin_pct,
                   "target_eval_loss": target, "from": f"adamw on {link_label(reference['link']['rate_mbit'])}, "
                   f"{reference['global_step']} steps"},
        "time_to_target_method": "training seconds (train_clock: evaluations excluded) where the validation loss "
                                 "first reaches the target, linearly interpolated between the two evaluations "
                                 "around the crossing; seconds_first_eval: the first evaluation at or below it",
        "speedup_to_target": speedups,
        "speedup_to_target_detail": detail,
        "time_to_target": times,
        "adamw_exchange_vs_compute": exchange_vs_compute(runs),
        "determinism_across_links": determinism(runs),
        "runs": runs,
    })
    title = (f"Time to AdamW's final validation loss + {args.margin_pct:g} %\nT5 d{args.convergence.d_model} "
             f"{args.convergence.num_layers}+{args.convergence.num_layers} layers, Multi30k en->fr, {NODES} nodes x "
             f"{RANKS_PER_NODE} CPU ranks, FlexDeMo at the package defaults")
    plot(runs, args.links, target, times, title, args.out.with_suffix(".png"))
    print_table(args.links, times, detail)
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
