"""How far two replicas drift when one node rounds differently, and what each ``on_drift`` policy makes of it.

Issue #22 (mixed hardware): replicas are bit-identical only while every node's kernels round alike. A node of
another GPU model computes the inverse DCT (the decode of the consensus ``Q`` and the error feedback) with GEMMs
that round differently in the last bit. This emulates that on CPU: a tiny T5 (2 + 2 layers, width 32) on two
replicas (``torchrun --nproc_per_node 2``, one process per node) where rank 1's inverse DCT moves every non-zero
output one ulp up or down at random (``replica_drift_worker.py``), for each update rule and each policy:

* ``none``: no check; every 10 steps the parameters are gathered and compared (the free drift);
* ``raise``: the exact check (the default) -- the step at which it stops the run;
* ``tolerate``: the bounded check -- each check's measured drift and fraction of its bound, and its bytes (spread
  over the steps between two checks, against the exchange's bytes per step).

    python benchmarks/replica_drift.py --out /tmp/replica_drift.json --allow_dirty   # ~1-2 minutes on 2 cores

Writes the JSON (the harness's provenance header, the settings, one record per run) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", nargs="+", default=["sgd", "sign", "adamw"])
    parser.add_argument("--policies", nargs="+", default=["none", "raise", "tolerate"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--drift_check_every", type=int, default=50)
    parser.add_argument("--timeout_s", type=float, default=900)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "replica_drift.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args()
    bench = harness.Run.start(args.out, args.allow_dirty)
    with tempfile.TemporaryDirectory(prefix="fdm-replica-drift-") as scratch:
        out, log = Path(scratch) / "runs.json", Path(scratch) / "worker.log"
        worker = [HERE / "replica_drift_worker.py", "--out", out, "--updates", *args.updates, "--policies",
                  *args.policies, "--steps", args.steps, "--drift_check_every", args.drift_check_every]
        job = harness.run_job([harness.torchrun(worker, 2)], [log], args.timeout_s, harness.worker_env(), expect=out)
        runs = json.loads(out.read_text()) if job["status"] == harness.OK else []
    settings = {"model": "tiny T5 (2 + 2 layers, width 32)", "replicas": 2, "steps": args.steps,
                "drift_check_every": args.drift_check_every, "perturbation": "rank 1's inverse DCT: every non-zero "
                "output one ulp up or down at random (torch.nextafter)"}
    rows = []
    for run in runs:
        worst = run.get("worst", {})
        used = max((check["replica_drift_of_bound"] for check in run["optimizer_checks"]), default=None)
        extra = None  # the check's bytes spread over its interval, against the exchange's
        if run["optimizer_checks"]:
            extra = (run["bytes_sent_checking_step"] / run["bytes_sent_per_step"] - 1) / run["drift_check_every"]
        stopped = "-" if run["stopped_at"] is None else run["stopped_at"]
        rows.append([run["update"], run["policy"], f"{worst.get('max_abs', 0):.3g}",
                     f"{worst.get('max_over_lr', 0):.3g}", f"{worst.get('fraction_differing', 0):.3f}", stopped,
                     "-" if used is None else f"{used:.3g}", "-" if extra is None else f"{extra:+.0%}"])
    table = harness.markdown_table(["update", "policy", "max abs drift", "in lr", "fraction differing", "stopped at",
                                    "largest check / bound", "check's bytes per step"], rows)
    bench.write(args.out, {"job": job, "settings": settings, "runs": runs, "table": table})
    print(table)
    print(f"wrote {args.out} ({job['status']})")


if __name__ == "__main__":
    main()
