"""A node that dies and comes back under the elastic launcher: what it costs in loss, wall clock and steps.

The quick convergence preset (``convergence.py --quick``: the 2+2-layer d128 T5 on Multi30k en->fr, FlexDeMo's
defaults, 300 steps) on 2 nodes x 2 processes, launched as two elastic torchrun agents (``--nnodes 1:2``, a c10d
rendezvous on 127.0.0.1, ``FlexDeMoConfig(elastic=True)``, a checkpoint every ``--save_steps``):

* ``straight``: no fault; ``no_checkpoints``: the same without checkpoints, for what checkpointing costs;
  ``sync_save``: the same with each rank's optimizer state written before the next step (``async_save=False``);
* ``faults``: once the run has finished step ``--kill_at``, node B's workers and agent are SIGKILLed; the survivor
  restarts alone and resumes from the last complete checkpoint on 1 node. Once that run has finished step
  ``--rejoin_at``, a new agent starts and joins at the survivor's next restart: the run resumes on 2 nodes and
  finishes.

A watcher reads the run's progress file (``hf_flexdemo.trainer.elastic.PROGRESS_FILE``, rewritten after every
step with the main process's id) every 50 ms. A restart shows as a new process id: its downtime is the wall time
from the last step before it to the first step after, its steps lost those done past the checkpoint resumed, and
its cost the downtime plus the time to redo them at the median step (the downtime includes the resumed run's
evaluation at its start, ``eval_on_start`` as every convergence run). A checkpoint's stall is the wall time of the
``STALL_WINDOW`` steps from one on, less as many median steps (a write in the background slows the steps beside it).

    python benchmarks/elastic_restart.py                                  # ~10 min on 2 idle cores
    python benchmarks/elastic_restart.py --out /tmp/restart.json --allow_dirty

Writes ``benchmarks/results/elastic_restart.json``: the harness header, the settings, per run the validation-loss
curve, the training wall clock, the step timeline's summary, and for the faulty run each restart and the topology
changes the trainer recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import convergence
import elastic_resume
import harness

from hf_flexdemo.launch import elastic_torchrun_command, free_port, kill_agent, stop
from hf_flexdemo.trainer import checkpoint
from hf_flexdemo.trainer.elastic import ELASTIC_ENV, read_progress

HERE = Path(__file__).resolve().parent
PROCS = convergence.REFERENCE_PROCS  # processes per node
STALL_WINDOW = 5  # steps after a checkpoint counted in its stall


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max_steps", type=convergence.positive_int, default=300)
    parser.add_argument("--kill_at", type=convergence.positive_int, default=150)
    parser.add_argument("--rejoin_at", type=convergence.positive_int, default=200)
    parser.add_argument("--save_steps", type=convergence.positive_int, default=40)
    parser.add_argument("--eval_steps", type=convergence.positive_int, default=50)
    parser.add_argument("--lr", type=float, default=convergence.DEFAULT_LRS["flexdemo"])
    parser.add_argument("--timeout_s", type=float, default=1200, help="per run")
    harness.add_flexdemo_flag(parser, "FlexDeMoConfig fields (default: the package defaults)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "elastic_restart.json")
    harness.add_provenance_flags(parser)
    args = parser.parse_args(argv)
    if not args.kill_at < args.rejoin_at < args.max_steps:
        parser.error(f"need --kill_at < --rejoin_at < --max_steps; got {args.kill_at}, {args.rejoin_at}, "
                     f"{args.max_steps}")
    args.convergence = convergence.parse_args(["--quick", f"--max_steps={args.max_steps}", "--bleu_samples=0",
                                               f"--eval_steps={args.eval_steps}", f"--logging_steps={args.eval_steps}"])
    args.convergence.flexdemo = [*args.flexdemo, "elastic=True"]
    return args


class Watcher(threading.Thread):
    """Every step the run reports, with the wall time it was seen: ``(seconds since start, global step, pid)``."""

    def __init__(self, output_dir: Path) -> None:
        super().__init__(daemon=True)
        self.output_dir, self.start_time, self.steps = output_dir, time.monotonic(), []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            record = read_progress(self.output_dir)
            seen = None if record is None else (record["global_step"], record["pid"])
            if seen is not None and (not self.steps or self.steps[-1][1:] != seen):
                self.steps.append((time.monotonic() - self.start_time, *seen))

    def reached(self, step: int, restarts: int = 0) -> bool:
        """The run finished ``step`` after at least ``restarts`` restarts."""
        pids = {pid for _, _, pid in self.steps}
        return bool(self.steps) and self.steps[-1][1] >= step and len(pids) > restarts


def summarize(steps: list[tuple[float, int, int]], save_steps: int | None, eval_steps: int) -> dict[str, Any]:
    """The restarts in a step timeline, the median step and a checkpoint's stall (see the module docstring)."""
    pairs = list(zip(steps, steps[1:]))
    same = [(a, b) for a, b in pairs if a[2] == b[2] and b[1] == a[1] + 1]  # consecutive steps of one attempt
    median = statistics.median(b[0] - a[0] for a, b in same if a[1] % eval_steps and (not save_steps
                                                                                     or a[1] % save_steps))
    restarts = []
    for (t0, before, _), (t1, after, _) in ((a, b) for a, b in pairs if a[2] != b[2]):
        lost = before - (after - 1)
        restarts.append({"last_step_before": before, "resumed_from": after - 1, "steps_lost": lost,
                         "downtime_s": t1 - t0, "cost_s": t1 - t0 + lost * median})
    # a checkpoint's stall: the STALL_WINDOW intervals from it on, less as many median steps (a background write
    # shares the cores with the steps after the checkpoint, not only the first); a window with an evaluation is left out
    took = {a[1]: b[0] - a[0] for a, b in same}  # by the step an interval starts from
    windows = [[took.get(saved + i) for i in range(STALL_WINDOW)] for saved in took
               if save_steps and saved % save_steps == 0 and all((saved + i) % eval_steps for i in range(STALL_WINDOW))]
    stalls = [sum(window) - STALL_WINDOW * median for window in windows if None not in window]
    return {"median_step_s": median, "restarts": restarts,
            "checkpoint_stall_s": statistics.mean(stalls) if stalls else None, "checkpoints_timed": len(stalls)}


def agent(args: argparse.Namespace, scratch: Path, name: str, run_id: str, endpoint: str, host: bool,
          worker: list[str]) -> subprocess.Popen:
    command = elastic_torchrun_command(worker, PROCS, nnodes="1:2", endpoint=endpoint, run_id=run_id, max_restarts=3,
                                      host=host, last_call_s=5, monitor_s=1)
    env = harness.worker_env(datasets_cache=scratch / "datasets") | ELASTIC_ENV
    log = open(scratch / f"{run_id}_{name}.log", "w")  # noqa: SIM115 (closed with the process, by the OS)
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def run(args: argparse.Namespace, scratch: Path, name: str, save_steps: int | None, faults: bool,
        knobs: tuple[str, ...] = ()) -> dict[str, Any]:
    """One elastic job of two agents, with FlexDeMoConfig ``knobs`` beside ``--flexdemo``'s; with ``faults``, B dies
    at ``--kill_at`` and C joins at ``--rejoin_at``."""
    out, output_dir = scratch / f"{name}.json", scratch / name
    options = argparse.Namespace(**{**vars(args.convergence), "flexdemo": [*args.convergence.flexdemo, *knobs]})
    worker = convergence.worker_args(options, "flexdemo", args.lr, 0, out, output_dir)
    worker += [f"--save_steps={save_steps}"] if save_steps else []
    endpoint, agents, events = f"127.0.0.1:{free_port()}", {}, {}
    watcher = Watcher(output_dir)
    print(f"[elastic_restart] {name} ...", flush=True)
    watcher.start()
    agents["a"] = agent(args, scratch, "a", name, endpoint, True, worker)
    agents["b"] = agent(args, scratch, "b", name, endpoint, False, worker)
    deadline = time.monotonic() + args.timeout_s

    def wait(ready) -> bool:
        """Until ``ready()``, the deadline, or an agent that was not killed exits."""
        while not ready() and time.monotonic() < deadline and all(
                a.poll() is None for n, a in agents.items() if n not in events.get("killed", ())):
            time.sleep(0.05)
        return ready()

    try:
        if faults and wait(lambda: watcher.reached(args.kill_at)):
            kill_agent(agents["b"])
            events |= {"killed": ["b"], "killed_after_step": watcher.steps[-1][1]}
            # the survivor's own run: it restarted and went on to --rejoin_at
            if wait(lambda: watcher.reached(args.rejoin_at, restarts=1)):
                agents["c"] = agent(args, scratch, "c", name, endpoint, False, worker)
                events["joined_after_step"] = watcher.steps[-1][1]
        alive = [a for n, a in agents.items() if n not in events.get("killed", ())]
        while any(a.poll() is None for a in alive) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop(list(agents.values()))
        watcher.done.set()
        watcher.join()
    codes = {n: a.returncode for n, a in agents.items()}
    ok = out.exists() and all(c == 0 for n, c in codes.items() if n not in events.get("killed", ()))
    result: dict[str, Any] = {"status": "ok" if ok else "failed", "returncodes": codes, "events": events}
    if not ok:
        result["log_tails"] = {n: (scratch / f"{name}_{n}.log").read_text()[-6000:] for n in agents}
        print(f"[elastic_restart] {name}: failed {codes}", flush=True)
        return result
    worker_result = json.loads(out.read_text())
    last = checkpoint.last_complete_checkpoint(output_dir)
    record = checkpoint.read_topology(last) if last else None
    result |= {
        "eval_loss": elastic_resume.curve(worker_result),
        "train_seconds": watcher.steps[-1][0] - watcher.steps[0][0],  # first step seen to the last
        "timeline": summarize(watcher.steps, save_steps, args.eval_steps),
        "topology_changes": (record or {}).get("topology_changes", []),
    }
    print(f"[elastic_restart] {name}: ok, {len(result['timeline']['restarts'])} restart(s)", flush=True)
    return result


def main() -> None:
    args = parse_args()
    bench = harness.Run.start(args.out, args.allow_dirty)
    with tempfile.TemporaryDirectory(prefix="fdm-restart-") as tmp:
        scratch = Path(tmp)
        runs = {"no_checkpoints": run(args, scratch, "no_checkpoints", None, faults=False),
                "straight": run(args, scratch, "straight", args.save_steps, faults=False),
                "sync_save": run(args, scratch, "sync_save", args.save_steps, faults=False,
                                 knobs=("async_save=False",)),
                "faults": run(args, scratch, "faults", args.save_steps, faults=True)}
    body: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("convergence", "out", "allow_dirty")}
        | {"topology": f"2 nodes x {PROCS} processes, each node one elastic torchrun agent"},
        "runs": runs,
    }
    if all(r["status"] == "ok" for r in runs.values()):
        end, straight, faults = args.max_steps, runs["straight"], runs["faults"]
        body["summary"] = {
            "final_eval_loss": {name: r["eval_loss"][end] for name, r in runs.items()},
            "faults_gap_pct_vs_straight": 100 * (faults["eval_loss"][end] / straight["eval_loss"][end] - 1),
            "checkpoint_overhead_pct": 100 * (straight["train_seconds"] / runs["no_checkpoints"]["train_seconds"]
                                              - 1),
            "wall_clock_cost_s": faults["train_seconds"] - straight["train_seconds"],
            "checkpoint_stall_s": {name: runs[name]["timeline"]["checkpoint_stall_s"]
                                   for name in ("straight", "sync_save")},
        }
    report = bench.write(args.out, body)
    if "summary" in body:
        rows = [[r["last_step_before"], r["resumed_from"], r["steps_lost"], f"{r['downtime_s']:.1f}",
                 f"{r['cost_s']:.1f}"] for r in runs["faults"]["timeline"]["restarts"]]
        print(harness.markdown_table(["last step", "resumed from", "steps lost", "downtime s", "cost s"], rows))
        print(json.dumps(body["summary"], indent=1))
    print(f"[elastic_restart] wrote {args.out} in {report['duration_seconds']:.0f} s", flush=True)
    if "summary" not in body:
        sys.exit("[elastic_restart] some runs failed: see their status and log_tails in the JSON")


if __name__ == "__main__":
    main()
