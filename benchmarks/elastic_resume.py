"""Elastic resume's cost: the loss a few steps after resuming on another number of nodes, beside the straight runs.

The quick convergence preset (``convergence.py``: 2+2-layer d128 T5 on Multi30k en->fr, FlexDeMo's defaults) trains
straight on 2 nodes x 2 processes and on 1 node x 2 processes, each with a checkpoint at ``--resume_step``; then each
checkpoint resumes on the other topology (R = 2 -> 1 and 1 -> 2, ``shard_size=2``) under every ``--policies``
``resume_policy`` up to ``--max_steps``. Every run evaluates at its start (a resumed one right after loading: the
validation loss must equal the straight run's there) and every ``--eval_steps``.

    python benchmarks/elastic_resume.py                                  # ~10 min on 2 idle cores
    python benchmarks/elastic_resume.py --out /tmp/elastic.json --allow_dirty

Writes ``benchmarks/results/elastic_resume.json``: the harness header, the settings, every run's validation-loss
curve and training losses, and per resumed run the validation loss at each step after the resume against the
straight run of the old and of the new topology (``gap_pct``: positive = the resumed run is behind).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import convergence
import harness

HERE = Path(__file__).resolve().parent
TOPOLOGIES = {"2x2": 4, "1x2": 2}  # nodes x processes per node -> ranks (shard_size 2: convergence.REFERENCE_PROCS)
POLICIES = ("average", "reset")  # keep needs as many nodes before and after


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max_steps", type=convergence.positive_int, default=100)
    parser.add_argument("--resume_step", type=convergence.positive_int, default=50)
    parser.add_argument("--eval_steps", type=convergence.positive_int, default=10)
    parser.add_argument("--logging_steps", type=convergence.positive_int, default=5)
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--lr", type=float, default=convergence.DEFAULT_LRS["flexdemo"])
    parser.add_argument("--timeout_s", type=float, default=900, help="per run")
    harness.add_flexdemo_flag(parser, "FlexDeMoConfig fields (default: the package defaults)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "elastic_resume.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args(argv)
    for name in ("eval_steps", "logging_steps", "resume_step"):
        if args.max_steps % getattr(args, name) or (name != "resume_step" and args.resume_step % getattr(args, name)):
            parser.error(f"--{name} must divide --max_steps ({args.max_steps}) and --resume_step ({args.resume_step})")
    if args.resume_step >= args.max_steps:
        parser.error(f"--resume_step ({args.resume_step}) must be below --max_steps ({args.max_steps})")
    # The quick convergence preset and its data, through convergence.py's own parser.
    args.convergence = convergence.parse_args([
        "--quick", f"--max_steps={args.max_steps}", f"--eval_steps={args.eval_steps}",
        f"--logging_steps={args.logging_steps}", "--bleu_samples=0", "--warmup_steps=10"])
    args.convergence.flexdemo = args.flexdemo
    return args


def run(args: argparse.Namespace, name: str, topology: str, scratch: Path, extra: list[str]) -> dict[str, Any]:
    """One torchrun job of ``convergence_worker.py`` on ``topology``; its result, or the status and logs' tails."""
    out, log = scratch / f"{name}.json", scratch / f"{name}.log"
    worker = convergence.worker_args(args.convergence, "flexdemo", args.lr, 0, out, scratch / name) + extra
    command = harness.torchrun(worker, TOPOLOGIES[topology])
    print(f"[elastic_resume] {name} ...", flush=True)
    job = harness.run_job([command], [log], args.timeout_s, harness.worker_env(datasets_cache=scratch / "datasets"),
                          expect=out)
    result = {"status": "ok", **json.loads(out.read_text())} if job["status"] == harness.OK else dict(job)
    result["launch_seconds"] = job["launch_seconds"]
    print(f"[elastic_resume] {name}: {result['status']} in {job['launch_seconds']:.0f} s", flush=True)
    return result


def curve(result: dict[str, Any]) -> dict[int, float]:
    return {e["step"]: e["eval_loss"] for e in result.get("log_history", []) if "eval_loss" in e}


def train_losses(result: dict[str, Any]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in result.get("log_history", []) if "loss" in e}


def compare(resumed: dict[str, Any], old: dict[str, Any], new: dict[str, Any], resume_step: int) -> dict[str, Any]:
    """The resumed run's validation loss from the resume on, and its gap (%) to each straight run."""
    mine, olds, news = curve(resumed), curve(old), curve(new)
    steps = [s for s in sorted(mine) if s >= resume_step]

    def gap(reference: dict[int, float]) -> dict[int, float]:
        return {s: 100 * (mine[s] / reference[s] - 1) for s in steps if s in reference}

    return {"eval_loss": {s: mine[s] for s in steps}, "gap_pct_vs_old_topology": gap(olds),
            "gap_pct_vs_new_topology": gap(news),
            "loaded_exactly": mine.get(resume_step) == olds.get(resume_step)}


def cell(values: dict[int, float], step: int, spec: str) -> str:
    """``values[step]`` formatted, or a dash where a run failed."""
    return format(values[step], spec) if step in values else "—"


def main() -> None:
    args = parse_args()
    report_run = harness.Run.start(args.out, args.allow_dirty)
    checkpoint = f"checkpoint-{args.resume_step}"
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fdm-elastic-") as tmp:
        scratch = Path(tmp)
        for topology in TOPOLOGIES:
            runs[f"straight_{topology}"] = run(args, f"straight_{topology}", topology, scratch,
                                               [f"--save_steps={args.resume_step}"])
        pairs = {f"{old}_to_{new}_{policy}": (old, new, policy) for old, new in (("2x2", "1x2"), ("1x2", "2x2"))
                 for policy in args.policies}
        for name, (old, new, policy) in pairs.items():
            source = scratch / f"straight_{old}" / checkpoint
            runs[name] = run(args, name, new, scratch, [f"--resume_from_checkpoint={source}",
                                                        f"--resume_policy={policy}"])
    resumes = {name: compare(runs[name], runs[f"straight_{old}"], runs[f"straight_{new}"], args.resume_step)
               for name, (old, new, _) in pairs.items() if runs[name]["status"] == "ok"}
    body = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("convergence", "out", "allow_dirty")}
        | {"model": {k: getattr(args.convergence, k) for k in ("d_model", "d_ff", "num_layers", "num_heads",
                                                               "vocab_size", "batch_size", "warmup_steps")},
           "shard_size": convergence.REFERENCE_PROCS, "topologies": "2x2: 2 nodes x 2 processes; 1x2: 1 node x 2"},
        "resumes": resumes,
        "runs": {name: {"status": r["status"], "launch_seconds": r["launch_seconds"], "eval_loss": curve(r),
                        "train_loss": train_losses(r), **({} if r["status"] == "ok" else {"log_tails": r["log_tails"]})}
                 for name, r in runs.items()},
    }
    report = report_run.write(args.out, body)
    end = args.max_steps
    rows = [[name, cell(r["eval_loss"], args.resume_step, ".4f"), cell(r["eval_loss"], end, ".4f"),
             cell(r["gap_pct_vs_old_topology"], end, "+.2f"), cell(r["gap_pct_vs_new_topology"], end, "+.2f"),
             r["loaded_exactly"]] for name, r in resumes.items()]
    print(harness.markdown_table(["resume", f"eval loss @{args.resume_step}", f"@{args.max_steps}", "gap vs old %",
                                  "gap vs new %", "loaded exactly"], rows))
    print(f"[elastic_resume] wrote {args.out} in {report['duration_seconds']:.0f} s", flush=True)
    if any(r["status"] != "ok" for r in runs.values()):
        sys.exit("[elastic_resume] some runs failed: see their status and log_tails in the JSON")


if __name__ == "__main__":
    main()
