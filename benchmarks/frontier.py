"""The loss gap against bits: every 2,000-step run of the committed sweeps, one Pareto front per node count and model.

Reads the sweeps at the ``--horizon`` preset (``sweep.py`` grids ``bits``, ``nodes``, ``nodes_outer``, ``nodes_leader``,
``nodes_owner``, ``nodes_weak``, ``nodes_weak_step_wise``, ``nodes_strong_step_wise``, ``sizes_long``, ``lr_horizon``,
whichever are committed) and puts each FlexDeMo run at its bits per parameter per step (sent per node, from the run's
Trainer logs) and its final validation loss's gap against AdamW-HSDP on the same nodes, processes, batch scaling, model
and seed, at the best of the learning rates run for it in any of those files (the baseline a user would pick); a setting
run with several seeds is one point, the mean of its seeds' gaps. A front holds the settings no other on the same nodes,
scaling and model beats on both gap and bits. Nothing is trained: this reads results, and writes
``benchmarks/results/frontier.json`` and ``frontier.png``.

    python benchmarks/frontier.py
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import harness
from sweep import MODEL_FLAGS  # a run that sets none of them trains the quick model

HERE = Path(__file__).resolve().parent
GRIDS = ("bits", "bits_outer", "nodes", "nodes_outer", "nodes_leader", "nodes_owner", "nodes_weak",
         "nodes_weak_step_wise", "nodes_strong_step_wise", "sizes_long", "lr_horizon")
# the field's operating point (SparseLoCo in Covenant-72B, arXiv 2603.08163) and issue 32's targets, for the plot
FIELD_BITS = 0.0073
BITS_TOLERANCE = 0.01  # bits this close count as equal on a front (see fronts())
TARGET_BITS = 0.1
TARGET_GAPS = {"2 nodes, ≤ 2 %": 2.0, "8 nodes, ≤ 4 %": 4.0}


def model(run: dict[str, Any]) -> str:
    """The model a run trained: ``"quick"``, or its size flags (``"d_model=256 d_ff=1024 num_layers=4"``)."""
    return " ".join(f"{flag}={run['knobs'][flag]}" for flag in MODEL_FLAGS if flag in run["knobs"]) or "quick"


def topology(run: dict[str, Any]) -> tuple[int, int, str, str, int | None]:
    """``(nodes, processes per node, scaling, model, seed)``: what a run shares with its AdamW-HSDP reference; at the
    2 x 2 reference both scalings are one batch."""
    knobs = run["knobs"]
    nodes, procs = knobs.get("nodes", 2), knobs.get("procs_per_node", 2)
    scaling = "either" if (nodes, procs) == (2, 2) else knobs.get("scaling", "strong")
    return nodes, procs, scaling, model(run), knobs.get("seed")


def load(results: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every ok run of the committed grids, as ``(grid, key, run)`` dicts, and each file's provenance."""
    runs, sources = [], []
    for grid in GRIDS:
        path = results / f"sweep_{grid}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        commits = sorted({i.get("git_commit") for i in data.get("invocations", [])} - {None})
        sources.append({"file": path.name, "commits": commits})
        runs += [{"grid": grid, "key": key, **run} for key, run in data["runs"].items() if run["status"] == "ok"]
    return runs, sources


def bits(traffic: dict[str, Any], nodes: int) -> dict[str, float]:
    """Bits per parameter per step, sent and received per node, as the run logged them; runs from before those logs
    give them through their ratio to a bf16 ring all-reduce (``32 (R - 1) / R`` bits), which sends what it receives,
    as every collective of the exchange does."""
    if "bits_per_param_sent" in traffic:
        return {"bits_sent": traffic["bits_per_param_sent"], "bits_received": traffic["bits_per_param_received"]}
    sent = 32 * (nodes - 1) / nodes / traffic["compression_ratio_vs_dense_bf16"]
    return {"bits_sent": sent, "bits_received": sent}


def points(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per FlexDeMo setting and topology: its gap against AdamW-HSDP of the same seed at AdamW's best lr
    (kept in ``reference_lrs``), the mean over the seeds run (each seed's gap kept in ``gaps_pct``), at the bits it
    sent."""
    adamw = sorted((r for r in runs if r["method"] == "adamw"), key=lambda r: -r["final_eval_loss"])
    best = {topology(r): r for r in adamw}  # per topology the lowest final loss comes last, and stays
    runs_of: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        if r["method"] == "adamw" or topology(r) not in best:
            continue
        nodes, procs, scaling, size, seed = topology(r)
        setting = r["key"].replace(f" seed={seed}", "") if seed is not None else r["key"]
        runs_of.setdefault((nodes, procs, scaling, size, setting), []).append(r)
    out = []
    for (nodes, procs, scaling, size, setting), group in runs_of.items():
        references = [best[topology(r)] for r in group]
        gaps = [100 * (r["final_eval_loss"] / ref["final_eval_loss"] - 1) for r, ref in zip(group, references)]
        sent = [bits(r["bytes_sent"], nodes) for r in group]
        out.append({"key": setting, "grids": sorted({r["grid"] for r in group}), "nodes": nodes,
                    "procs_per_node": procs, "scaling": scaling, "model": size,
                    "seeds": [topology(r)[-1] for r in group],
                    **{k: sum(b[k] for b in sent) / len(sent) for k in ("bits_sent", "bits_received")},
                    "final_eval_loss": sum(r["final_eval_loss"] for r in group) / len(group),
                    "reference_loss": sum(ref["final_eval_loss"] for ref in references) / len(group),
                    "reference_lrs": [ref["lr"] for ref in references],
                    "gaps_pct": gaps, "gap_pct": sum(gaps) / len(gaps)})
    return sorted(out, key=lambda p: (p["model"] != "quick", p["nodes"], p["scaling"], p["bits_sent"]))


def curve(point: dict[str, Any]) -> str:
    return (f"{point['nodes']} nodes" + ("" if point["scaling"] == "either" else f", {point['scaling']} scaling")
            + ("" if point["model"] == "quick" else f", {point['model']}"))


def fronts(pts: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per curve, the keys of its runs that no run of the same curve beats on both gap and bits, by bits. Bits within
    ``BITS_TOLERANCE`` of each other count as equal: the logs give a run's mean over its logging windows, the runs from
    before them the ratio to a bf16 all-reduce of their last window, which in rounds of 8 holds one more exchange of
    the smallest fragment than its share and puts them 0.7 % lower on the quick model."""
    out: dict[str, list[str]] = {}
    for name in dict.fromkeys(curve(p) for p in pts):
        mine = [p for p in pts if curve(p) == name]
        out[name] = [p["key"] for p in mine if not any(
            o["gap_pct"] <= p["gap_pct"] and o["bits_sent"] <= p["bits_sent"] * (1 + BITS_TOLERANCE) and o is not p
            and (o["gap_pct"], o["bits_sent"]) != (p["gap_pct"], p["bits_sent"]) for o in mine)]
    return out


def table(pts: list[dict[str, Any]], front: dict[str, list[str]]) -> str:
    rows = [[curve(p), f"`{p['key']}`", len(p["seeds"]), f"{p['bits_sent']:.3g}", f"{p['final_eval_loss']:.3f}",
             f"{p['gap_pct']:+.2f} %", "yes" if p["key"] in front[curve(p)] else ""] for p in pts]
    return harness.markdown_table(["nodes", "run", "seeds", "bits/param/step sent", "final val loss (mean)",
                                   "vs AdamW-HSDP (mean of the seeds' gaps)", "front"], rows)


def plot(pts: list[dict[str, Any]], front: dict[str, list[str]], path: Path) -> None:
    with harness.figure(path, figsize=(8, 5)) as [axes]:
        for name, keys in front.items():
            mine = [p for p in pts if curve(p) == name]
            dots = axes.scatter([p["bits_sent"] for p in mine], [p["gap_pct"] for p in mine], s=14, label=name)
            on = sorted((p for p in mine if p["key"] in keys), key=lambda p: p["bits_sent"])
            axes.plot([p["bits_sent"] for p in on], [p["gap_pct"] for p in on], color=dots.get_facecolor()[0])
        for label, gap in TARGET_GAPS.items():
            axes.axhline(gap, color="grey", linestyle=":", linewidth=0.8)
            axes.annotate(f"target: {label}", (FIELD_BITS, gap), fontsize=7, va="bottom")
        axes.axvline(TARGET_BITS, color="grey", linestyle="--", linewidth=0.8)
        axes.axvline(FIELD_BITS, color="black", linestyle="--", linewidth=0.8)
        axes.annotate("the field (Covenant-72B)", (FIELD_BITS, axes.get_ylim()[1]), fontsize=7, va="top", rotation=90)
        axes.set_xscale("log")
        axes.set_xlim(left=FIELD_BITS / 1.5)
        axes.set_xlabel("bits per parameter per step, sent per node")
        axes.set_ylabel("final validation loss vs AdamW-HSDP (%)")
        axes.set_title("T5 on Multi30k, 2,000 steps: the front per node count and model (quick: 1.44 M parameters)",
                       fontsize=9)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "frontier.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    bench = harness.Run.start(args.out, args.allow_dirty)
    runs, sources = load(HERE / "results")
    pts = points(runs)
    if not pts or any(not math.isfinite(p["gap_pct"]) for p in pts):
        raise SystemExit("frontier: no finished FlexDeMo run with an AdamW-HSDP reference in the committed sweeps")
    front = fronts(pts)
    report = {"sources": sources, "points": pts, "fronts": front, "table": table(pts, front)}
    bench.write(args.out, report)
    plot(pts, front, args.out.with_suffix(".png"))
    print(report["table"])
    print(f"[frontier] wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
