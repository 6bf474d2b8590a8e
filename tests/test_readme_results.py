"""The README's result figures equal the committed JSON they quote (issue 21): a table is pasted from its JSON,
a figure is the JSON's value in the README's rounding. A rerun that changes a JSON fails here until the README
follows it, and every quoted JSON records the commit it ran at, from a clean tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()


def result(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def test_the_bytes_table_is_the_json_table():
    data = result("replicator_bytes")
    assert data["table"].strip() in README
    crossover = data["crossover"]
    assert f"`4 n / payload` = {crossover['demo_ge_dense_bf16_from_R_exact']:.2f}" in README
    assert f"R ≈ {crossover['demo_ge_dense_from_R_exact']:.1f}" in README


def test_the_quick_convergence_table_is_the_json():
    data = result("convergence_quick")
    methods, gaps = data["methods"], data["final_eval_loss_gap_vs_adamw_pct"]
    adamw_bytes = methods["adamw"]["bytes_sent"]["per_step"]
    for name in ("flexdemo", "demo"):
        run = methods[name]
        per_step = run["bytes_sent"]["per_step"]
        figures = (f"{run['final_eval_loss']:.3f}", f"{gaps[name]:+.2f} %", f"{run['bleu']:.2f}", f"{run['chrf']:.2f}",
                   f"{per_step:.4g}".replace("e+0", "e"), f"{adamw_bytes / 2 / per_step:.1f}",
                   f"{adamw_bytes / per_step:.1f}")
        for figure in figures:
            assert figure in README, (name, figure)
    assert f"{methods['adamw']['final_eval_loss']:.3f}" in README


@pytest.mark.parametrize("name", ["replicator_bytes", "convergence_quick"])
def test_quoted_results_record_a_clean_commit_taken_at_start(name):
    data = result(name)
    assert len(data["git_commit"]) == 40 and data["git_dirty"] is False
