"""A node dies and comes back under an elastic launcher: two torchrun agents (2 "nodes" x 2 CPU ranks) with a c10d
rendezvous on 127.0.0.1, ``--nnodes 1:2``, training with ``FlexDeMoConfig(elastic=True)``.

1. Agents A and B train on 2 x 2 (A hosts the rendezvous store, so it must outlive B).
2. Once a checkpoint is complete, B's process group (its workers and the agent) is SIGKILLed. A's workers fail at
   their next collective; A restarts them alone, and ``train()`` resumes on 1 x 2 from the last complete checkpoint.
3. Once that attempt has written a checkpoint of its own, agent C starts: A restarts its workers to let C in, and
   the run resumes on 2 x 2 again and finishes ``max_steps``.

One launch covers both of issue 34's cases (a node lost, a node back); the run is paced (a sleep per step) so that
the test acts mid-run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch
from launch import WORKERS
from transformers import AutoModelForSeq2SeqLM

from hf_flexdemo.launch import cpu_env, elastic_torchrun_command, free_port, kill_agent, stop
from hf_flexdemo.trainer import checkpoint
from hf_flexdemo.trainer.elastic import ELASTIC_ENV, last_progress

MAX_STEPS, SAVE_STEPS = 36, 6
DEADLINE_S = 600  # each phase's; the whole run takes 2-4 minutes on 2 cores


class Cluster:
    """The agents of one elastic job, each in its own session with a log file."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.out, self.output_dir = tmp, tmp / "out", tmp / "run"
        self.out.mkdir()
        self.endpoint, self.agents = f"127.0.0.1:{free_port()}", {}

    def start(self, name: str, host: bool) -> None:
        target = [WORKERS / "elastic_launch_worker.py", "--out", self.out, "--output_dir", self.output_dir,
                  "--max_steps", MAX_STEPS, "--save_steps", SAVE_STEPS, "--pace", 0.3]
        command = elastic_torchrun_command(target, 2, nnodes="1:2", endpoint=self.endpoint, run_id="elastic-test",
                                           max_restarts=3, host=host, last_call_s=5, monitor_s=1)
        log = open(self.tmp / f"agent_{name}.log", "w")  # noqa: SIM115 (closed with the process, by the OS)
        self.agents[name] = subprocess.Popen(command, env=cpu_env(**ELASTIC_ENV), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self, name: str) -> str:
        return (self.tmp / f"agent_{name}.log").read_text()

    def wait_for(self, what: str, ready) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not ready():
            dead = {n: a.returncode for n, a in self.agents.items() if a.poll() not in (None, 0, -signal.SIGKILL)}
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- agent {n}\n{self.log(n)[-6000:]}" for n in self.agents)
                raise AssertionError(f"waiting for {what}: agents failed {dead} or timed out\n{logs}")
            time.sleep(0.5)

    def checkpoint_after(self, step: int) -> bool:
        """A complete checkpoint past ``step`` exists, and the run went two steps beyond it."""
        last = checkpoint.last_complete_checkpoint(self.output_dir)
        reached = last_progress(self.output_dir)
        return (last is not None and checkpoint.checkpoint_step(last) > step and reached is not None
                and reached >= checkpoint.checkpoint_step(last) + 2)


def _starts(out: Path) -> dict[int, list[dict]]:
    """Each attempt's records by the step it started at (every rank's, in rank order)."""
    steps = sorted({int(p.name[len("start"):].split("_")[0]) for p in out.glob("start*_rank*.pt")})
    return {s: [torch.load(p, weights_only=False) for p in sorted(out.glob(f"start{s}_rank*.pt"))] for s in steps}


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("elastic_launch"))
    try:
        cluster.start("a", host=True)
        cluster.start("b", host=False)
        cluster.wait_for("a checkpoint on 2 x 2", lambda: cluster.checkpoint_after(0))
        kill_agent(cluster.agents["b"])
        lost_at = checkpoint.checkpoint_step(checkpoint.last_complete_checkpoint(cluster.output_dir))
        cluster.wait_for("the run alone on 1 x 2 past a checkpoint of its own",
                         lambda: any(s >= lost_at for s in _starts(cluster.out)) and cluster.checkpoint_after(
                             max(s for s in _starts(cluster.out))))
        cluster.start("c", host=False)
        cluster.wait_for("the end of the run", lambda: all(cluster.agents[n].poll() is not None for n in "ac"))
        yield cluster
    finally:
        stop(list(cluster.agents.values()))


def test_the_survivor_and_the_node_that_came_back_finish_the_run(elastic_run):
    assert elastic_run.agents["b"].returncode == -signal.SIGKILL
    for name in "ac":
        assert elastic_run.agents[name].returncode == 0, elastic_run.log(name)[-6000:]
    topologies = [records[0]["topology"] for records in _starts(elastic_run.out).values()]
    assert [(t["replicate_size"], t["shard_size"]) for t in topologies] == [(2, 2), (1, 2), (2, 2)]
    finals = [torch.load(p, weights_only=False) for p in sorted(elastic_run.out.glob("final_rank*.pt"))]
    assert len(finals) == 4 and finals[0]["topology"]["replicate_size"] == 2
    # the model saved is the model trained, on every rank, and loads as a Transformers model
    saved = AutoModelForSeq2SeqLM.from_pretrained(elastic_run.output_dir)
    for name, param in saved.named_parameters():
        assert all(torch.equal(final["params"][name], param.detach()) for final in finals), name


def test_each_resume_starts_from_the_checkpoint_weights(elastic_run):
    """Every attempt after the first starts from the weights of the checkpoint it resumed (mid-round: the anchor,
    which the checkpoint's weights are), on every rank."""
    starts = _starts(elastic_run.out)
    resumed = [step for step in starts if step > 0]
    assert len(resumed) == 2
    for step in resumed:
        weights = safetensors.torch.load_file(Path(elastic_run.output_dir, f"checkpoint-{step}", "model.safetensors"))
        for record in starts[step]:
            assert all(torch.equal(record["params"][name], weights[name]) for name in record["params"]), step


def test_each_topology_change_is_logged_once_and_listed_in_the_model_card(elastic_run):
    changes = torch.load(elastic_run.out / "final_rank0.pt", weights_only=False)["changes"]
    resumed = [step for step in _starts(elastic_run.out) if step > 0]
    assert [(c.step, c.saved, c.now, c.policy) for c in changes] == [
        (resumed[0], (2, 2), (1, 2), "average"), (resumed[1], (1, 2), (2, 2), "average")]
    assert changes[0].steps_lost >= 2 and changes[1].steps_lost is not None  # B was killed 2 steps past a checkpoint
    logs = elastic_run.log("a") + elastic_run.log("c")
    assert sum("on another topology" in line for line in logs.splitlines()) == 2
    for change in changes:
        assert f"on another topology: {change.describe()}." in logs
    card = (elastic_run.output_dir / "README.md").read_text()
    assert "after 2 change(s):" in card and all(f"  - at {c.describe()}" in card for c in changes)
    record = json.loads((Path(checkpoint.last_complete_checkpoint(elastic_run.output_dir))
                         / checkpoint.TOPOLOGY_FILE).read_text())
    assert len(record["topology_changes"]) == 2


def test_an_unreachable_rendezvous_ends_the_agent_with_a_clear_message(tmp_path):
    """An endpoint no agent hosts: the agent gives up after ``store_timeout_s`` with torch's rendezvous error, naming
    the address, instead of waiting for ever."""
    port = free_port()  # nothing listens there
    command = elastic_torchrun_command([WORKERS / "elastic_launch_worker.py"], 1, nnodes="1:2",
                                       endpoint=f"127.0.0.1:{port}", run_id="unreachable", max_restarts=1, host=False,
                                       store_timeout_s=5)
    proc = subprocess.run(command, env=cpu_env(**ELASTIC_ENV), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "RendezvousConnectionError: The connection to the C10d store has failed" in proc.stderr, proc.stderr[-3000:]
    assert f"timed out after 5000ms while trying to connect to (127.0.0.1, {port})" in proc.stderr
