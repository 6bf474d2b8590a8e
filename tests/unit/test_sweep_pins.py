"""A sweep's rerun measures what its committed JSON's run keys meant, and runs only keys its grid holds.

A run key names only the knobs the run set; the rest came from the package defaults of the day, and defaults
move. ``benchmarks/sweep.py`` pins each grid's defaults of its day ("pin"). This test rebuilds, for every
committed run, the ``FlexDeMoConfig`` that key and pin give today and compares it with the configuration the run
recorded, field by field.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from hf_flexdemo import FlexDeMoConfig
from hf_flexdemo import knobs as knobs_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Fields that do not change what a run computes: the drift guard's action, and the topology and seed fields the
# runner fills in (a run's seed is a TrainingArguments flag, in its key).
NOT_COMPARED = {"on_drift", "shard_size", "seed"}


@pytest.fixture(scope="module")
def sweep():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield importlib.import_module("sweep")


def committed_runs(sweep, grid: str) -> list[tuple[dict, dict]]:
    """(grid run, committed record) for every FlexDeMo run of ``grid`` in its committed JSON."""
    path = BENCHMARKS / "results" / f"sweep_{grid}.json"
    records = json.loads(path.read_text())["runs"]
    return [(run, records[sweep.run_key(run)]) for run in sweep.GRIDS[grid]["runs"]
            if run["method"] != "adamw" and sweep.run_key(run) in records]


def grid_length(sweep, grid: str) -> int:
    """The steps a grid's runs take (its convergence preset and flags; the data files are not read)."""
    return sweep.convergence.parse_args([*sweep.GRIDS[grid]["argv"], "--train_file", "-", "--validation_file", "-"]
                                        ).max_steps


@pytest.mark.parametrize("grid", ["density", "levers", "overlap", "local", "local_long", "nodes", "nodes_outer",
                                  "nodes_leader", "nodes_owner", "nodes_weak", "nodes_weak_step_wise",
                                  "nodes_strong_step_wise", "bits", "outer_delay", "rounds_by_length", "sizes",
                                  "sizes_long"])
def test_a_rerun_builds_the_configuration_each_committed_run_recorded(sweep, grid):
    pairs = committed_runs(sweep, grid)
    assert pairs, f"no committed FlexDeMo run of grid {grid!r}"
    for run, record in pairs:
        knobs = {k: v for k, v in sweep.pinned_knobs(sweep.GRIDS[grid], run).items() if k not in sweep.RUN_FLAGS}
        max_steps = grid_length(sweep, grid)  # local_steps=None follows it
        config = FlexDeMoConfig(method=run["method"], **knobs).for_run(max_steps)
        rebuilt = dataclasses.asdict(config)
        # outer_lr's default (None) resolves on the run's nodes (2 unless it says nodes) and its replicator
        nodes = run["knobs"].get("nodes", 2)
        rebuilt["outer_lr"] = knobs_module.resolve_outer_lr(rebuilt["outer_lr"], nodes, config.replicator)
        # A record holds the outer step that ran; the records from before it hold None, which then resolved to
        # sqrt(R / 2) whatever the replicator.
        recorded = dict(record["flexdemo_config"])
        recorded["outer_lr"] = knobs_module.resolve_outer_lr(recorded.get("outer_lr"), nodes, "demo")
        # a knob the run's mode does not read changes nothing it computes (outer_lr in the step-wise mode)
        mode = "step-wise" if config.local_steps == 1 else "local"
        unread = {knob.name for knob in knobs_module.KNOBS if mode not in knob.modes}
        # replicator="full" always sent float32; its records from before value_dtype="auto" resolved to that say the
        # bfloat16 it resolved to then, which it never read
        if recorded["replicator"] == "full" and recorded["value_dtype"] == "bfloat16":
            recorded["value_dtype"] = "float32"
        differing = {field: (value, rebuilt[field]) for field, value in recorded.items()
                     if field in rebuilt and field not in NOT_COMPARED | unread and rebuilt[field] != value}
        assert not differing, f"{sweep.run_key(run)}: recorded vs rebuilt {differing}"


def test_the_pins_are_needed(sweep):
    """Without its pin, a rerun of the step-wise rule's sweep would not run the committed rule: today's default is
    local steps, which read no step-wise rule, so the run's knobs are refused."""
    run, record = next((r, rec) for r, rec in committed_runs(sweep, "density") if "momentum" not in r["knobs"])
    assert record["flexdemo_config"]["local_steps"] == 1 and "local_steps" not in run["knobs"]
    with pytest.raises(ValueError, match=r"only the step-wise mode .* reads it; set local_steps=1"):
        FlexDeMoConfig(method=run["method"], **run["knobs"])


def test_only_refuses_a_key_the_grid_does_not_hold(sweep, monkeypatch, capsys):
    """A mistyped ``--only`` key is an error that lists the grid's keys, not an invocation that runs nothing."""
    monkeypatch.setattr("sys.argv", ["sweep.py", "sizes_long", "--only", "adamw lr=0.0005 d_model=256"])
    with pytest.raises(SystemExit) as exit_:
        sweep.main()
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--only ['adamw lr=0.0005 d_model=256']: not runs of grid 'sizes_long'" in error
    assert "'adamw lr=0.0005 d_ff=1024 d_model=256 num_layers=4'" in error
