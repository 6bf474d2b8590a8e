"""Convergence benchmark: validation loss and BLEU over training of HSDP+AdamW, DeMo and FlexDeMo on real data.

FlexDeMo runs twice: at the package defaults (``flexdemo``: local steps) and in its step-wise mode
(``step_wise``: ``preset="step-wise"``, the default before local steps); DeMo at its published rule (``demo``).

Every method trains the same new T5 (tokenizer built from the training text, same seed, same data order
with ``seed``/``data_seed``, same steps, batch and schedule) on 2 nodes x 2 processes (4 CPU ranks, one
``torchrun --nproc_per_node 4`` job per method, ``FlexDeMoConfig(method=..., shard_size=2)``), through the
T5 recipe's data, tokenizer and metric code (``convergence_worker.py``). Data: Multi30k en->fr from
``../shared/data/multi30k/`` next to the repository when present, or ``--train_file/--validation_file``.

    python benchmarks/convergence.py --quick             # 2+2-layer d128 T5, 300 steps: 8 min on 2 cores
    python benchmarks/convergence.py --long              # the same model, 1,000 steps: ~45 min on 2 cores
    python benchmarks/convergence.py --horizon           # the same model, 2,000 steps: rounds are many
    python benchmarks/convergence.py --horizon --nodes 8 --procs_per_node 1 --scaling weak  # node scaling
    python benchmarks/convergence.py --quick --lr_sweep  # 3 learning rates x 3 methods, no BLEU: ~20-25 min
    python benchmarks/convergence.py                     # 4+4-layer d256 T5, 2000 steps: ~4.5 h on 2 cores

Durations on this 2-core machine: ``--quick`` measured 470 s (about 150 s per method, a third of it
process start and data loading); the sweep is 9 such runs without BLEU; the full run is estimated
from a 20-step probe (2.4 s per step and 7.5 s per evaluation with 4 ranks on 2 cores: ~1.4 h per method).

Topology: ``--nodes R --procs_per_node S`` (default 2 x 2, one ``torchrun --nproc_per_node R*S`` job with
``shard_size=S``). The preset's ``batch_size`` is per rank at 2 x 2 (a global batch of ``4 * batch_size``); at other
topologies ``--scaling strong`` keeps that global batch (each node steps on ``1/R`` of it, as the node count grows
the hardest case for local steps) and ``--scaling weak`` keeps the batch per node (``2 * batch_size``), so the global
batch grows with R, as when a user adds nodes. AdamW-HSDP runs on the same topology and global batch.

Learning rates: ``--lrs METHOD=LR ...`` if given; else the ones ``--lr_sweep`` chose, read from
``results/convergence[_quick]_lr_sweep.json``; else the built-in ``DEFAULT_LRS`` (chosen by
``benchmarks/sweep.py density``). The JSON names the source. ``--lr_sweep`` runs the
same preset with each learning rate of ``SWEEP_LRS`` for each method (no BLEU) and keeps the one with the
lowest final validation loss.

Writes ``benchmarks/results/convergence[_quick].json`` (command, machine, versions, settings, learning
rates, per-method eval-loss curves, final BLEU/chrF, train wall time without evaluations, bytes sent
from the ``flexdemo/*`` logs, FlexDeMo's final validation-loss gap vs AdamW in %) and a ``.png`` plot.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
METHODS = ("adamw", "flexdemo", "step_wise", "demo")  # adamw first: the reference of the gap
# "flexdemo" runs the package defaults (local steps); "step_wise" the step-wise mode, the default before (FlexDeMo's
# topology, preset "step-wise"); "demo" is DeMo: its published rule and density (the demo-paper preset) on its
# topology (every rank a replica). A benchmark method -> (FlexDeMoConfig.method, preset).
METHOD_SETUPS = {"step_wise": ("flexdemo", "step-wise"), "demo": ("demo", "demo-paper")}
REFERENCE_NODES, REFERENCE_PROCS = 2, 2  # the topology a preset's per-rank batch_size is for
GAP_TARGET_PCT = 2.0  # issue #9: FlexDeMo's final validation loss within 2 % of AdamW's
BYTES_RATIO_TARGET = 8.0  # ... with at least 8x fewer inter-node bytes per step
# The learning rates benchmarks/sweep.py measured best on this data (results/sweep_density.json: 3e-3 against
# 1e-3 and 1e-2 for FlexDeMo's step-wise rule; AdamW's own sweep of the first release also chose 3e-3, which local
# steps' inner AdamW takes too: results/sweep_local.json).
DEFAULT_LRS = {method: 3e-3 for method in METHODS}  # local steps: AdamW's own (sweep_local.json)
SWEEP_LRS = {method: (1e-3, 3e-3, 1e-2) for method in METHODS}
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "d_model": 128, "d_ff": 512, "num_layers": 2, "num_heads": 4, "vocab_size": 4000, "batch_size": 16,
        "max_steps": 300, "warmup_steps": 15, "eval_steps": 50, "logging_steps": 25, "bleu_samples": 256,
        "timeout_s": 900,
    },
    "long": {  # the quick model over 1,000 steps: does the gap close or open with training length?
        "d_model": 128, "d_ff": 512, "num_layers": 2, "num_heads": 4, "vocab_size": 4000, "batch_size": 16,
        "max_steps": 1000, "warmup_steps": 50, "eval_steps": 100, "logging_steps": 50, "bleu_samples": 256,
        "timeout_s": 1800,
    },
    "horizon": {  # the quick model over 2,000 steps: at H = 8 250 rounds, at H = 30 66
        "d_model": 128, "d_ff": 512, "num_layers": 2, "num_heads": 4, "vocab_size": 4000, "batch_size": 16,
        "max_steps": 2000, "warmup_steps": 100, "eval_steps": 200, "logging_steps": 50, "bleu_samples": 256,
        "timeout_s": 4 * 3600,
    },
    "full": {
        "d_model": 256, "d_ff": 1024, "num_layers": 4, "num_heads": 4, "vocab_size": 8000, "batch_size": 32,
        "max_steps": 2000, "warmup_steps": 100, "eval_steps": 200, "logging_steps": 50, "bleu_samples": 1014,
        "timeout_s": 4 * 3600,
    },
}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def method_lr(text: str) -> tuple[str, float]:
    """``METHOD=LR`` from the command line."""
    method, _, lr = text.partition("=")
    try:
        value = float(lr)
    except ValueError:
        value = -1.0
    if method not in METHODS or not value > 0:
        raise argparse.ArgumentTypeError(f"--lrs takes METHOD=LR with METHOD in {', '.join(METHODS)} and LR > 0, "
                                         f"got {text!r}")
    return method, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    presets = parser.add_mutually_exclusive_group()
    presets.add_argument("--quick", action="store_true", help="tiny T5 and 300 steps (minutes on 2 cores)")
    presets.add_argument("--long", action="store_true", help="tiny T5 and 1,000 steps")
    presets.add_argument("--horizon", action="store_true", help="tiny T5 and 2,000 steps")
    parser.add_argument("--nodes", type=positive_int, default=REFERENCE_NODES, help="nodes R (replicas)")
    parser.add_argument("--procs_per_node", type=positive_int, default=REFERENCE_PROCS, help="processes per node S")
    parser.add_argument("--scaling", choices=("strong", "weak"), default="strong",
                        help="away from 2 x 2: keep the global batch (strong) or the batch per node (weak)")
    parser.add_argument("--lr_sweep", action="store_true", help="sweep SWEEP_LRS per method, write the choice")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--lrs", nargs="+", type=method_lr, default=[], metavar="METHOD=LR")
    parser.add_argument("--train_file", help="default: Multi30k train.en.gz (+ train.fr.gz)")
    parser.add_argument("--validation_file", help="default: Multi30k val.en.gz (+ val.fr.gz)")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="fr")
    parser.add_argument("--max_source_length", type=positive_int, default=64)
    parser.add_argument("--max_target_length", type=positive_int, default=64)
    for name in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "batch_size", "max_steps",
                 "eval_steps", "logging_steps"):
        parser.add_argument(f"--{name}", type=positive_int)
    parser.add_argument("--warmup_steps", type=int)
    parser.add_argument("--bleu_samples", type=int, help="validation pairs translated for BLEU (0: none)")
    parser.add_argument("--timeout_s", type=float, help="per method (and learning rate)")
    harness.add_flexdemo_flag(parser, "FlexDeMoConfig fields for flexdemo and demo (default: the package "
                              "defaults), e.g. --flexdemo compression_rate=0.0625 compression_chunk=8")
    parser.add_argument("--final_rounds", action="store_true", help="also the validation loss each way to end the "
                        "run leaves, from the same end state (convergence_worker.FinalRounds)")
    parser.add_argument("--adam_beta1", type=float, default=0.9, help="TrainingArguments.adam_beta1")
    parser.add_argument("--gradient_accumulation_steps", type=positive_int, default=1, help="micro-batches each rank's "
                        "batch is split into (TrainingArguments'; the batch per step stays)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data_seed", type=int, default=42)
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/convergence[_quick|_long].json")
    parser.add_argument("--sweep_file", type=Path, help="written by --lr_sweep, read otherwise; default: "
                        "benchmarks/results/convergence[_quick]_lr_sweep.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args(argv)
    args.preset = next((name for name in ("quick", "long", "horizon") if getattr(args, name)), "full")
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.train_file is None and args.validation_file is None and MULTI30K.is_dir():
        args.train_file, args.validation_file = str(MULTI30K / "train.en.gz"), str(MULTI30K / "val.en.gz")
    if not (args.train_file and args.validation_file):
        parser.error(f"no data: {MULTI30K} is absent; pass --train_file and --validation_file")
    for name in ("eval_steps", "logging_steps"):
        if args.max_steps % getattr(args, name):
            parser.error(f"--{name} must divide --max_steps ({args.max_steps}), got {getattr(args, name)}")
    if args.warmup_steps < 0 or args.bleu_samples < 0:
        parser.error("--warmup_steps and --bleu_samples must be >= 0")
    try:
        args.per_rank_batch = per_rank_batch(args.batch_size, args.nodes, args.procs_per_node, args.scaling)
    except ValueError as error:
        parser.error(str(error))
    if args.per_rank_batch % args.gradient_accumulation_steps:
        parser.error(f"--gradient_accumulation_steps {args.gradient_accumulation_steps} does not divide the "
                     f"{args.per_rank_batch} sequences per rank and step")
    stem = "convergence" if args.preset == "full" else f"convergence_{args.preset}"
    if (args.nodes, args.procs_per_node) != (REFERENCE_NODES, REFERENCE_PROCS):
        stem += f"_{args.nodes}x{args.procs_per_node}_{args.scaling}"
    args.sweep_file = args.sweep_file or HERE / "results" / f"{stem}_lr_sweep.json"
    if args.lr_sweep:
        args.out, args.bleu_samples = args.sweep_file, 0
    args.out = args.out or HERE / "results" / f"{stem}.json"
    return args


def per_rank_batch(batch_size: int, nodes: int, procs_per_node: int, scaling: str) -> int:
    """Sequences per rank and step on ``nodes x procs_per_node`` for a ``batch_size`` per rank at 2 x 2: the same
    global batch (strong scaling) or the same batch per node (weak)."""
    total = batch_size * (REFERENCE_NODES * REFERENCE_PROCS if scaling == "strong" else REFERENCE_PROCS)
    ranks = nodes * procs_per_node if scaling == "strong" else procs_per_node
    if total % ranks:
        raise ValueError(f"--scaling {scaling}: {total} sequences per {'step' if scaling == 'strong' else 'node'} do "
                         f"not split over {ranks} ranks; choose --batch_size so that they do")
    return total // ranks


def worker_args(args: argparse.Namespace, method: str, lr: float, bleu_samples: int, out: Path,
                output_dir: Path) -> list[str]:
    """``convergence_worker.py`` and its flags for one run of ``method`` at ``lr`` (no launcher: the caller's)."""
    options = {
        name: getattr(args, name) for name in (
            "train_file", "validation_file", "source_lang", "target_lang", "max_source_length", "max_target_length",
            "vocab_size", "d_model", "d_ff", "num_layers", "num_heads", "max_steps", "warmup_steps",
            "eval_steps", "logging_steps", "adam_beta1", "seed", "data_seed", "gradient_accumulation_steps",
        )
    }
    setup, preset_name = METHOD_SETUPS.get(method, (method, None))
    options |= {"method": setup, "lr": lr, "bleu_samples": bleu_samples, "shard_size": args.procs_per_node,
                "batch_size": args.per_rank_batch // args.gradient_accumulation_steps,
                "output_dir": output_dir, "out": out}
    preset = [f"--flexdemo_preset={preset_name}"] if preset_name else []
    preset += ["--final_rounds"] if args.final_rounds and method != "adamw" else []
    return [str(HERE / "convergence_worker.py"), *(f"--{k}={v}" for k, v in options.items()), *preset,
            # the user's --flexdemo flags come last: they win; the AdamW baseline refuses FlexDeMo knobs
            *(harness.flexdemo_flags(args.flexdemo) if setup != "adamw" else [])]


def run_method(args: argparse.Namespace, method: str, lr: float, bleu_samples: int, scratch: Path) -> dict[str, Any]:
    """One torchrun job; the worker's result, or the status and the log's tail when it failed."""
    tag = f"{method}-lr{lr:g}"
    out, log = scratch / f"{tag}.json", scratch / f"{tag}.log"
    # the datasets cache is shared: tokenized once, reused by the next methods
    env = harness.worker_env(datasets_cache=scratch / "datasets")
    command = harness.torchrun(worker_args(args, method, lr, bleu_samples, out, scratch / tag),
                               args.nodes * args.procs_per_node)
    print(f"[convergence] {method} lr {lr:g} ...", flush=True)
    job = harness.run_job([command], [log], args.timeout_s, env, expect=out)
    if job["status"] == harness.OK:
        result = {"status": "ok", **json.loads(out.read_text())}
    else:
        result = {**job, "method": method, "lr": lr}
    result["launch_seconds"] = job["launch_seconds"]
    print(f"[convergence] {method} lr {lr:g}: {result['status']} in {job['launch_seconds']:.0f} s", flush=True)
    return result


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The curves, final scores, wall times and traffic of one worker result."""
    if run["status"] != "ok":
        return run
    history = run["log_history"]
    curve = [{"step": e["step"], "eval_loss": e["eval_loss"]} for e in history if "eval_loss" in e]
    train_curve = [{"step": e["step"], "loss": e["loss"]} for e in history if "loss" in e]
    eval_seconds = sum(e["eval_runtime"] for e in history if "eval_runtime" in e)
    scores = run["final_scores"]
    final_loss = curve[-1]["eval_loss"] if curve else math.nan
    summary = {
        "status": "ok",
        "lr": run["lr"],
        "flexdemo_config": run["flexdemo_config"] if run["method"] != "adamw" else None,
        "topology": run["topology"],
        "training_args": run["training_args"],
        "curve": curve,
        "train_clock": run["train_clock"],
        "train_loss_curve": train_curve,
        "final_eval_loss": final_loss,
        "best_eval_loss": min((p["eval_loss"] for p in curve), default=math.nan),
        "bleu": scores.get("final_bleu"),
        "chrf": scores.get("final_chrf"),
        "gen_len": scores.get("final_gen_len"),
        "train_wall_seconds": run["train_metrics"]["train_runtime"] - eval_seconds,
        "eval_seconds_during_training": eval_seconds,
        "bleu_seconds": run["bleu_seconds"],
        "launch_seconds": run["launch_seconds"],
    }
    if run.get("final_rounds"):
        summary["final_rounds"] = run["final_rounds"]
    traffic = [e for e in history if "flexdemo/bytes_sent" in e]  # the training logs (not the final round's)
    if traffic:
        per_step = [e["flexdemo/bytes_sent"] for e in traffic]
        summary["bytes_sent"] = {
            "source": "flexdemo/* Trainer logs, all ranks" + (
                " (demo: every rank is a replica, so this counts its 3 peers, one of them on the same node)"
                if run["method"] == "demo" else " (inter-node)"),
            "total": [e for e in history if "flexdemo/total_bytes_sent" in e][-1]["flexdemo/total_bytes_sent"],
            "per_step": sum(per_step) / len(per_step),
            # the last logging window's ratios (the bits below are the mean of every window's); logs before the
            # bf16 headline had compression_ratio only, against fp32
            "compression_ratio_vs_dense_fp32": traffic[-1].get("flexdemo/compression_ratio_fp32",
                                                               traffic[-1].get("flexdemo/compression_ratio")),
            "compression_ratio_vs_dense_bf16": (traffic[-1].get("flexdemo/compression_ratio")
                                                if "flexdemo/compression_ratio_fp32" in traffic[-1] else None),
        }
        for direction in ("sent", "received"):  # a node's bits per parameter per step (logs since the estimate)
            name = f"flexdemo/bits_per_param_{direction}"
            bits = [e[name] for e in traffic if name in e]
            summary["bytes_sent"][f"bits_per_param_{direction}"] = sum(bits) / len(bits) if bits else None
    else:
        dense = run["dense_allreduce_bytes_per_step"]
        summary["bytes_sent"] = {
            "source": "estimate: ring all-reduce of each rank's fp32 gradient shard across nodes (no flexdemo logs)",
            "total": dense * run["global_step"],
            "per_step": dense,
        }
    return summary


def learning_rates(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, str]]:
    """The learning rate of each method and where it comes from: command line, sweep file, or default."""
    swept: dict[str, float] = {}
    swept_by = ""
    if args.sweep_file.exists():
        sweep = json.loads(args.sweep_file.read_text())
        swept = sweep["chosen_lrs"]
        name = args.sweep_file.resolve()
        name = name.relative_to(REPO) if name.is_relative_to(REPO) else name
        swept_by = f"--lr_sweep: {name} ({sweep['command']!r}, {sweep['started_at']})"
        differ = {k: v for k, v in sweep["settings"].items()
                  if k not in ("methods", "bleu_samples") and settings(args).get(k) != v}
        if differ:
            swept_by += f"; swept with other settings: {differ}"
    default = ("built-in DEFAULT_LRS (benchmarks/sweep.py local: results/sweep_local.json for local steps; "
               "sweep.py density: results/sweep_density.json for the step-wise rules)")
    lrs, sources = {}, {}
    for method in args.methods:
        for source, table in (("command line (--lrs)", dict(args.lrs)), (swept_by, swept), (default, DEFAULT_LRS)):
            if method in table:
                lrs[method], sources[method] = table[method], source
                break
    return lrs, sources


def settings(args: argparse.Namespace) -> dict[str, Any]:
    skipped = ("quick", "long", "horizon", "lr_sweep", "lrs", "out", "sweep_file", "timeout_s", "allow_dirty")
    return {k: v for k, v in vars(args).items() if k not in skipped} | {
        "nproc": args.nodes * args.procs_per_node, "shard_size": args.procs_per_node,
        "global_batch": args.per_rank_batch * args.nodes * args.procs_per_node}


def header(args: argparse.Namespace) -> dict[str, Any]:
    """This benchmark's keys after the harness header: preset, topology, settings."""
    return {
        "preset": args.preset,
        "topology": f"{args.nodes} nodes x {args.procs_per_node} processes (one torchrun, "
                    f"shard_size={args.procs_per_node}), {args.scaling} scaling",
        "settings": settings(args),
    }


def sweep(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Every method at every learning rate of SWEEP_LRS; the lowest final validation loss wins."""
    runs = {m: {f"{lr:g}": summarize(run_method(args, m, lr, 0, scratch)) for lr in SWEEP_LRS[m]}
            for m in args.methods}
    chosen, notes = {}, {}
    for method, by_lr in runs.items():
        finite = {lr: r["final_eval_loss"] for lr, r in by_lr.items()
                  if r["status"] == "ok" and math.isfinite(r["final_eval_loss"])}
        if not finite:
            continue
        best = min(finite, key=finite.get)
        chosen[method] = float(best)
        grid = [f"{lr:g}" for lr in SWEEP_LRS[method]]
        if best in (grid[0], grid[-1]):
            notes[method] = "best learning rate at the edge of the grid"
    return {"sweep_lrs": SWEEP_LRS, "criterion": "lowest final validation loss", "chosen_lrs": chosen,
            "notes": notes, "runs": runs}


def compare(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Every method at its learning rate, with BLEU at the end; the gap of each to AdamW."""
    lrs, source = learning_rates(args)
    methods = {m: summarize(run_method(args, m, lrs[m], args.bleu_samples, scratch)) for m in args.methods}
    reference = methods.get("adamw", {}).get("final_eval_loss")
    gaps = {m: 100 * (r["final_eval_loss"] - reference) / reference
            for m, r in methods.items() if m != "adamw" and r["status"] == "ok" and reference}
    ok = {m: r for m, r in methods.items() if r["status"] == "ok"}
    ratio = (ok["adamw"]["bytes_sent"]["per_step"] / ok["flexdemo"]["bytes_sent"]["per_step"]
             if {"adamw", "flexdemo"} <= ok.keys() else None)
    return {
        "learning_rates": lrs,
        "lr_source": source,
        "methods": methods,
        "final_eval_loss_gap_vs_adamw_pct": gaps,
        "gap_target_pct": GAP_TARGET_PCT,
        "flexdemo_within_target": gaps["flexdemo"] <= GAP_TARGET_PCT if "flexdemo" in gaps else None,
        "adamw_bytes_per_flexdemo_byte": ratio,
        "bytes_ratio_target": BYTES_RATIO_TARGET,
    }


def plot(methods: dict[str, dict[str, Any]], title: str, path: Path, gaps: dict[str, float] | None = None) -> None:
    """Validation loss against step, one line per method (or method and learning rate)."""
    with harness.figure(path) as [axes]:
        for label, run in methods.items():
            if run["status"] != "ok":
                continue
            bleu = "" if run.get("bleu") is None else f", BLEU {run['bleu']:.1f}"
            gap = f", {gaps[label]:+.1f}% vs adamw" if gaps and label in gaps else ""
            steps, losses = zip(*((p["step"], p["eval_loss"]) for p in run["curve"]), strict=True)
            axes.plot(steps, losses, marker="o", markersize=3, label=f"{label} (lr {run['lr']:g}{bleu}{gap})")
        axes.set_xlabel("optimizer step")
        axes.set_ylabel("validation loss")
        axes.set_title(title, fontsize=10)
        axes.grid(True, alpha=0.3)
        axes.legend()


def print_table(report: dict[str, Any]) -> None:
    """The comparison as a Markdown table on stdout."""
    columns = ["method", "lr", "final val loss", "best val loss", "gap vs adamw", "BLEU", "chrF",
               "train s (no eval)", "bytes sent/step", "bytes sent total"]
    rows = []
    for method, r in report["methods"].items():
        if r["status"] != "ok":
            rows.append([method, f"{r['lr']:g}", r["status"]])
            continue
        gap = report["final_eval_loss_gap_vs_adamw_pct"].get(method)
        traffic = r["bytes_sent"]
        estimate = " (est.)" if traffic["source"].startswith("estimate") else ""
        rows.append([method, f"{r['lr']:g}", f"{r['final_eval_loss']:.4f}", f"{r['best_eval_loss']:.4f}",
                     "-" if gap is None else f"{gap:+.2f}%", "-" if r["bleu"] is None else f"{r['bleu']:.2f}",
                     "-" if r["chrf"] is None else f"{r['chrf']:.2f}", f"{r['train_wall_seconds']:.0f}",
                     f"{traffic['per_step']:.4g}{estimate}", f"{traffic['total']:.4g}{estimate}"])
    print(harness.markdown_table(columns, rows))


def main() -> None:
    args = parse_args()
    run = harness.Run.start(args.out, args.allow_dirty)
    with tempfile.TemporaryDirectory(prefix="fdm-convergence-") as scratch:
        body = sweep(args, Path(scratch)) if args.lr_sweep else compare(args, Path(scratch))
    report = run.write(args.out, header(args) | body)
    topology = f"{args.nodes} nodes x {args.procs_per_node} CPU ranks"
    if args.lr_sweep:
        curves = {f"{m} lr {lr}": r for m, by_lr in body["runs"].items() for lr, r in by_lr.items()}
        plot(curves, f"Learning-rate sweep ({args.preset}, {topology})", args.out.with_suffix(".png"))
        print(f"[convergence] chosen learning rates: {body['chosen_lrs']} {body['notes'] or ''}")
    else:
        plot(body["methods"], f"Validation loss, T5 d{args.d_model} x{args.num_layers} on {args.source_lang}->"
             f"{args.target_lang} ({topology})", args.out.with_suffix(".png"), body["final_eval_loss_gap_vs_adamw_pct"])
        print_table(report)
        for method, source in body["lr_source"].items():
            print(f"[convergence] {method} learning rate from {source}")
    print(f"[convergence] wrote {args.out} and {args.out.with_suffix('.png')} "
          f"in {report['duration_seconds']:.0f} s", flush=True)
    runs = body["runs"].values() if args.lr_sweep else [body["methods"]]
    if any(r["status"] != "ok" for by_key in runs for r in by_key.values()):
        sys.exit("[convergence] some runs failed: see their status and log_tails in the JSON")


if __name__ == "__main__":
    main()
