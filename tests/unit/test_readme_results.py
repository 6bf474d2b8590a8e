"""The result figures of docs/results.md (and the README's headline table) equal the committed JSON they quote
(issue 21): a table is pasted from its JSON, a figure is the JSON's value in the page's rounding. A rerun that
changes a JSON fails here until the page follows it, and every JSON in benchmarks/results records the commit it
ran at, from a clean tree."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = (ROOT / "docs" / "results.md").read_text()  # every result
README = (ROOT / "README.md").read_text()  # a headline table
PROSE = " ".join(PAGE.split())  # the text with its line breaks as spaces


def result(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["replicator_bytes", "replicator_bytes_step_wise"])
def test_the_bytes_crossovers_are_the_json(name):
    """The defaults' table is pasted; both crossovers (bf16, fp32) of the defaults and of the step-wise mode."""
    data = result(name)
    if name == "replicator_bytes":
        assert data["table"].strip() in PAGE
    crossover, steps = data["crossover"], data["settings"]["local_steps"]
    assert f"`4 n H / payload` = {crossover['demo_ge_dense_bf16_from_R_exact']:.2f} with H = {steps}" in PAGE
    assert f"R ≈ {crossover['demo_ge_dense_from_R_exact']:.1f}" in PAGE


@pytest.mark.parametrize("name", ["convergence_quick", "convergence_long"])
def test_the_convergence_tables_are_the_json(name):
    data = result(name)
    methods, gaps = data["methods"], data["final_eval_loss_gap_vs_adamw_pct"]
    adamw_bytes = methods["adamw"]["bytes_sent"]["per_step"]
    for name in ("flexdemo", "step_wise", "demo"):
        run = methods[name]
        per_step = run["bytes_sent"]["per_step"]
        figures = (f"{run['final_eval_loss']:.3f}", f"{gaps[name]:+.2f} %", f"{run['bleu']:.2f}", f"{run['chrf']:.2f}",
                   f"{per_step:.4g}".replace("e+0", "e"), f"{adamw_bytes / 2 / per_step:.1f}",
                   f"{adamw_bytes / per_step:.1f}")
        for figure in figures:
            assert figure in PAGE, (name, figure)
    assert f"{methods['adamw']['final_eval_loss']:.3f}" in PAGE


@pytest.mark.parametrize("name", ["sweep_density", "sweep_levers"])
def test_the_step_wise_sweep_tables_are_the_json(name):
    """Every run of the two sweeps that chose the step-wise rule is one row: final loss, gap, bytes per step and
    the ratio to a bf16 all-reduce."""
    data = result(name)
    bf16 = data["runs"]["adamw lr=0.003"]["bytes_sent"]["per_step"] / 2
    lines = PAGE.splitlines()
    for row in data["rows"]:
        assert row["status"] == "ok", row["key"]
        gap = "–" if row["gap_pct"] is None else f"{row['gap_pct']:+.2f} %"
        cells = (f"| {row['final_eval_loss']:.3f} | {gap} | {row['bytes_per_step']:.4g} | "
                 f"{bf16 / row['bytes_per_step']:.1f} |").replace("e+0", "e")
        assert sum(line.endswith(cells) for line in lines) == 1, row["key"]


def test_the_fragments_bandwidth_figures_are_the_json():
    """Streaming by fragments against the whole model at once, one run each (10 rounds), as the page quotes."""
    ratios = {fragments: {int(row["link_mbit"]): row["step_over_compute_only"]
                          for row in result(f"bandwidth_fragments_{fragments}")["rows"] if row["method"] == "flexdemo"}
              for fragments in (1, 2, 4)}
    assert f"At 10 Mbit/s F = 1 is {ratios[1][10]:.2f} × compute-only" in PAGE
    assert f"F = 2 {ratios[2][10]:.2f} × and **F = 4 {ratios[4][10]:.2f} ×, within the 1.15 ×**" in PAGE
    assert ratios[4][10] <= 1.15
    assert f"Mbit/s {ratios[1][100]:.2f} ×, {ratios[2][100]:.2f} × and {ratios[4][100]:.2f} ×" in PAGE
    knob_row = (f"with F = 4, {ratios[4][10]:.2f} × the compute-only step at 10 Mbit/s against F = 1's "
                f"{ratios[1][10]:.2f} ×")
    assert knob_row in PAGE


def test_the_fragments_step_figures_are_the_json():
    """The run from before fragments were the default (its ``flexdemo`` is one round), and today's: the defaults
    (fragments) against the whole model in one round, step by step."""
    methods = result("optimizer_step_fragments")["methods"]
    adamw, one_round, fragments = (methods[name] for name in ("adamw", "flexdemo", "flexdemo_fragments"))
    assert (f"gave the\ndefaults of the day {one_round['mean_s'] / adamw['mean_s']:.2f} × AdamW's mean step and the "
            f"fragments {fragments['mean_s'] / adamw['mean_s']:.2f} ×, with a step-to-step IQR of "
            f"{fragments['iqr_s']:.3f} s\nagainst {one_round['iqr_s']:.3f} s (slowest step "
            f"{max(fragments['step_seconds']):.2f} s against {max(one_round['step_seconds']):.2f} s)") in PAGE
    data = result("optimizer_step")
    methods, steps = data["methods"], data["settings"]["flexdemo_local_steps"]
    defaults, one_round = methods["flexdemo"]["step_seconds"], methods["flexdemo_one_round"]["step_seconds"]
    # timed from a round's start: the step the previous round lands in, inner steps, the step that sends
    inner = [s for i, s in enumerate(one_round) if i % steps not in (0, steps - 1)]
    sends, lands = one_round[steps - 1::steps], one_round[0::steps]
    spread = f"{min(defaults):.2f}–{max(defaults):.2f} s (IQR {methods['flexdemo']['iqr_s']:.3f} s)"
    assert f"defaults' steps take {spread}" in PROSE
    assert f"takes {min(inner):.2f}–{max(inner):.2f} s for each inner step" in PROSE
    assert f"{min(sends):.2f}–{max(sends):.2f} s for the step that compresses and sends and " \
           f"{min(lands):.2f}–{max(lands):.2f} s for the one the exchange lands in" in PROSE


def test_the_overlap_table_is_the_json():
    data = result("sweep_overlap")
    adamw = data["runs"]["adamw lr=0.003"]["curve"][-1]["eval_loss"]
    assert f"| FlexDeMo (step-wise) | final val loss | vs AdamW ({adamw:.3f}) |" in PAGE
    for key, overlap, lr in (("flexdemo lr=0.003 overlap=none", "none", "3e-3"),
                             ("flexdemo lr=0.003 overlap=delayed", "delayed", "3e-3"),
                             ("flexdemo lr=0.001 overlap=delayed", "delayed", "1e-3")):
        loss = data["runs"][key]["curve"][-1]["eval_loss"]
        row = f"| {loss:.3f} | {_percent(loss, adamw):+.2f} % |"
        assert any(line.startswith(f"| `overlap=\"{overlap}\"`") and f"lr {lr} |" in line and line.endswith(row)
                   for line in PAGE.splitlines()), key


def test_the_optimizer_step_table_is_the_json():
    data = result("optimizer_step")
    methods, adamw = data["methods"], data["methods"]["adamw"]["mean_s"]
    for name, method in methods.items():
        cells = f"| {method['median_s']:.3f} | {method['mean_s']:.3f} | "
        assert cells in PAGE, name
        assert f"{method['mean_s'] / adamw:.2f}" in PAGE, name
    ratio = data["ratios"]["flexdemo/adamw (mean)"]
    assert f"**{ratio:.2f}: {'met' if ratio <= 1.5 else 'missed'}**" in PAGE
    repeat = result("optimizer_step_repeat")["ratios"]  # the same command again, right after
    assert (f"({repeat['flexdemo/adamw (mean)']:.2f} in the run after it; "
            f"{data['ratios']['flexdemo/adamw_foreach (mean)']:.2f} × its foreach implementation's step, "
            f"{repeat['flexdemo/adamw_foreach (mean)']:.2f} in the second run;") in PROSE


@pytest.mark.parametrize("name", ["bandwidth_quick", "bandwidth_budget_overlap"])
def test_the_bandwidth_figures_are_the_json(name):
    """Every row of the quick run is in the table (step, its ratio to compute-only, link and reported bytes); the
    budget-with-overlap run's 10 Mbit/s ratios in the text."""
    data = result(name)
    for row in data["rows"]:
        if name == "bandwidth_quick":
            cells = (f"| {row['step_seconds']:.3f} ({row['step_statistic']}) | {row['step_over_compute_only']:.2f} |",
                     f"| {row['link_bytes_per_step']:.4g} | {row['reported_bytes_per_step']:.4g} |")
            assert all(c in PAGE for c in cells), (row["link_mbit"], row["method"])
        elif row["link_mbit"] == 10 and row["method"].startswith("flexdemo"):
            assert f"{row['step_over_compute_only']:.2f} ×" in PAGE, row["method"]
    best = {t["link_mbit"]: t["variants"]["flexdemo"]["value"] for t in data["targets"].values()
            if "flexdemo" in t["variants"]}
    for link, value in best.items():
        assert f"{value:.2f}: {'met' if value <= {10.0: 1.15, 100.0: 1.05}[link] else 'missed'}" in PAGE, link


def test_the_later_landing_probes_are_the_json():
    slow = {delay: next(r for r in result(f"bandwidth_outer_delay_{delay}")["rows"]
                        if r["link_mbit"] == 10 and r["method"] == "flexdemo") for delay in (2, 3)}
    assert f"τ = 2 is {slow[2]['step_over_compute_only']:.2f} × at 10 Mbit/s" in PAGE
    assert f"waiting, {slow[2]['exchange_wait_over_step']:.2f} of the" in PAGE
    assert f"τ = 3 {slow[3]['step_over_compute_only']:.2f} × with nothing waited" in PAGE
    assert slow[3]["exchange_wait_over_step"] < 0.01


def test_the_time_to_target_figures_are_the_json():
    data = result("time_to_target_quick")
    assert f"the target at **{data['compute_only']['seconds']:.1f} s**" in PAGE
    for link, ratios in data["vs_compute_only"].items():
        flexdemo, adamw = data["time_to_target"][link]["flexdemo"], data["time_to_target"][link]["adamw"]
        cells = f"| {flexdemo['seconds']:.1f} (step {flexdemo['step']:.0f}) | **{ratios['flexdemo']:.2f}** |"
        assert cells in PAGE, link
        if adamw["reached"]:
            assert f"| {adamw['seconds']:.1f} (step {adamw['step']:.0f}) | {ratios['adamw']:.2f} |" in PAGE, link
        else:
            assert f"≥ {ratios['adamw_lower_bound']:.2f} (projected {ratios['adamw_projected']:.2f})" in PAGE, link
    assert f"**{data['speedup_to_target']['25']:.2f}** |" in PAGE
    assert f"{data['speedup_to_target']['25']:.2f} × sooner than AdamW-HSDP" in PAGE
    assert not any(t[m]["at_boundary"] for t in data["time_to_target"].values() for m in ("adamw", "flexdemo"))


def test_the_local_steps_table_is_the_json():
    """Every local-steps run of sweep_local.json has its row: CPU, final loss, gap against AdamW of the same seed on
    the same CPU (seed 42 on the Xeon: convergence_quick_xeon.json), bytes per step and the ratios against bf16 and
    fp32 AdamW-HSDP."""
    data, xeon = result("sweep_local"), result("convergence_quick_xeon")

    def cpu(run: dict) -> str:
        return "Xeon" if "Xeon" in data["invocations"][run["invocation"]]["machine"]["cpu_model"] else "EPYC"

    runs = [run for run in data["runs"].values() if run["status"] == "ok"]
    adamw = {(run["knobs"].get("seed", 42), cpu(run)): (run["curve"][-1]["eval_loss"], run["bytes_sent"]["per_step"])
             for run in runs if run["method"] == "adamw"}
    assert "Xeon" in xeon["machine"]["cpu_model"]
    reference = xeon["methods"]["adamw"]
    adamw[42, "Xeon"] = (reference["final_eval_loss"], reference["bytes_sent"]["per_step"])
    rows = [line for line in PAGE.splitlines() if line.startswith("| ")]
    for run in (r for r in runs if r["method"] == "flexdemo"):
        knobs = run["knobs"]
        base_loss, base_bytes = adamw[knobs.get("seed", 42), cpu(run)]
        loss, per_step = run["curve"][-1]["eval_loss"], run["bytes_sent"]["per_step"]
        bytes_cell = f"{per_step:.4g}".replace("e+0", "e")
        cells = (f"| {knobs['value_dtype']} | {knobs.get('compression_transform', 'dct')} |",
                 f"| {knobs.get('seed', 42)} | {cpu(run)} | {loss:.3f} | {_percent(loss, base_loss):+.2f} % | "
                 f"{bytes_cell} | {base_bytes / 2 / per_step:.1f} | {base_bytes / per_step:.1f} |")
        assert any(line.startswith(f"| {knobs['local_steps']}") and all(c in line for c in cells) for line in rows), \
            cells


def test_the_local_steps_1000_step_table_is_the_json():
    data = result("sweep_local_long")
    runs = [run for run in data["runs"].values() if run["status"] == "ok"]
    final = {(run["method"], run["knobs"].get("local_steps", 1), run["knobs"].get("overlap", "none"),
              run["knobs"].get("outer_fragments", 1), run["knobs"].get("compression_transform", "dct"),
              run["knobs"].get("seed", 42)): run["curve"][-1]["eval_loss"] for run in runs}
    for steps, overlap, fragments, transform in ((4, "none", 1, "dct"), (4, "delayed", 1, "dct"),
                                                 (4, "delayed", 4, "dct"), (8, "delayed", 4, "dct"),
                                                 (8, "delayed", 4, "none")):
        losses = [final["flexdemo", steps, overlap, fragments, transform, seed] for seed in (42, 7)]
        gaps = [_percent(loss, final["adamw", 1, "none", 1, "dct", seed]) for loss, seed in zip(losses, (42, 7))]
        row = (f"| {losses[0]:.3f} | {losses[1]:.3f} | {gaps[0]:+.2f} % | {gaps[1]:+.2f} % | "
               f"**{sum(gaps) / 2:+.2f} %** |")
        assert row in PAGE, (overlap, fragments)
        if steps == 8 and transform == "none":  # the defaults
            assert f"without the DCT {sum(gaps) / 2:+.2f} % at 1,000 steps" in PAGE
            assert f"parity (≤ 2 %, mean of two seeds) is met by the defaults: {sum(gaps) / 2:+.2f} %" in PROSE
        elif steps == 8:
            assert f"rounds of 8 steps in 4 fragments are {sum(gaps) / 2:+.2f} % at 1,000 steps" in PAGE
        elif overlap == "none":
            assert f"(waiting for each whole-model exchange: {sum(gaps) / 2:+.2f} %;" in PROSE
        elif fragments == 1:
            assert f"streamed in one round: {sum(gaps) / 2:+.2f} %)" in PAGE
        else:  # the defaults before
            assert f"at 1,000 steps F = 4 is {sum(gaps) / 2:+.2f} % against" in PAGE
            assert f"the defaults before (rounds of 4 with the DCT) {sum(gaps) / 2:+.2f} % at 42.2 ×" in PROSE
    adamw = [final["adamw", 1, "none", 1, "dct", seed] for seed in (42, 7)]
    assert f"| AdamW-HSDP | {adamw[0]:.3f} | {adamw[1]:.3f} |" in PAGE


def test_the_local_time_to_target_figures_are_the_json():
    data = result("time_to_target_local")
    assert data["settings"]["flexdemo"] == ["local_steps=4", "value_dtype=int2"]
    for link, ratios in data["vs_compute_only"].items():
        flexdemo = data["time_to_target"][link]["flexdemo"]
        assert f"| {flexdemo['seconds']:.1f} (step {flexdemo['step']:.0f}) | **{ratios['flexdemo']:.2f}**" in PAGE


def test_the_mixed_hardware_figures_are_the_json():
    runs = {(run["update"], run["policy"]): run for run in result("replica_drift")["runs"]}
    free = runs["sgd", "none"]["worst"]
    assert f"{free['max_abs']:.3g} = {free['max_over_lr']:.1e} `lr`".replace("e-04", "e-4") in PAGE
    assert f"{runs['adamw', 'none']['worst']['max_abs']:.3g} for `\"adamw\"`" in PAGE
    assert runs["sign", "none"]["worst"]["max_abs"] == 0
    assert {runs[u, "raise"]["stopped_at"] for u in ("sgd", "adamw")} == {50}
    assert all(runs[u, "tolerate"]["error"] is None for u in ("sgd", "sign", "adamw"))


def test_the_elastic_resume_figures_are_the_json():
    for name, run in result("elastic_resume")["resumes"].items():
        old, new = run["gap_pct_vs_old_topology"]["100"], run["gap_pct_vs_new_topology"]["100"]
        policy = name.rsplit("_", 1)[1]
        assert f"`{policy}` {old:+.2f} % / {new:+.2f} %" in PAGE, name
        assert run["loaded_exactly"] and round(abs(old), 2) <= 1.00 and old * new < 0  # between the straight runs


def test_the_streamed_time_to_target_figures_are_the_json():
    data, waiting = result("time_to_target_streaming"), result("time_to_target_local")
    assert data["settings"]["flexdemo"] == ["local_steps=4", "value_dtype=int2", "overlap=delayed"]
    assert f"crosses the target at {data['compute_only']['seconds']:.1f} s (step {data['compute_only']['step']:.0f})" \
        in PAGE
    for link, ratios in data["vs_compute_only"].items():
        flexdemo = data["time_to_target"][link]["flexdemo"]
        assert not flexdemo["at_boundary"]
        cells = f"| {flexdemo['seconds']:.1f} (step {flexdemo['step']:.0f}) | **{ratios['flexdemo']:.2f}**"
        assert cells in PAGE, link
        assert f"| {waiting['vs_compute_only'][link]['flexdemo']:.2f} |" in PAGE, link
    adamw = data["time_to_target"]["1000"]["adamw"]
    assert f"projects to {adamw['projected_seconds']:.1f} s" in PAGE


@pytest.mark.parametrize(("name", "flexdemo"), [
    ("time_to_target_rounds_of_8_no_transform", ["local_steps=8", "compression_transform=none"]),  # the defaults
    ("time_to_target_fragments", "FlexDeMoConfig defaults (no FlexDeMo flag passed)"),  # the defaults before
])
def test_the_default_time_to_target_figures_are_the_json(name, flexdemo):
    """The runs at the package defaults, and before (rounds of 4 with the DCT): every link's FlexDeMo and AdamW
    cells, the compute-only crossing, each run's step time, and the optimizer's wait the text quotes."""
    data = result(name)
    assert data["settings"]["flexdemo"] == flexdemo
    reference = data["compute_only"]
    assert f"crosses the target at {reference['seconds']:.1f} s (step {reference['step']:.0f}):" in PAGE
    runs = {(run["method"], run["link"]["rate_mbit"]): run for run in data["runs"]}  # compute-only: rate None
    for link, ratios in data["vs_compute_only"].items():
        flexdemo, adamw = data["time_to_target"][link]["flexdemo"], data["time_to_target"][link]["adamw"]
        assert not flexdemo["at_boundary"] and not adamw["at_boundary"]
        per_step = runs["flexdemo", float(link)]["seconds_per_step"]
        assert f"| {flexdemo['seconds']:.1f} (step {flexdemo['step']:.0f}) | **{ratios['flexdemo']:.2f}**" in PAGE
        assert f"| {per_step:.3f} |" in PAGE, link
        if adamw["reached"]:
            assert f"| {adamw['seconds']:.1f} (step {adamw['step']:.0f}) | {ratios['adamw']:.2f}: FlexDeMo " \
                   f"{data['speedup_to_target'][link]:.2f} × sooner" in PAGE
        else:
            assert f"> {adamw['lower_bound_seconds']:.1f} (stopped at step" in PAGE, link
            assert f"projected {adamw['projected_seconds']:.1f})" in PAGE, link
            assert f"≥ {ratios['adamw_lower_bound']:.2f} (projected {ratios['adamw_projected']:.2f})" in PAGE, link
    waits = {link: run["flexdemo_comm_seconds_per_step"] for (method, link), run in runs.items()
             if method == "flexdemo"}
    assert max(waits.values()) < 0.001  # "rank 0 waited 0.7 ms per step"
    assert f"waited {1000 * waits[10.0]:.1f} ms per step for its exchanges" in PAGE


def test_the_rounds_of_8_figures_are_the_json():
    """Rounds of 8 steps in 4 fragments: the step (its own optimizer_step run) and the slow-link steps."""
    step = result("optimizer_step_rounds_of_8")
    assert step["settings"]["flexdemo"] == ["local_steps=8"] and step["settings"]["flexdemo_local_steps"] == 8
    ratio = step["ratios"]["flexdemo/adamw (mean)"]
    assert f"cheaper: {ratio:.2f} × AdamW's mean step (`python benchmarks/optimizer_step.py" in PAGE
    assert f"and {ratio:.2f} × AdamW's mean step, \"Local steps\")" in PAGE
    links = {row["link_mbit"]: row["step_over_compute_only"] for row in result("bandwidth_rounds_of_8")["rows"]
             if row["method"] == "flexdemo"}
    assert f"10 Mbit/s step {links[10]:.2f} × compute-only, 100 Mbit/s {links[100]:.2f} ×" in PAGE
    bare = result("optimizer_step_rounds_of_8_no_transform")
    assert bare["settings"]["flexdemo"] == ["local_steps=8", "compression_transform=none"]
    ratio = bare["ratios"]["flexdemo/adamw (mean)"]
    assert ratio <= 1.5 and f"measures {ratio:.2f} × AdamW's mean step, the only" in PAGE


def test_the_compile_probe_table_is_the_json():
    data = result("compile_probe")
    assert data["table"].strip() in PAGE
    totals = data["totals"]
    slower = totals["round"]["default"]["median_s"] / totals["round"]["eager_s"]
    assert slower > 1 and f"runs\n{slower:.2f} × slower than eager" in PAGE
    assert all(phase["default"]["bit_identical"] in (True, None) for phase in totals.values())


@pytest.mark.parametrize("name", sorted(path.stem for path in RESULTS.glob("*.json")))
def test_every_result_records_a_clean_commit_taken_at_start(name):
    data = result(name)
    for header in data.get("invocations", [data]):  # a sweep: every invocation that added runs
        assert len(header["git_commit"]) == 40 and header["git_dirty"] is False


def test_the_final_rounds_table_is_the_json():
    """docs/how-it-works.md "The end of a run": each seed's loss after each way to end the run, and its bytes."""
    docs = (ROOT / "docs" / "how-it-works.md").read_text()
    rows = {"anchors": "anchors only (before `finish()`)", "compressed": "final round, compressed (the default)",
            "dense": "final round, dense float32"}
    runs = [result(f"final_rounds_quick_seed{seed}") for seed in (42, 43)]
    for key, label in rows.items():
        ends = [run["methods"]["flexdemo"]["final_rounds"][key] for run in runs]
        losses = [f"{end['eval_loss']:.4f}" for end in ends]
        if key == "compressed":
            losses = [f"**{loss}**" for loss in losses]
        sent = ends[0].get("bytes_sent", 0)
        assert sent == ends[1].get("bytes_sent", 0)
        assert f"| {label} | {losses[0]} | {losses[1]} | {sent:,.0f} |" in docs
    assert all(run["git_commit"].startswith("d842b3f") and not run["git_dirty"] for run in runs)
    assert "at commit d842b3f from a clean tree" in docs


@pytest.mark.parametrize("method", ["flexdemo", "step_wise"])
def test_the_house_refactor_trained_the_same_bit_for_bit(method):
    """The same quick run before and after the refactor, on one machine: every evaluation's loss and the bytes are
    equal, and the page quotes them."""
    before, after = result(f"house_before_{method}"), result(f"house_after_{method}")
    assert before["machine"]["cpu_model"] == after["machine"]["cpu_model"]
    assert before["git_commit"] != after["git_commit"] and not before["git_dirty"] and not after["git_dirty"]
    ran = [run["methods"][method] for run in (before, after)]
    assert ran[0]["curve"] == ran[1]["curve"] and ran[0]["bytes_sent"]["total"] == ran[1]["bytes_sent"]["total"]
    loss, sent = repr(ran[0]["final_eval_loss"]), f"{int(ran[0]['bytes_sent']['total']):,}"
    assert f"{loss} / {loss} | {sent} / {sent} |" in PAGE


def test_the_node_scaling_table_is_the_json():
    """Every run of the node-scaling sweeps is one row of "Loss against the number of nodes": its final loss, its gap
    against AdamW-HSDP on the same nodes and global batch, and a node's bits per parameter and step."""
    runs = {**result("sweep_nodes")["runs"], **result("sweep_nodes_outer")["runs"]}
    unlogged = {key for key, run in runs.items() if run["method"] != "adamw"
                and run["bytes_sent"].get("bits_per_param_sent") is None}
    assert unlogged == {f"flexdemo lr=0.003 {knobs}" for knobs in (
        "nodes=8 procs_per_node=1 scaling=strong", "nodes=8 outer_lr=2 procs_per_node=1 scaling=strong",
        "nodes=8 outer_lr=0.7 outer_momentum=0.9 procs_per_node=1 scaling=strong",
        "nodes=8 procs_per_node=1 replicator=full scaling=strong",
        "local_steps=4 nodes=8 procs_per_node=1 scaling=strong")}
    assert "The five 8 × 1 runs at `outer_lr=1`, `outer_lr=2` (seed 42), DiLoCo's outer rule" in PROSE
    under = []  # how far the last window's ratio puts a streamed run's bits under its logged mean, where it has both
    for name in ("sweep_nodes", "sweep_nodes_outer", "sweep_nodes_weak", "sweep_nodes_leader", *OWNER_FILES):
        for run in result(name)["runs"].values():
            logged = run["bytes_sent"].get("bits_per_param_sent")
            if (run["method"] != "adamw" and run["knobs"].get("nodes", 2) > 2 and logged is not None
                    and run["flexdemo_config"]["overlap"] != "none"):
                under.append((run["flexdemo_config"]["local_steps"], 100 * (1 - _ratio_bits(run) / logged)))
    shorter, sixteen, two = ([gap for rounds, gap in under if rounds in lengths] for lengths in ((4, 8), (16,), (2,)))
    assert {rounds for rounds, _ in under} == {2, 4, 8, 16} and max(sixteen) < 0
    assert (f"which lies {min(shorter):.1f}–{max(shorter):.1f} % under the logged mean in every 4- and 8-node run "
            f"streamed in rounds of 4 or 8 that has both (in rounds of 16, {-max(sixteen):.1f} % over it; in the dense "
            f"rounds of 2, whose payload does not vary, {max(map(abs, two)):.1f} %)") in PROSE

    def topology(run: dict) -> tuple:
        knobs = run["knobs"]
        return knobs.get("nodes", 2), knobs.get("procs_per_node", 2), knobs.get("scaling"), knobs.get("seed", 42)

    adamw = {topology(r): r["final_eval_loss"] for r in runs.values() if r["method"] == "adamw" and r["status"] == "ok"}
    lines = PAGE.splitlines()
    for key, run in runs.items():
        assert run["status"] == "ok", key
        nodes, procs, _, seed = topology(run)
        if run["method"] == "adamw":
            label = "AdamW-HSDP (fp32 reduce)" + ("" if seed == 42 else f", seed {seed}")
            cells = f"| {nodes} × {procs} | {label} | {run['final_eval_loss']:.3f} | – | – |"
        else:
            gap = _percent(run["final_eval_loss"], adamw[topology(run)])
            bits = _bits_sent(run)
            cells = f"| {run['final_eval_loss']:.3f} | {gap:+.2f} % | {bits:.3g} |"
        assert sum(line.startswith(f"| {nodes} × {procs} |") and line.endswith(cells) for line in lines) == 1, key


def _assert_in_prose(text: str) -> None:
    """``text`` is in the page, whatever its line breaks and the test's string joins."""
    assert " ".join(text.split()) in PROSE


def _tail(run: dict) -> float:
    """A run's mean logged training loss over its last 200 steps."""
    last = run["train_loss_curve"][-1]["step"]
    window = [x["loss"] for x in run["train_loss_curve"] if x["step"] > last - 200]
    return sum(window) / len(window)


def _loss_at(run: dict, step: int) -> float:
    """run's validation loss at evaluation step ``step``."""
    return next(c["eval_loss"] for c in run["curve"] if c["step"] == step)


def _percent(value: float, reference: float) -> float:
    """value against reference, in percent: the number behind every gap the page writes."""
    return 100 * (value / reference - 1)


def _gap(run: dict, reference: dict, field: str = "final_eval_loss") -> str:
    """run's ``field`` against reference's as the page writes a gap: +1.03 %."""
    return f"{_percent(run[field], reference[field]):+.2f} %"


def _commit_of(name: str, run: dict) -> str:
    """The short commit a run of result ``name`` ran at."""
    return result(name)["invocations"][run["invocation"]]["git_commit"][:7]


def _ratio_bits(run: dict) -> float:
    """A node's bits per parameter and step through the run's last logging window's ratio to a bf16 all-reduce
    (2 (R - 1) / R values of 16 bits per parameter and step)."""
    nodes = run["knobs"].get("nodes", 2)
    return 32 * (nodes - 1) / nodes / run["bytes_sent"]["compression_ratio_vs_dense_bf16"]


def _bits_sent(run: dict) -> float:
    """A node's bits per parameter and step as the run logged them (the mean of its logging windows); a run from
    before those logs gives them through :func:`_ratio_bits`, as ``benchmarks/frontier.py`` does."""
    logged = run["bytes_sent"].get("bits_per_param_sent")
    return _ratio_bits(run) if logged is None else logged


def _best_adamw(runs: dict, nodes: int, seed: int = 42) -> dict:
    """Of a weak-scaling grid's AdamW-HSDP runs of ``seed`` on ``nodes`` nodes, the one with the lowest final loss (the
    reference benchmarks/frontier.py takes)."""
    return min((r for r in runs.values() if r["method"] == "adamw" and r["knobs"]["nodes"] == nodes
                and r["knobs"].get("seed", 42) == seed), key=lambda r: r["final_eval_loss"])


def _weak_defaults(runs: dict, seed: int = 42) -> dict:
    """Grid nodes_weak's defaults of ``seed`` on 8 nodes, at their best lr (3e-3)."""
    return runs["flexdemo lr=0.003 nodes=8 procs_per_node=1 scaling=weak" + ("" if seed == 42 else f" seed={seed}")]


def _weak_adamw(runs: dict, seed: int = 42, lr: str | None = None) -> dict:
    """Grid nodes_weak's AdamW-HSDP of ``seed`` on 8 nodes at ``lr`` (as the key writes it), or at its best lr."""
    if lr is None:
        return _best_adamw(runs, 8, seed)
    return runs[f"adamw lr={lr} nodes=8 procs_per_node=1 scaling=weak" + ("" if seed == 42 else f" seed={seed}")]


def _best_lr_gap(runs: dict, seed: int) -> float:
    """The 8-weak-node gap of ``seed``, each method at its best lr, in percent."""
    return _percent(_weak_defaults(runs, seed)["final_eval_loss"], _best_adamw(runs, 8, seed)["final_eval_loss"])


def _two_seeds_best_lr_gap(runs: dict) -> float:
    """The 8-weak-node gap with each method at its best lr, the mean over seeds 42 and 7 of each seed's gap."""
    return (_best_lr_gap(runs, 42) + _best_lr_gap(runs, 7)) / 2


def _evaluations(run: dict) -> list[int]:
    """The steps of run's evaluations past step 0: what "at every evaluation" ranges over."""
    return [c["step"] for c in run["curve"][1:]]


def _lengthened_best_lr_gaps(runs: dict, lr: str = "0.003", field: str = "final_eval_loss",
                             adamw_lr: str | None = None, nodes: int = 8) -> list[float]:
    """progress_scale="batch" on ``nodes`` weak nodes (8 x 1 or 4 x 2; outer_lr=1, at ``lr``) against AdamW-HSDP at its
    best lr there, or at 8 nodes at ``adamw_lr``, on ``field``, seeds 42 and 7, in percent."""
    key = f"flexdemo lr={lr} nodes={nodes} outer_lr=1 procs_per_node={8 // nodes} progress_scale=batch scaling=weak"
    return [_percent(runs[key + more][field], (_best_adamw(runs, nodes, seed) if adamw_lr is None
                                               else _weak_adamw(runs, seed, adamw_lr))[field])
            for seed, more in ((42, ""), (7, " seed=7"))]


def _lengthened_headline(runs: dict, nodes: int) -> float:
    """The lengthened exchange's gap on ``nodes`` weak nodes as the page's headlines quote it: each method at its best
    measured lr (the lengthened exchange's 4.24e-3 at 8 nodes, 3e-3 at 4), the mean of seeds 42 and 7, in percent."""
    return sum(_lengthened_best_lr_gaps(runs, {8: "0.00424", 4: "0.003"}[nodes], nodes=nodes)) / 2


def _gaps_along(run: dict, reference: dict) -> dict[int, float]:
    """run's validation loss against reference's at each evaluation step past step 0, in percent."""
    return {c["step"]: _percent(c["eval_loss"], ref["eval_loss"])
            for c, ref in zip(run["curve"][1:], reference["curve"][1:])}


def _best_step(run: dict) -> int:
    """The evaluation step of run's lowest validation loss."""
    return min(run["curve"], key=lambda c: c["eval_loss"])["step"]


def _behind_at(run: dict, reference: dict) -> list[int]:
    """The evaluation steps past step 0 at which run's validation loss is above reference's."""
    return [step for step, gap in _gaps_along(run, reference).items() if gap > 0]


def test_the_outer_step_past_the_rule_at_8_nodes_is_the_json():
    """"Loss against the number of nodes": at 8 strong nodes sqrt(R) and half the inner lr under twice the outer step
    are behind the rule's step at every evaluation, and the inner lr up by sqrt(2) under an outer step down by it from
    step 1,000 on; the page names their commits and their CPU, and the training losses of the last 200 steps."""
    data = result("sweep_nodes_outer")
    rule, root, halved, raised = (
        data["runs"][f"flexdemo lr={lr} nodes=8 outer_lr={outer} procs_per_node=1 scaling=strong"]
        for lr, outer in (("0.003", "2"), ("0.003", "2.83"), ("0.0015", "4"), ("0.00424", "1.41")))
    adamw = _strong_adamw(8)["final_eval_loss"]
    for run, outer in ((root, 2.83), (halved, 4.0), (raised, 1.41)):
        assert run["flexdemo_config"]["outer_lr"] == outer
        invocation = data["invocations"][run["invocation"]]
        assert invocation["machine"]["cpu_model"].startswith("Intel(R) Xeon(R) Processor")
        assert not invocation["git_dirty"] and f"commit {invocation['git_commit'][:7]}" in PROSE
    steps = [c["step"] for c in rule["curve"]]
    for run, behind_from in ((root, 200), (halved, 200), (raised, 1000)):  # "behind ... from step 1,000 on"
        assert _behind_at(run, rule) == steps[steps.index(behind_from):]

    assert (f"At R = 8, √R = 2.83 is {_percent(root['final_eval_loss'], adamw):+.2f} %, behind the rule's 2 at "
            f"every evaluation ({root['curve'][1]['eval_loss']:.3f} against {rule['curve'][1]['eval_loss']:.3f} at "
            f"step 200") in PROSE
    assert (f"is {_percent(halved['final_eval_loss'], adamw):+.2f} %, behind from the first evaluation "
            f"({halved['curve'][1]['eval_loss']:.3f} at step 200) to the last; its training loss over the last 200 "
            f"steps is {_tail(halved):.3f} against the default's {_tail(rule):.3f}") in PROSE
    assert (f"`outer_lr=1.41`), is {_percent(raised['final_eval_loss'], adamw):+.2f} %: ahead of the default or "
            f"level with it to step 800") in PROSE


def test_the_last_window_puts_the_ratio_bits_low():
    """The unlogged runs' bits come from their last logging window's ratio: in rounds of 8 in 4 fragments, a 50-step
    window holds 25 exchanges, and the last one holds 7 of the smallest fragment's where its share is 6.25. That
    window, with the fragments the optimizer cuts from the quick model, is what puts them 0.7 % under the logged mean
    (the page's "last logging window")."""
    from transformers import T5ForConditionalGeneration

    from hf_flexdemo.optim.local_steps import LocalSteps, partition
    from hf_flexdemo.seq2seq.tiny_t5 import tiny_t5_config

    run = result("sweep_nodes_weak")["runs"]["flexdemo lr=0.003 nodes=8 procs_per_node=1 scaling=weak"]
    config, traffic, nodes = run["flexdemo_config"], run["bytes_sent"], run["knobs"]["nodes"]
    model = T5ForConditionalGeneration(tiny_t5_config(4100))  # the quick preset's 4,000 pieces and 100 sentinels
    sizes = [p.numel() for p in model.parameters()]
    assert sum(sizes) == round(traffic["per_step"] * 8 / nodes / traffic["bits_per_param_sent"])
    fragment_of = partition(sizes, config["outer_fragments"])
    size = [sum(n for n, f in zip(sizes, fragment_of) if f == k) for k in range(config["outer_fragments"])]
    slot = config["local_steps"] // config["outer_fragments"]
    rounds = SimpleNamespace(every=config["local_steps"], slot=slot, fragments=config["outer_fragments"])
    steps = run["train_loss_curve"][-1]["step"]
    window = steps - run["train_loss_curve"][-2]["step"]
    sent = {done: size[LocalSteps.fragment_at(rounds, done)] for done in range(slot, steps + 1, slot)}
    last = sum(n for done, n in sent.items() if done > steps - window) / window
    predicted = last / (sum(sent.values()) / steps)
    observed = _ratio_bits(run) / traffic["bits_per_param_sent"]
    assert round(100 * (1 - predicted), 1) == 0.7 and abs(observed / predicted - 1) < 5e-4


def test_the_weak_scaling_table_and_its_reading_are_the_json():
    """"Weak scaling": every run of grid nodes_weak is one row (its global batch, final and best loss, gap against
    AdamW-HSDP on the same nodes, bits), and the analysis quotes the 8-node runs' curves and training losses."""
    runs = result("sweep_nodes_weak")["runs"]
    placement = ("nodes", "procs_per_node", "scaling")

    def where(run: dict) -> tuple[int, int, float, int]:
        return run["knobs"]["nodes"], run["knobs"]["procs_per_node"], run["lr"], run["knobs"].get("seed", 42)

    adamw = {where(r): r for r in runs.values() if r["method"] == "adamw"}
    for key, run in runs.items():
        assert run["status"] == "ok" and run["knobs"]["scaling"] == "weak", key
        nodes, procs, lr, seed = where(run)
        batch = (run["training_args"]["per_device_train_batch_size"] * nodes * procs
                 * run["training_args"].get("gradient_accumulation_steps", 1))
        cells = f"| {run['final_eval_loss']:.3f} | {run['best_eval_loss']:.3f} |"
        at = ("" if lr == 3e-3 else f", lr {_written(lr)}") + ("" if seed == 42 else f", seed {seed}")
        if run["method"] == "adamw":
            label, cells = f"AdamW-HSDP (fp32 reduce){at}", f"{cells} – | – |"
        else:
            knobs = {k: v for k, v in run["knobs"].items() if k not in (*placement, "seed")}
            label = (", ".join(f"`{k}={v:g}`" if isinstance(v, float | int) else f'`{k}="{v}"`'
                               for k, v in knobs.items()) or "the defaults") + at
            reference = adamw.get(where(run))  # seed 7 has AdamW-HSDP at its best lr only
            gap = "–" if reference is None else _gap(run, reference)
            bits = _bits_sent(run)
            cells = f"{cells} {gap} | {bits:.3g} |"
        assert f"| {nodes} × {procs} | {batch} | {label} {cells}" in PAGE.splitlines(), key
    by = {(r["knobs"]["nodes"], r["method"] + str(r["knobs"].get("outer_lr", ""))): r for r in runs.values()
          if set(r["knobs"]) <= {*placement, "outer_lr"} and r["lr"] == 3e-3}
    defaults, base, outer1 = by[8, "flexdemo"], by[8, "adamw"], by[8, "flexdemo1.0"]
    defaults4, base4 = by[4, "flexdemo"], by[4, "adamw"]

    def gap(run: dict, reference: dict = base, field: str = "final_eval_loss") -> str:
        return _gap(run, reference, field)

    assert all(len([x for x in r["train_loss_curve"] if x["step"] > 1800]) == 4 for r in (defaults, base))
    caught = next(c["step"] for c in defaults["curve"] if c["eval_loss"] <= _loss_at(base, 800))
    level = max(c["step"] for c in base4["curve"] if c["eval_loss"] >= defaults4["final_eval_loss"])
    # of AdamW-HSDP's lrs 3e-3 and 6e-3 at 8 nodes its best is 6e-3 (1.2e-2: the next test), of the defaults' 3e-3
    best = _best_adamw(runs, 8)
    fell = runs["flexdemo lr=0.006 nodes=8 procs_per_node=1 scaling=weak"]
    assert best["lr"] == 6e-3 and fell["final_eval_loss"] > defaults["final_eval_loss"]
    gaps = f"{gap(defaults4, base4)} / {gap(defaults)} / {_two_seeds_best_lr_gap(runs):+.2f} %"
    assert f"**Under weak scaling the defaults are {gap(defaults4, base4)} at 4 nodes and {gap(defaults)} at 8" in PROSE
    assert f"(each at its best lr, {_two_seeds_best_lr_gap(runs):+.2f} % at 8 on the mean of two seeds" in PROSE
    assert (f"at 8 nodes each at its best lr of 3e-3 and 6e-3 (the defaults 3e-3, AdamW-HSDP 6e-3), mean of two seeds "
            f"([\"Weak scaling\"](#weak-scaling-each-node-keeps-its-batch)) | {gaps} | – |") in PAGE
    assert (f"at 8 nodes each at its best lr (the defaults 3e-3, AdamW-HSDP 6e-3), mean of two seeds | {gaps} | – |"
            in README)
    assert (f"**Each method at its best lr, the 8-node gap grows to {gap(defaults, best)}: on the grown batch "
            f"AdamW-HSDP gains from twice the lr, the defaults do not.** At 8 weak nodes AdamW-HSDP at 6e-3 ends at "
            f"{best['final_eval_loss']:.3f}, {_gap(best, base)} "
            f"against its 3e-3, ahead of it at every evaluation ({_loss_at(best, 200):.3f} against "
            f"{_loss_at(base, 200):.3f} at step 200); its best, {best['best_eval_loss']:.3f} at step 1,400, is "
            f"{_gap(best, base, 'best_eval_loss')} against its 3e-3's. The defaults "
            f"at 6e-3 end at {fell['final_eval_loss']:.3f}, {gap(fell, defaults)} above their 3e-3: ahead only at "
            f"step 200 ({_loss_at(fell, 200):.3f} against {_loss_at(defaults, 200):.3f}) and behind from step 400 on "
            f"({_loss_at(fell, 400):.3f} against {_loss_at(defaults, 400):.3f}), with a training loss over the last "
            f"200 steps of {_tail(fell):.3f} against {_tail(defaults):.3f} at 3e-3") in PROSE
    assert _loss_at(best, 1400) == best["best_eval_loss"]
    assert _behind_at(base, best) == _evaluations(base)
    assert _behind_at(fell, defaults) == _evaluations(defaults)[1:]
    assert (f"there the defaults are {gap(defaults, best)} (their best losses "
            f"{gap(defaults, best, 'best_eval_loss')})") in PROSE
    two_nodes = (result("sweep_lr_horizon")["runs"]["flexdemo lr=0.006"]["final_eval_loss"]
                 / result("sweep_bits")["runs"]["adamw lr=0.003"]["final_eval_loss"])
    assert f"the defaults at 6e-3 are {100 * (two_nodes - 1):+.2f} % there" in PROSE
    assert f"is {_tail(defaults):.3f} against AdamW's {_tail(base):.3f})" in PROSE
    assert f"validation loss of step 800 ({_loss_at(base, 800):.3f}) only at step {caught:,}" in PROSE
    assert f"the defaults end where AdamW was at step {level:,} ({_loss_at(base4, level):.3f})" in PROSE
    longer = by[8, "flexdemo2.83"]
    assert (f"at 8 nodes `outer_lr=1` is {gap(outer1)}, 2 (the default there) {gap(defaults)}, and √R = 2.83 "
            f"{gap(longer)}, behind from the first evaluation on ({_loss_at(longer, 200):.3f} against the default's "
            f"{_loss_at(defaults, 200):.3f} at step 200)") in PROSE
    assert f"best losses differ by as much ({gap(defaults, base, 'best_eval_loss')})" in PROSE
    momentum = runs["flexdemo lr=0.003 nodes=8 outer_lr=1 outer_momentum=0.5 procs_per_node=1 scaling=weak"]
    assert f"`outer_lr=1` (at commit {_commit_of('sweep_nodes_weak', momentum)}, the same grid:" in PROSE
    assert (f"is {gap(momentum)}, behind the default's outer step of 2 at every evaluation "
            f"({_loss_at(momentum, 200):.3f} against {_loss_at(defaults, 200):.3f} at step 200, "
            f"{momentum['final_eval_loss']:.3f} against {defaults['final_eval_loss']:.3f} at step 2,000)") in PROSE
    assert _behind_at(momentum, defaults) == _evaluations(defaults)
    dense = runs["flexdemo lr=0.003 nodes=8 procs_per_node=1 replicator=full scaling=weak"]
    assert (f"at the same outer step\n(2 at 8 nodes) is {gap(dense)}, behind from the first evaluation on "
            f"({_loss_at(dense, 200):.3f} against the defaults' {_loss_at(defaults, 200):.3f} at step 200)\nand close "
            f"to the compressed exchange at `outer_lr=2.83` ({gap(longer)})") in PAGE
    assert (f"`replicator=\"full\"`, {_bits_sent(dense):.2f} bits per parameter and step, "
            f"{_bits_sent(dense) / _bits_sent(defaults):.0f} × the defaults'") in PROSE


def test_the_weak_scaling_second_seed_is_the_json():
    """"Weak scaling": seed 7 of AdamW-HSDP at 6e-3 and of the defaults at 3e-3 on 8 nodes, each method's best lr at
    seed 42, and the mean of the two seeds' gaps."""
    data = result("sweep_nodes_weak")
    runs = data["runs"]
    defaults, defaults7 = _weak_defaults(runs), _weak_defaults(runs, 7)
    best, best7 = _best_adamw(runs, 8), _best_adamw(runs, 8, 7)
    assert best["lr"] == best7["lr"] == 6e-3 and {r["knobs"].get("seed") for r in (defaults7, best7)} == {7}
    for run in (defaults7, best7):
        invocation = data["invocations"][run["invocation"]]
        assert invocation["machine"]["cpu_model"] == "AMD EPYC" and not invocation["git_dirty"]
        assert f"With seed 7 (at commit {invocation['git_commit'][:7]}, on the AMD EPYC)" in PROSE
    gap42, gap7 = _best_lr_gap(runs, 42), _best_lr_gap(runs, 7)
    mean = _two_seeds_best_lr_gap(runs)
    assert _behind_at(defaults7, best7) == _evaluations(best7)
    assert (f"**On the mean of two seeds, each method at its best lr, the 8-node gap is {mean:+.2f} %.** With seed 7 "
            f"(at commit") in PROSE
    assert (f"AdamW-HSDP at 6e-3 ends at {best7['final_eval_loss']:.3f} ({_gap(best7, best)} against seed 42's "
            f"{best['final_eval_loss']:.3f}) and the defaults at 3e-3 at {defaults7['final_eval_loss']:.3f} "
            f"({_gap(defaults7, defaults)} against seed 42's {defaults['final_eval_loss']:.3f}): {gap7:+.2f} % against "
            f"AdamW-HSDP of the same seed, where seed 42 gave {gap42:+.2f} %, and behind it at every evaluation "
            f"({_loss_at(defaults7, 200):.3f} against {_loss_at(best7, 200):.3f} at step 200). The two seeds' gaps "
            f"differ by {abs(gap42 - gap7):.2f} points, against {mean - 4:.2f} points between their mean and issue "
            f"32's 4 %") in PROSE
    assert (f"Their best losses are {_gap(defaults7, best7, 'best_eval_loss')} apart (seed 42: "
            f"{_gap(defaults, best, 'best_eval_loss')}), and the defaults' training loss over the last 200 steps is "
            f"{_tail(defaults7):.3f} against AdamW-HSDP's {_tail(best7):.3f} (seed 42: {_tail(defaults):.3f} against "
            f"{_tail(best):.3f})") in PROSE


def _dense_step_wise(scaling: str, nodes: int = 8) -> tuple[dict, dict]:
    """Grid nodes_{scaling}_step_wise's run on ``nodes`` nodes (the step-wise rule without compression, 8 processes,
    from a clean tree on the AMD EPYC) and its invocation."""
    data = result(f"sweep_nodes_{scaling}_step_wise")
    (key, dense), = ((key, run) for key, run in data["runs"].items() if run["knobs"]["nodes"] == nodes)
    config, invocation = dense["flexdemo_config"], data["invocations"][dense["invocation"]]
    assert dense["status"] == "ok" and dense["lr"] == 3e-3 and dense["knobs"]["procs_per_node"] == 8 // nodes, key
    assert dense["knobs"]["scaling"] == scaling, key
    assert (config["local_steps"], config["replicator"], config["value_dtype"]) == (1, "full", "float32")
    assert (config["momentum"], config["update"]) == ("adam", "sgd")
    assert not invocation["git_dirty"] and invocation["machine"]["cpu_model"].startswith("AMD EPYC")
    return dense, invocation


def test_the_weak_scaling_cause_is_the_json():
    """"Weak scaling": the dense step-wise rule at 8 weak nodes (the mean of the nodes' AdamW steps every step, no
    rounds, no compression) against AdamW-HSDP and the defaults at the same lr, and the split of the gap."""
    dense, invocation = _dense_step_wise("weak")
    runs = result("sweep_nodes_weak")["runs"]
    base, defaults, outer1 = (runs[f"{run} nodes=8 {knobs}procs_per_node=1 scaling=weak"] for run, knobs in (
        ("adamw lr=0.003", ""), ("flexdemo lr=0.003", ""), ("flexdemo lr=0.003", "outer_lr=1 ")))
    gap, gap1, gap2 = (_percent(r["final_eval_loss"], base["final_eval_loss"]) for r in (dense, outer1, defaults))
    assert _behind_at(dense, base) == _behind_at(outer1, dense) == _behind_at(dense, defaults) == _evaluations(base)
    assert (f"(`benchmarks/results/sweep_nodes_weak_step_wise.json`, at commit {invocation['git_commit'][:7]} from a "
            f"clean tree, AMD EPYC)") in PROSE
    assert f"float32 values: {_bits_sent(dense):.1f} bits per parameter and step" in PROSE
    assert (f"It ends at {dense['final_eval_loss']:.3f}, **{gap:+.2f} %** against AdamW-HSDP at 3e-3, behind it at "
            f"every evaluation ({_loss_at(dense, 200):.3f} against {_loss_at(base, 200):.3f} at step 200), with a "
            f"training loss over the last 200 steps of {_tail(dense):.3f} against {_tail(base):.3f}") in PROSE
    assert (f"are {gap1:+.2f} % and behind it at every evaluation ({_loss_at(outer1, 200):.3f} at step 200); the "
            f"default outer step of 2 is {gap2:+.2f} % and ahead of it at every evaluation") in PROSE
    assert (f"the rounds and their compression cost {gap1 - gap:.2f} points and the normalisation before the mean "
            f"costs {gap:.2f}; the default outer step takes back {gap1 - gap2:.2f} points") in PROSE


def test_the_normalisation_cost_at_4_weak_nodes_is_the_json():
    """"Weak scaling": the dense step-wise rule at 4 weak nodes against AdamW-HSDP, the defaults and the lengthened
    exchange at the same lr, along the run, and what the lengthening takes back."""
    dense, invocation = _dense_step_wise("weak", nodes=4)
    runs = result("sweep_nodes_weak")["runs"]
    base, defaults, scaled = (runs[f"{run} nodes=4 {knobs}procs_per_node=2 {more}scaling=weak"]
                              for run, knobs, more in (("adamw lr=0.003", "", ""), ("flexdemo lr=0.003", "", ""),
                                                       ("flexdemo lr=0.003", "outer_lr=1 ", "progress_scale=batch ")))
    assert defaults["flexdemo_config"]["outer_lr"] is None and not _behind_at(defaults, dense)
    gap, gap_defaults, gap_scaled = (_percent(r["final_eval_loss"], base["final_eval_loss"])
                                     for r in (dense, defaults, scaled))
    along, versus = _gaps_along(dense, base), _gaps_along(scaled, dense)
    steps = _evaluations(base)
    assert f"{along[200]:.2f}" == f"{along[400]:.2f}" and all(along[a] < along[b] for a, b in zip(steps[1:], steps[2:]))
    early = [step for step in steps if step <= 1000]
    behind = _behind_at(scaled, dense)
    assert behind[-1] == 1000 and all(versus[step] < 0 for step in steps[len(early):])
    assert (f"**At 4 weak nodes the normalisation before the mean costs {gap:.2f} points, and the lengthening takes "
            f"back {gap - gap_scaled:.2f} of them: the {gap_scaled:+.2f} % left is inside what the normalisation "
            f"costs.** `python benchmarks/sweep.py nodes_weak_step_wise` "
            f"(`benchmarks/results/sweep_nodes_weak_step_wise.json`, at commit {invocation['git_commit'][:7]} from a "
            f"clean tree, AMD EPYC)") in PROSE
    assert (f"each normalised by its own node's moments of its 32 sequences ({_bits_sent(dense):.1f} bits per "
            f"parameter and step), with no rounds and no compression. It ends at {dense['final_eval_loss']:.3f}, "
            f"**{gap:+.2f} %** against AdamW-HSDP at 3e-3: {along[200]:+.2f} % at steps 200 and 400, then wider at "
            f"every evaluation after ({along[1000]:+.2f} % at step 1,000), with a training loss over the last 200 "
            f"steps of {_tail(dense):.3f} against {_tail(base):.3f}. The defaults' rounds at their outer step of 1.41 "
            f"({gap_defaults:+.2f} %) are ahead of it at every evaluation. The lengthened exchange at the same lr "
            f"({gap_scaled:+.2f} %) stays within {max(abs(versus[step]) for step in early):.2f} % of it up to step "
            f"1,000 (behind at steps {', '.join(map(str, behind[:-1]))} and 1,000) and is ahead "
            f"from step 1,200 on, by {-versus[2000]:.2f} % at step 2,000, with a training loss over the last 200 steps "
            f"of {_tail(scaled):.3f}.") in PROSE
    assert f"the lengthening takes back {gap - gap_scaled:.2f} of its {gap:.2f} points, all of them after step" in PROSE


def test_the_strong_scaling_cause_is_the_json():
    """"Weak scaling": the dense step-wise rule at 8 strong nodes against AdamW-HSDP, the defaults' rounds at outer
    steps 1 and 2 and the dense pseudo-gradient mean, and the split of the gap."""
    dense, invocation = _dense_step_wise("strong")
    base = _strong_adamw(8)
    outer1 = result("sweep_nodes")["runs"]["flexdemo lr=0.003 nodes=8 procs_per_node=1 scaling=strong"]
    outer2, full = (result("sweep_nodes_outer")["runs"][f"flexdemo lr=0.003 nodes=8 {knobs}scaling=strong"]
                    for knobs in ("outer_lr=2 procs_per_node=1 ", "procs_per_node=1 replicator=full "))
    gap, gap1, gap2, gap_full = (_percent(r["final_eval_loss"], base["final_eval_loss"])
                                 for r in (dense, outer1, outer2, full))
    assert _behind_at(dense, base) == _behind_at(outer1, dense) == _evaluations(base)
    assert _behind_at(outer2, dense) == _evaluations(base)[2:-1]
    assert (f"(`benchmarks/results/sweep_nodes_strong_step_wise.json`, at commit {invocation['git_commit'][:7]} from a "
            f"clean tree, AMD EPYC) runs the same dense rule at 8 nodes with the global batch fixed at 64 sequences, 8 "
            f"per node ({_bits_sent(dense):.1f} bits per parameter and step)") in PROSE
    assert (f"**Under strong scaling the normalisation before the mean costs {gap:.2f} points, two thirds of the gap "
            f"at `outer_lr=1`.**") in PROSE and round(gap / gap1, 2) == 0.66
    assert (f"It ends at {dense['final_eval_loss']:.3f}, **{gap:+.2f} %** against AdamW-HSDP on the same nodes and "
            f"batch (grid `nodes`, [above](#loss-against-the-number-of-nodes)), behind it at every evaluation "
            f"({_loss_at(dense, 200):.3f} against {_loss_at(base, 200):.3f} at step 200), with a training loss over "
            f"the last 200 steps of {_tail(dense):.3f} against {_tail(base):.3f}. The defaults' rounds of 8 at "
            f"`outer_lr=1` are {gap1:+.2f} % and behind it at every evaluation, so at `outer_lr=1` the rounds and "
            f"their compression cost {gap1 - gap:.2f} points here (the dense pseudo-gradient mean, {gap_full:+.2f} %, "
            f"puts {gap1 - gap_full:.2f} of them on the compression) and the normalisation before the mean "
            f"{gap:.2f}. The rule's outer step of 2 ({gap2:+.2f} %) takes back {gap1 - gap2:.2f} points and ends level "
            f"with the dense rule ({outer2['final_eval_loss']:.3f} against {dense['final_eval_loss']:.3f})") in PROSE


def test_progress_scaled_to_the_nodes_batch_at_8_strong_nodes_is_the_json():
    """"Weak scaling": progress_scale="batch" at 8 strong nodes against AdamW-HSDP, the same rounds unscaled at the same
    outer step and the rule's outer step."""
    data = result("sweep_nodes_outer")
    scaled = data["runs"]["flexdemo lr=0.003 nodes=8 procs_per_node=1 progress_scale=batch scaling=strong"]
    rule = data["runs"]["flexdemo lr=0.003 nodes=8 outer_lr=2 procs_per_node=1 scaling=strong"]
    outer1 = result("sweep_nodes")["runs"]["flexdemo lr=0.003 nodes=8 procs_per_node=1 scaling=strong"]
    base = _strong_adamw(8)
    invocation = data["invocations"][scaled["invocation"]]
    assert invocation["machine"]["cpu_model"] == "AMD EPYC" and not invocation["git_dirty"]
    config = scaled["flexdemo_config"]
    assert config["progress_scale"] == "batch" and config["outer_lr"] == 1.0 and config["local_steps"] == 8
    assert _behind_at(scaled, rule) == _evaluations(scaled)
    assert [step for step in _evaluations(scaled) if step not in _behind_at(scaled, outer1)] == [200, 400]
    assert (f"grid `nodes_outer`, at commit {invocation['git_commit'][:7]} from a clean tree") in PROSE
    assert (f"at the outer step of a mean (`outer_lr=1`) and the defaults' bits ({_bits_sent(scaled):.2f} per "
            f"parameter and step). It ends at {scaled['final_eval_loss']:.3f}, {_gap(scaled, base)} against "
            f"AdamW-HSDP: {_gap(scaled, outer1)} against the same rounds sent unscaled at that outer step "
            f"({_gap(outer1, base)}) and {_gap(scaled, rule)} against the rule's outer step of 2 ({_gap(rule, base)}), "
            f"behind the rule at every evaluation ({_loss_at(scaled, 200):.3f} against {_loss_at(rule, 200):.3f} at "
            f"step 200) and ahead of the unscaled rounds only at steps 200 and 400 ({_loss_at(scaled, 400):.3f} "
            f"against {_loss_at(outer1, 400):.3f}), with a training loss over the last 200 steps of "
            f"{_tail(scaled):.3f} against the rule's {_tail(rule):.3f}.") in PROSE
    assert (f"| 8 × 1 | `progress_scale=\"batch\"` (each element of a node's progress lengthened to the nodes' batch), "
            f"`outer_lr=1` | {scaled['final_eval_loss']:.3f} | {_gap(scaled, base)} | {_bits_sent(scaled):.2f} |"
            ) in PAGE


_SCALED_SUMMARY = ("the same at 4 / 8 weak nodes with `progress_scale=\"batch\"` and `outer_lr=1` (off by default), "
                   "each method at its best measured lr (at 8 nodes 4.24e-3 against AdamW-HSDP's 6e-3), mean of two "
                   "seeds ([\"Weak scaling\"](#weak-scaling-each-node-keeps-its-batch))")


def test_progress_scaled_to_the_nodes_batch_at_8_weak_nodes_is_the_json():
    """"Weak scaling": progress_scale="batch" at 8 weak nodes against the defaults, AdamW-HSDP at both lrs and the
    same rounds unscaled at the same outer step."""
    data = result("sweep_nodes_weak")
    runs = data["runs"]
    key = "flexdemo lr=0.003 nodes=8 outer_lr=1 procs_per_node=1 progress_scale=batch scaling=weak"
    scaled, outer1 = runs[key], runs["flexdemo lr=0.003 nodes=8 outer_lr=1 procs_per_node=1 scaling=weak"]
    defaults, base, best = _weak_defaults(runs), *(_weak_adamw(runs, lr=lr) for lr in ("0.003", "0.006"))
    invocation = data["invocations"][scaled["invocation"]]
    assert invocation["machine"]["cpu_model"] == "AMD EPYC" and not invocation["git_dirty"]
    config = scaled["flexdemo_config"]
    assert config["progress_scale"] == "batch" and config["outer_lr"] == 1.0 and config["local_steps"] == 8
    assert best is _best_adamw(runs, 8) and _behind_at(scaled, defaults) == [200, 400]
    scaled7, defaults7 = runs[f"{key} seed=7"], _weak_defaults(runs, 7)
    best7 = _best_adamw(runs, 8, 7)
    gaps = _lengthened_best_lr_gaps(runs)
    assert _behind_at(scaled7, defaults7) == [200, 400] and best7["lr"] == 6e-3
    assert (f"takes back more than half the 8-node gap: {sum(gaps) / 2:+.2f} % against AdamW-HSDP at its best lr on "
            f"the mean of two seeds, where the defaults are {_two_seeds_best_lr_gap(runs):+.2f} %.** "
            f"`progress_scale=\"batch\"` at `outer_lr=1` (grid `nodes_weak`, seed 42 at commit "
            f"{invocation['git_commit'][:7]} from a clean tree, AMD EPYC; "
            f"{_bits_sent(scaled):.2f} bits per parameter and step, the defaults') ends at "
            f"{scaled['final_eval_loss']:.3f}, {_gap(scaled, defaults)} against the defaults "
            f"({defaults['final_eval_loss']:.3f}): behind them at steps 200 and 400 ({_loss_at(scaled, 200):.3f} "
            f"against {_loss_at(defaults, 200):.3f} at step 200) and ahead from step 600 on "
            f"({_loss_at(scaled, 600):.3f} against {_loss_at(defaults, 600):.3f}), with a training loss over the "
            f"last 200 steps of {_tail(scaled):.3f} against {_tail(defaults):.3f}. It is {_gap(scaled, base)} "
            f"against AdamW-HSDP at 3e-3 (the defaults: {_gap(defaults, base)}) and {_gap(scaled, best)} against its "
            f"best lr, 6e-3 (best losses {_gap(scaled, best, 'best_eval_loss')}), and {_gap(scaled, outer1)} "
            f"against the same rounds sent unscaled at that outer step ({_gap(outer1, base)}). With seed 7 (at commit "
            f"{_commit_of('sweep_nodes_weak', scaled7)}, the same grid) it ends at {scaled7['final_eval_loss']:.3f}, "
            f"{_gap(scaled7, best7)} against AdamW-HSDP at 6e-3 of the same seed (the defaults: "
            f"{_gap(defaults7, best7)}) and {_gap(scaled7, defaults7)} against the defaults of that seed, again behind "
            f"them at steps 200 and 400 and ahead from step 600 on, with a training loss over the last 200 steps of "
            f"{_tail(scaled7):.3f} against {_tail(defaults7):.3f}. The two seeds' gaps differ by "
            f"{abs(gaps[0] - gaps[1]):.2f} points.") in PROSE
    assert _bits_sent(scaled) == pytest.approx(_bits_sent(defaults), rel=0.01)
    both = f"({sum(gaps) / 2:+.2f} % against {_two_seeds_best_lr_gap(runs):+.2f} %"
    strong = result("sweep_nodes_outer")["runs"]
    strong_scaled, rule = (strong[f"flexdemo lr=0.003 nodes=8 {knobs}scaling=strong"] for knobs in (
        "procs_per_node=1 progress_scale=batch ", "outer_lr=2 procs_per_node=1 "))
    at2, defaults2 = (result("sweep_bits")["runs"][f"flexdemo lr=0.003 outer_delay=2{more}"]
                      for more in (" progress_scale=batch", ""))
    docs = " ".join((ROOT / "docs" / "how-it-works.md").read_text().split())
    defaults4, base4 = (runs[f"{method} lr=0.003 nodes=4 procs_per_node=2 scaling=weak"]
                        for method in ("flexdemo", "adamw"))
    mean4 = _lengthened_headline(runs, 4)
    at4 = f"and cuts it at 4 ({mean4:+.2f} % on the mean of two seeds, against {_gap(defaults4, base4)} on one)"
    at_between = _lengthened_headline(runs, 8)
    assert f"the gap at 8 such nodes {both}, two seeds; at lr 4.24e-3 {at_between:+.2f} %, but " in README
    assert f" over 1,000 steps, before the data run out) {at4}; where" in README
    assert (f"halves the gap at 8 nodes that each keep a 2-node batch {both} from AdamW-HSDP at its best lr, means of "
            f"two seeds) {at4}, but loses to the outer step's rule where each node steps on 8 sequences "
            f"({_gap(strong_scaled, _strong_adamw(8))} against {_gap(rule, _strong_adamw(8))}, one seed) and costs "
            f"{_percent(at2['final_eval_loss'], defaults2['final_eval_loss']):.2f} points at 2 nodes") in docs


def test_progress_scaled_at_8_weak_nodes_takes_the_lr_of_one_node():
    """"Weak scaling": progress_scale="batch" at 6e-3, AdamW-HSDP's best lr, against AdamW-HSDP there, itself at 3e-3
    and the defaults at 6e-3; and at 3e-3 under the outer step sqrt(2)."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "nodes=8 outer_lr=1 procs_per_node=1 progress_scale=batch scaling=weak"
    fast, scaled = runs[f"flexdemo lr=0.006 {key}"], runs[f"flexdemo lr=0.003 {key}"]
    best, defaults = (runs[f"{method} lr=0.006 nodes=8 procs_per_node=1 scaling=weak"]
                      for method in ("adamw", "flexdemo"))
    assert fast["flexdemo_config"]["progress_scale"] == "batch" and fast["flexdemo_config"]["outer_lr"] == 1.0
    assert _behind_at(scaled, fast) == [200] and best is _best_adamw(runs, 8)
    assert (f"By the same lr sweep as each method's, at 6e-3 (seed 42, at commit "
            f"{_commit_of('sweep_nodes_weak', fast)}) it ends at {fast['final_eval_loss']:.3f}, {_gap(fast, best)} "
            f"against AdamW-HSDP at 6e-3 and {_gap(fast, scaled)} against itself at 3e-3, ahead of it only at step 200 "
            f"({_loss_at(fast, 200):.3f} against {_loss_at(scaled, 200):.3f}), with a training loss over the last 200 "
            f"steps of {_tail(fast):.3f} against {_tail(scaled):.3f}: the nodes' own AdamW does not take on 32 "
            f"sequences the lr AdamW-HSDP takes on 256, as the defaults' did not ({_gap(defaults, best)} at 6e-3), "
            f"so its best lr lies under 6e-3 (4.24e-3, below).") in PROSE
    longer = runs["flexdemo lr=0.003 nodes=8 outer_lr=1.41 procs_per_node=1 progress_scale=batch scaling=weak"]
    assert longer["flexdemo_config"]["outer_lr"] == 1.41 and _behind_at(longer, scaled) == list(range(200, 2001, 200))
    assert (f"Nor does the consensus take the longer step: at `outer_lr=1.41` (at commit "
            f"{_commit_of('sweep_nodes_weak', longer)}) it ends at {longer['final_eval_loss']:.3f}, "
            f"{_gap(longer, best)} against AdamW-HSDP at 6e-3 and {_gap(longer, scaled)} against `outer_lr=1`, behind "
            f"it at every evaluation, with a training loss over the last 200 steps of {_tail(longer):.3f} against "
            f"{_tail(scaled):.3f}.") in PROSE


def test_progress_scaled_at_4_weak_nodes_is_the_json():
    """"Weak scaling": progress_scale="batch" at 4 weak nodes against the defaults and AdamW-HSDP there, and what it
    took back at 8 on the final and on the best losses."""
    runs = result("sweep_nodes_weak")["runs"]
    scaled = runs["flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"]
    defaults, base = (runs[f"{method} lr=0.003 nodes=4 procs_per_node=2 scaling=weak"]
                      for method in ("flexdemo", "adamw"))
    config = scaled["flexdemo_config"]
    assert config["progress_scale"] == "batch" and config["outer_lr"] == 1.0 and config["local_steps"] == 8
    assert _best_adamw(runs, 4) is base and _behind_at(scaled, defaults) == [200, 400, 600, 800, 1000]
    assert all(run["best_eval_loss"] == run["final_eval_loss"] for run in (scaled, defaults, base))
    scaled8 = runs["flexdemo lr=0.003 nodes=8 outer_lr=1 procs_per_node=1 progress_scale=batch scaling=weak"]
    defaults8, base8 = _weak_defaults(runs), _weak_adamw(runs, lr="0.003")

    def points(field: str) -> tuple[str, str]:
        """What the lengthening took back at 8 nodes of the defaults' gap on ``field``, and that gap, in points."""
        gap, gap_defaults = (_percent(run[field], base8[field]) for run in (scaled8, defaults8))
        return f"{gap_defaults - gap:.2f}", f"{gap_defaults:.2f}"

    assert _best_step(base8) == 1600
    assert (f"takes back under a third of the gap: {_gap(scaled, base)} against AdamW-HSDP, where the defaults are "
            f"{_gap(defaults, base)}, all at lr 3e-3 (the best measured lr there of AdamW-HSDP and of the "
            f"defaults).** `progress_scale=\"batch\"` at `outer_lr=1` (at commit "
            f"{_commit_of('sweep_nodes_weak', scaled)} from a clean tree, the same grid, AMD EPYC; "
            f"{_bits_sent(scaled):.3f} bits per parameter and step, the defaults') lengthens each element by 1 to "
            f"√4 = 2 here. It ends at {scaled['final_eval_loss']:.3f}, {_gap(scaled, defaults)} against the defaults "
            f"({defaults['final_eval_loss']:.3f}): behind them up to step 1,000 ({_loss_at(scaled, 200):.3f} against "
            f"{_loss_at(defaults, 200):.3f} at step 200, {_loss_at(scaled, 1000):.3f} against "
            f"{_loss_at(defaults, 1000):.3f} at step 1,000) and ahead from step 1,200 on "
            f"({_loss_at(scaled, 1200):.3f} against {_loss_at(defaults, 1200):.3f}), with a training loss over the "
            f"last 200 steps of {_tail(scaled):.3f} against {_tail(defaults):.3f} (AdamW-HSDP: {_tail(base):.3f}). "
            f"Seed 42 (seed 7: the next paragraph). At 8 nodes the same lr took back "
            f"{points('final_eval_loss')[0]} of the defaults' {points('final_eval_loss')[1]} points, but on final "
            f"losses taken after both methods had passed their best at step 1,600 and overfit, AdamW-HSDP the more "
            f"({base8['best_eval_loss']:.3f} at step 1,600, {base8['final_eval_loss']:.3f} at step 2,000); on the "
            f"best losses it took back {' of '.join(points('best_eval_loss'))} points, to "
            f"{_gap(scaled8, base8, 'best_eval_loss')}.") in PROSE
    assert f"{_SCALED_SUMMARY} | {_lengthened_headline(runs, 4):+.2f} % / " in PAGE


def test_progress_scaled_at_4_weak_nodes_on_a_second_seed_is_the_json():
    """"Weak scaling": seed 7 of progress_scale="batch" and of AdamW-HSDP at 4 weak nodes, the mean of the two seeds'
    gaps, and the gap along seed 7's run."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"
    scaled, scaled7 = runs[key], runs[key + " seed=7"]
    base, base7 = _best_adamw(runs, 4), _best_adamw(runs, 4, 7)
    assert base["lr"] == base7["lr"] == 3e-3 and base7["knobs"]["seed"] == 7
    assert all(run["best_eval_loss"] == run["final_eval_loss"] for run in (scaled7, base7))
    gaps = _lengthened_best_lr_gaps(runs, nodes=4)
    along = _gaps_along(scaled7, base7)
    peak = max(along, key=along.get)
    steps = sorted(along)
    rising = steps[:steps.index(peak) + 1]
    assert all(along[a] < along[b] for a, b in zip(rising, rising[1:]))
    assert all(along[s] < along[peak] for s in steps[len(rising):])
    mean = sum(gaps) / 2
    assert (f"**With a second seed the lengthened exchange is {mean:+.2f} % at 4 weak nodes on the mean of two "
            f"seeds, {mean - 4:.2f} points past issue 32's aim of 4 % there: the two seeds agree within "
            f"{abs(gaps[0] - gaps[1]):.2f} points.** With seed 7 (at commit {_commit_of('sweep_nodes_weak', scaled7)} "
            f"from a clean tree, the same grid, AMD EPYC), AdamW-HSDP at 3e-3 (its best measured lr there, on seed 42) "
            f"ends at {base7['final_eval_loss']:.3f}, {_gap(base7, base)} against seed 42's, and "
            f"`progress_scale=\"batch\"` at `outer_lr=1` ends at {scaled7['final_eval_loss']:.3f}, "
            f"{_gap(scaled7, base7)} against it (seed 42: {_gap(scaled, base)}) and {_gap(scaled7, scaled)} against "
            f"seed 42's run. As on seed 42 the gap grows to mid-run and then levels off: {along[200]:+.2f} % at step "
            f"200, {along[peak]:+.2f} % at step {peak:,} (its peak), {along[2000]:+.2f} % at step 2,000, with a "
            f"training loss over the last 200 steps of {_tail(scaled7):.3f} against AdamW-HSDP's {_tail(base7):.3f}."
            ) in PROSE
    assert _commit_of("sweep_nodes_weak", scaled7) == _commit_of("sweep_nodes_weak", base7)


def test_progress_scaled_at_4_weak_nodes_a_step_above_its_lr_is_the_json():
    """"Weak scaling": progress_scale="batch" at lr 4.24e-3 on 4 weak nodes against its 3e-3, AdamW-HSDP and the
    defaults there, and where the same lr led at 8 nodes."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "nodes={} outer_lr=1 procs_per_node={} progress_scale=batch scaling=weak"
    above, scaled = (runs[f"flexdemo lr={lr} {key.format(4, 2)}"] for lr in ("0.00424", "0.003"))
    defaults, base = (runs[f"{method} lr=0.003 nodes=4 procs_per_node=2 scaling=weak"]
                      for method in ("flexdemo", "adamw"))
    assert _behind_at(above, scaled) == _evaluations(scaled)[1:] and above["best_eval_loss"] == above["final_eval_loss"]
    at8 = [[runs[f"flexdemo lr={lr} {key.format(8, 1)}{more}"] for lr in ("0.00424", "0.003")]
           for more in ("", " seed=7")]
    assert all(_behind_at(run, reference)[0] == 400 for run, reference in at8)
    led_from = [max(_behind_at(run, reference)) + 200 for run, reference in at8]
    assert led_from == [1400, 1200]
    mean4 = _lengthened_headline(runs, 4)
    assert (f"at lr 4.24e-3 the lengthened exchange ends {_gap(above, scaled)} above its 3e-3 there, so 3e-3 stays its "
            f"best measured lr at 4 weak nodes and the {mean4:+.2f} % stands.** "
            f"`progress_scale=\"batch\"` at `outer_lr=1` and lr 4.24e-3 (at commit "
            f"{_commit_of('sweep_nodes_weak', above)} from a clean tree, the same grid, AMD EPYC) ends at "
            f"{above['final_eval_loss']:.3f}, {_gap(above, base)} against AdamW-HSDP at 3e-3 and "
            f"{_gap(above, defaults)} against the defaults at 3e-3: ahead of its 3e-3 only at step 200 "
            f"({_loss_at(above, 200):.3f} against {_loss_at(scaled, 200):.3f}) and behind from step 400 on "
            f"({_loss_at(above, 400):.3f} against {_loss_at(scaled, 400):.3f}), with a training loss over the last "
            f"200 steps of {_tail(above):.3f} against {_tail(scaled):.3f}. At 8 nodes the same lr also led its 3e-3 at "
            f"step 200, then fell behind and led again only from step {led_from[1]:,} or {led_from[0]:,} on (by "
            f"seed)") in PROSE
    assert f"the {_lengthened_headline(runs, 8):+.2f} % at 8 rests on it. One seed." in PROSE


def test_both_methods_a_step_below_their_lr_at_4_weak_nodes_is_the_json():
    """"Weak scaling": AdamW-HSDP and progress_scale="batch" at lr 2.12e-3 on 4 weak nodes against their 3e-3, so that
    each method's lr there is bracketed."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"
    below, scaled = (runs[f"flexdemo lr={lr} {key}"] for lr in ("0.00212", "0.003"))
    below_base, base = (runs[f"adamw lr={lr} nodes=4 procs_per_node=2 scaling=weak"] for lr in ("0.00212", "0.003"))
    assert _best_adamw(runs, 4) is base
    assert _behind_at(below, scaled) == _behind_at(below_base, base) == _evaluations(base)
    mean4 = _lengthened_headline(runs, 4)
    assert (f"AdamW-HSDP at 2.12e-3 ends {_gap(below_base, base)} above its 3e-3 and the lengthened exchange "
            f"{_gap(below, scaled)} above its own, so each method's best measured lr there is 3e-3, with a worse lr on "
            f"either side, and the {mean4:+.2f} % is each at its best.** AdamW-HSDP at "
            f"lr 2.12e-3 (at commit {_commit_of('sweep_nodes_weak', below_base)} from a clean tree, the same grid, AMD "
            f"EPYC) ends at {below_base['final_eval_loss']:.3f}, behind its 3e-3 at every evaluation "
            f"({_loss_at(below_base, 200):.3f} against {_loss_at(base, 200):.3f} at step 200), with a training loss "
            f"over the last 200 steps of {_tail(below_base):.3f} against {_tail(base):.3f}. `progress_scale=\"batch\"` "
            f"at `outer_lr=1` and lr 2.12e-3 (at commit {_commit_of('sweep_nodes_weak', below)}) ends at "
            f"{below['final_eval_loss']:.3f}, {_gap(below, base)} against AdamW-HSDP at 3e-3, behind its 3e-3 at every "
            f"evaluation ({_loss_at(below, 200):.3f} against {_loss_at(scaled, 200):.3f} at step 200), with a "
            f"training loss over the last 200 steps of {_tail(below):.3f} against {_tail(scaled):.3f}. At the same lr "
            f"of 2.12e-3 the two are {_gap(below, below_base)} apart ({_gap(scaled, base)} at 3e-3)") in PROSE
    assert _tail(below) > _tail(scaled) and _tail(below_base) > _tail(base)


def test_the_lengthened_exchange_s_rounds_at_4_weak_nodes_are_the_json():
    """"Weak scaling": progress_scale="batch" in rounds of 4 and 16 at 4 weak nodes against its rounds of 8, AdamW-HSDP
    and the defaults there, and the margins against the two seeds' spread in rounds of 8."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"
    four, sixteen, eight = (runs[f"flexdemo lr=0.003 {steps}{key}"]
                            for steps in ("local_steps=4 ", "local_steps=16 ", ""))
    defaults, base = (runs[f"{method} lr=0.003 nodes=4 procs_per_node=2 scaling=weak"]
                      for method in ("flexdemo", "adamw"))
    assert [run["flexdemo_config"]["local_steps"] for run in (four, sixteen, eight)] == [4, 16, 8]
    assert _behind_at(four, eight) == _evaluations(eight)[1:] and _behind_at(sixteen, eight) == _evaluations(eight)
    assert all(run["best_eval_loss"] == run["final_eval_loss"] for run in (four, sixteen))
    spread = 100 * abs(runs[f"flexdemo lr=0.003 {key} seed=7"]["final_eval_loss"] / eight["final_eval_loss"] - 1)
    margins = [_percent(run["final_eval_loss"], eight["final_eval_loss"]) for run in (four, sixteen)]
    assert (f"the lengthened exchange in rounds of 4 ends {_gap(four, eight)} above rounds of 8 at twice the bits, and "
            f"in rounds of 16 {_gap(sixteen, eight)} above them at half the bits, so rounds of 8 are its best measured "
            f"length there.** `progress_scale=\"batch\"` at `outer_lr=1` and lr 3e-3 in rounds of 4 (at commit "
            f"{_commit_of('sweep_nodes_weak', four)} from a clean tree, the same grid, AMD EPYC; "
            f"{_bits_sent(four):.3g} bits per parameter and step) ends at {four['final_eval_loss']:.3f}, "
            f"{_gap(four, base)} against AdamW-HSDP at 3e-3: ahead of rounds of 8 only at step 200 "
            f"({_loss_at(four, 200):.3f} against {_loss_at(eight, 200):.3f}) and behind from step 400 on "
            f"({_loss_at(four, 400):.3f} against {_loss_at(eight, 400):.3f}), with a training loss over the last 200 "
            f"steps of {_tail(four):.3f} against {_tail(eight):.3f}. In rounds of 16 ({_bits_sent(sixteen):.3g} bits) "
            f"it ends at {sixteen['final_eval_loss']:.3f}, {_gap(sixteen, base)} against AdamW-HSDP, behind rounds of "
            f"8 at every evaluation ({_loss_at(sixteen, 200):.3f} against {_loss_at(eight, 200):.3f} at step 200), "
            f"with a training loss over the last 200 steps of {_tail(sixteen):.3f} against {_tail(eight):.3f}; that is "
            f"still {_gap(sixteen, defaults)} against the defaults ({_gap(defaults, base)} at "
            f"{_bits_sent(defaults):.3g} bits), a slightly lower loss for half the bits.") in PROSE
    assert (f"One seed each; the two margins are {margins[0] / spread:.1f} and {margins[1] / spread:.1f} times the "
            f"spread of the two seeds in rounds of 8 ({spread:.2f} %).") in PROSE
    assert _commit_of("sweep_nodes_weak", four) == _commit_of("sweep_nodes_weak", sixteen)


def test_the_weak_scaling_gap_along_the_run_is_the_json():
    """"Weak scaling": the gap at every evaluation at 2, 4 and 8 nodes (seed 42, lr 3e-3) is pasted from the grids, and
    the reading quotes it at AdamW-HSDP's loss near 2.0, at the peaks and where AdamW-HSDP flattens."""
    weak, at2 = result("sweep_nodes_weak")["runs"], result("sweep_bits")["runs"]
    lengthened = "`progress_scale=\"batch\"`, `outer_lr=1`"
    # nodes: the table's placement, AdamW-HSDP, and each FlexDeMo run by its row's label
    groups = {2: ("2 × 2", at2["adamw lr=0.003"], {"the defaults (grid `bits`)": at2["flexdemo lr=0.003"]})}
    for nodes, procs in ((4, 2), (8, 1)):
        on = f"nodes={nodes} procs_per_node={procs} scaling=weak"
        groups[nodes] = (f"{nodes} × {procs}", weak[f"adamw lr=0.003 {on}"], {
            "the defaults": weak[f"flexdemo lr=0.003 {on}"],
            lengthened: weak[f"flexdemo lr=0.003 nodes={nodes} outer_lr=1 procs_per_node={procs} "
                             "progress_scale=batch scaling=weak"]})
    lines, defaults, scaled = PAGE.splitlines(), {}, {}
    for nodes, (place, base, runs) in groups.items():
        losses = " | ".join(f"{c['eval_loss']:.3f}" for c in base["curve"][1:])
        assert f"| {place} | AdamW-HSDP, validation loss | {losses} |" in lines
        for label, run in runs.items():
            assert run["knobs"].get("seed", 42) == 42 and _evaluations(run) == list(range(200, 2001, 200))
            gap = _gaps_along(run, base)
            cells = " | ".join(f"{value:+.2f}" for value in gap.values())
            assert f"| {place} | {label}, gap in % | {cells} |" in lines, (place, label)
            (scaled if label == lengthened else defaults)[nodes] = gap
    base2, base4, base8 = (groups[nodes][1] for nodes in (2, 4, 8))
    assert all(abs(_loss_at(base, step) - 2.0) < 0.07 for base, step in ((base2, 2000), (base4, 1000), (base8, 600)))
    assert (f"Where AdamW-HSDP's loss is near 2.0 ({_loss_at(base2, 2000):.3f} at step 2,000 on 2 nodes, "
            f"{_loss_at(base4, 1000):.3f} at step 1,000 on 4, {_loss_at(base8, 600):.3f} at step 600 on 8), the "
            f"defaults are {defaults[2][2000]:+.2f} %, {defaults[4][1000]:+.2f} % and {defaults[8][600]:+.2f} %: the "
            f"gap grows with the number of nodes") in PROSE
    late4 = [scaled[4][step] for step in range(1200, 2001, 200)]
    peak8, peak8_defaults = (max(gap, key=gap.get) for gap in (scaled[8], defaults[8]))
    assert (peak8, peak8_defaults) == (600, 800) and max(defaults[4], key=defaults[4].get) == 2000
    assert _best_step(base8) == 1600
    early8 = [scaled[8][step] for step in range(400, 1001, 200)]
    study = {(row["batch_size"], row["step"]): row["probe_share"] for row in result("length_factor")["rows"]}
    assert (f"as the signal's share of each node's gradient falls ({study[32, 200]:.3f} to {study[32, 800]:.3f} on 32 "
            f"sequences from step 200 to 800, as the study above measures it at the weights). With "
            f"`progress_scale=\"batch\"` it stops growing at 4 nodes ({min(late4):+.2f} % to {max(late4):+.2f} % from "
            f"step 1,200 on, where the defaults go on to {defaults[4][2000]:+.2f} %), and at 8 it peaks at step 600 "
            f"({scaled[8][600]:+.2f} %; the defaults {defaults[8][800]:+.2f} % at step 800). At 8 nodes both gaps "
            f"narrow after their peaks as AdamW-HSDP's loss flattens ({_loss_at(base8, 1000):.3f} at step 1,000, "
            f"{_loss_at(base8, 1600):.3f} at 1,600) and then rises ({_loss_at(base8, 2000):.3f} at step "
            f"2,000)") in PROSE
    assert (f"Before AdamW-HSDP flattens, the lengthened exchange is {min(early8):.2f} to {max(early8):.2f} points "
            f"behind at 8 nodes (steps 400 to 1,000); at 4 nodes, where nothing flattens, it ends "
            f"{scaled[4][2000]:.2f} points behind.") in PROSE
    mean = sum(_lengthened_best_lr_gaps(weak)) / 2
    assert f"and the 8-node {mean:+.2f} % of the mean of two seeds is partly that" in PROSE


def test_the_dense_lengthened_mean_at_4_weak_nodes_is_the_json():
    """"Weak scaling": the lengthened pseudo-gradients' dense float32 mean at 4 weak nodes against the same rounds
    compressed, the defaults and AdamW-HSDP: the compression is not what is left of the gap there."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch {}scaling=weak"
    dense, scaled = runs[key.format("replicator=full ")], runs[key.format("")]
    defaults, base = (runs[f"{method} lr=0.003 nodes=4 procs_per_node=2 scaling=weak"]
                      for method in ("flexdemo", "adamw"))
    config = dense["flexdemo_config"]
    assert config["replicator"] == "full" and config["progress_scale"] == "batch" and config["outer_lr"] == 1.0
    behind = _gaps_along(dense, scaled)
    assert min(behind.values()) > 0 and max(behind, key=behind.get) == 1600
    widening = [behind[step] for step in range(200, 1601, 200)]
    assert widening == sorted(widening)
    assert (f"the dense mean of the lengthened pseudo-gradients is {_gap(dense, base)} against AdamW-HSDP and "
            f"{_gap(dense, scaled)} against the same rounds compressed.** `progress_scale=\"batch\"` at `outer_lr=1` "
            f"with `replicator=\"full\"` (at commit {_commit_of('sweep_nodes_weak', dense)} from a clean tree, the "
            f"same grid, AMD EPYC: the float32 mean of every element by an all-reduce, {_bits_sent(dense):.2f} bits "
            f"per parameter and step, {_bits_sent(dense) / _bits_sent(scaled):.1f} × the compressed exchange's "
            f"{_bits_sent(scaled):.3f}) ends at {dense['final_eval_loss']:.3f}, {_gap(dense, base)} against AdamW-HSDP "
            f"at 3e-3 and {_gap(dense, defaults)} against the defaults. It is behind the compressed exchange at every "
            f"evaluation, by more at each up to step 1,600 ({_loss_at(dense, 200):.3f} against "
            f"{_loss_at(scaled, 200):.3f} at step 200, {_loss_at(dense, 1600):.3f} against "
            f"{_loss_at(scaled, 1600):.3f} at step 1,600), with a training loss over the last 200 steps of "
            f"{_tail(dense):.3f} against {_tail(scaled):.3f}.") in PROSE


def test_progress_scaled_at_8_weak_nodes_between_the_two_lrs_is_the_json():
    """"Weak scaling": progress_scale="batch" at lr 4.24e-3 against itself at 3e-3 and AdamW-HSDP at its best lr, and
    the seeds' spread at 3e-3 that its margin is weighed against."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "nodes=8 outer_lr=1 procs_per_node=1 progress_scale=batch scaling=weak"
    between, scaled, scaled7 = runs[f"flexdemo lr=0.00424 {key}"], runs[f"flexdemo lr=0.003 {key}"], runs[
        f"flexdemo lr=0.003 {key} seed=7"]
    best = _best_adamw(runs, 8)
    assert between["flexdemo_config"]["progress_scale"] == "batch" and between["flexdemo_config"]["outer_lr"] == 1.0
    assert _behind_at(between, scaled) == [400, 600, 800, 1000, 1200] and best["lr"] == 6e-3
    best_at = _best_step(between)
    spread = _percent(scaled7["final_eval_loss"], scaled["final_eval_loss"])
    assert abs(_percent(between["final_eval_loss"], scaled["final_eval_loss"])) < spread
    mean, mean_at_3e3 = (sum(_lengthened_best_lr_gaps(runs, lr)) / 2 for lr in ("0.00424", "0.003"))
    assert (f"4.24e-3 (√2 × 3e-3) is ahead of 3e-3 on both seeds: {mean:+.2f} % against AdamW-HSDP at 6e-3 on the mean "
            f"of two seeds, where 3e-3 is {mean_at_3e3:+.2f} %, and at issue 32's 4 % but not under it.** "
            f"`progress_scale=\"batch\"` at `outer_lr=1` and lr 4.24e-3 (at commit "
            f"{_commit_of('sweep_nodes_weak', between)} from a clean tree, the same grid, AMD EPYC) ends at "
            f"{between['final_eval_loss']:.3f} (best {between['best_eval_loss']:.3f}, at step {best_at:,}), "
            f"{_gap(between, scaled)} against 3e-3 (best losses {_gap(between, scaled, 'best_eval_loss')}) and "
            f"{_gap(between, best)} against AdamW-HSDP at 6e-3 (best losses {_gap(between, best, 'best_eval_loss')}): "
            f"ahead of 3e-3 at step 200 ({_loss_at(between, 200):.3f} against {_loss_at(scaled, 200):.3f}), behind "
            f"from step 400 to 1,200 ({_loss_at(between, 800):.3f} against {_loss_at(scaled, 800):.3f} at step 800) "
            f"and ahead from step 1,400 on ({_loss_at(between, 1600):.3f} against {_loss_at(scaled, 1600):.3f} at step "
            f"1,600), with nearly the same training loss over the last 200 steps ({_tail(between):.3f} against "
            f"{_tail(scaled):.3f}). Its lead comes where AdamW-HSDP has flattened (above), and it is under the spread "
            f"of the two seeds at 3e-3 ({spread:.2f} %, {scaled['final_eval_loss']:.3f} against "
            f"{scaled7['final_eval_loss']:.3f}), so a second seed ran.") in PROSE
    between7, best7 = runs[f"flexdemo lr=0.00424 {key} seed=7"], _best_adamw(runs, 8, 7)
    assert _behind_at(between7, scaled7) == [400, 600, 800, 1000] and best7["lr"] == 6e-3
    gaps, best_gaps = (_lengthened_best_lr_gaps(runs, "0.00424", field) for field in ("final_eval_loss",
                                                                                     "best_eval_loss"))
    assert (f"With seed 7 (at commit {_commit_of('sweep_nodes_weak', between7)}, the same grid) it ends at "
            f"{between7['final_eval_loss']:.3f}, {_gap(between7, scaled7)} against 3e-3 of that seed (best losses "
            f"{_gap(between7, scaled7, 'best_eval_loss')}) and {_gap(between7, best7)} against AdamW-HSDP at 6e-3 of "
            f"the same seed (best losses {_gap(between7, best7, 'best_eval_loss')}): behind 3e-3 from step 400 to "
            f"1,000 and ahead from step 1,200 on, with a training loss over the last 200 steps of "
            f"{_tail(between7):.3f} against {_tail(scaled7):.3f}. So 4.24e-3 is the better of the lengthened "
            f"exchange's measured lrs at 8 weak nodes, and on the mean of two seeds it is {mean:+.2f} % against "
            f"AdamW-HSDP at 6e-3. Three things weigh on that figure: the two seeds' gaps differ by "
            f"{gaps[0] - gaps[1]:.2f} points ({gaps[0]:+.2f} % and {gaps[1]:+.2f} %); on the best losses it is "
            f"{sum(best_gaps) / 2:+.2f} %") in PROSE
    assert f"{_SCALED_SUMMARY} | " in PAGE and f" / {mean:+.2f} % | – |" in PAGE
    fronts = result("frontier")
    assert mean > 4 and any(abs(p["gap_pct"] - mean) < 0.005 for p in fronts["points"]
                            if "lr=0.00424 nodes=8 outer_lr=1" in p["key"])


def test_adamw_hsdp_at_8_weak_nodes_between_its_two_lrs_is_the_json():
    """"Weak scaling": AdamW-HSDP at lr 4.24e-3 against its 6e-3 on 8 weak nodes, both seeds, and the lengthened
    exchange at the same lr against it."""
    runs = result("sweep_nodes_weak")["runs"]
    (between, six), (between7, six7) = ([_weak_adamw(runs, seed, lr) for lr in ("0.00424", "0.006")]
                                        for seed in (42, 7))
    assert _best_adamw(runs, 8) is six and _best_adamw(runs, 8, 7) is six7
    assert _behind_at(between, six) == [200, 1600, 1800, 2000] and _best_step(between) == 1400
    assert _behind_at(between7, six7) == [200, 400, 1600, 1800, 2000] and _best_step(between7) == 1400
    assert all(_tail(run) < _tail(reference) for run, reference in ((between, six), (between7, six7)))
    same_lr, same_lr_best = (_lengthened_best_lr_gaps(runs, "0.00424", field, adamw_lr="0.00424")
                             for field in ("final_eval_loss", "best_eval_loss"))
    mean = _lengthened_headline(runs, 8)  # each method at its best lr
    assert (f"**AdamW-HSDP at 4.24e-3 ends behind 6e-3 on both seeds, by {_gap(between, six)} and "
            f"{_gap(between7, six7)}: 6e-3 stays its best measured lr at 8 weak nodes, and the {mean:+.2f} % above "
            f"stands.** AdamW-HSDP at lr 4.24e-3 (at commit {_commit_of('sweep_nodes_weak', between)} from a clean "
            f"tree, the same grid, AMD EPYC) ends at "
            f"{between['final_eval_loss']:.3f}, {_gap(between, six)} against 6e-3 (best "
            f"{between['best_eval_loss']:.3f} at step 1,400, {_gap(between, six, 'best_eval_loss')} against 6e-3's "
            f"best): ahead of 6e-3 from step 400 to 1,400 ({_loss_at(between, 600):.3f} against "
            f"{_loss_at(six, 600):.3f} at step 600) and behind at step 200 and from step 1,600 on, with a training "
            f"loss over the last 200 steps of {_tail(between):.3f} against {_tail(six):.3f}. With seed 7 (at commit "
            f"{_commit_of('sweep_nodes_weak', between7)}, the same grid) it ends at {between7['final_eval_loss']:.3f}, "
            f"{_gap(between7, six7)} against 6e-3 of that seed (best {between7['best_eval_loss']:.3f} at step 1,400, "
            f"{_gap(between7, six7, 'best_eval_loss')}): ahead of it from step 600 to 1,400 and behind at steps 200 "
            f"and 400 and from step 1,600 on, with a training loss over the last 200 steps of {_tail(between7):.3f} "
            f"against {_tail(six7):.3f}.") in PROSE
    assert (f"At AdamW-HSDP's own lr of 4.24e-3 the lengthened exchange is {same_lr[0]:+.2f} % and {same_lr[1]:+.2f} % "
            f"(best losses {same_lr_best[0]:+.2f} % and {same_lr_best[1]:+.2f} %), {sum(same_lr) / 2:+.2f} % on the "
            f"mean of two seeds; each method at its best measured lr it is {mean:+.2f} %.") in PROSE


def test_8_weak_nodes_over_1000_steps_are_the_json():
    """"Weak scaling": grid nodes_weak_long is one row per run; each method at its best of three lrs over 1,000 steps
    at 8 weak nodes, bracketed, the gap along the run, and the summary row and the README's progress_scale knob."""
    name = "sweep_nodes_weak_long"
    data = result(name)
    runs = data["runs"]
    assert not data["git_dirty"] and not any(i["git_dirty"] for i in data["invocations"])
    adamw, scaled = (sorted((run for run in runs.values() if run["method"] == method and "seed" not in run["knobs"]),
                            key=lambda r: r["lr"]) for method in ("adamw", "flexdemo"))
    base, scaled_best = (min(group, key=lambda r: r["final_eval_loss"]) for group in (adamw, scaled))
    assert [run["lr"] for run in adamw] == [3e-3, 4.24e-3, 6e-3] and base is adamw[1]
    assert [run["lr"] for run in scaled] == [2.12e-3, 3e-3, 4.24e-3] and scaled_best is scaled[1]
    base7, scaled7 = (next(r for r in runs.values() if r["method"] == run["method"] and r["knobs"].get("seed") == 7)
                      for run in (base, scaled_best))
    assert [r["knobs"] for r in (base7, scaled7)] == [{**r["knobs"], "seed": 7} for r in (base, scaled_best)]
    first, lowest, second = (_commit_of(name, run) for run in (adamw[-1], adamw[0], base7))
    assert {_commit_of(name, run) for run in (*adamw[1:], *scaled[1:])} == {first}
    assert {_commit_of(name, run) for run in (adamw[0], scaled[0])} == {lowest} and _commit_of(name, scaled7) == second
    assert len({first, lowest, second}) == 3 and len(runs) == 8
    for run in runs.values():
        knobs = run["knobs"]
        assert run["status"] == "ok" and (knobs["nodes"], knobs["procs_per_node"], knobs["scaling"]) == (8, 1, "weak")
        assert run["curve"][-1]["step"] == _best_step(run) == 1000
        seed = run["training_args"]["seed"]
        assert seed == knobs.get("seed", 42)
        if run["method"] == "adamw":
            label, gap, bits = "AdamW-HSDP (fp32 reduce)", "–", "–"
        else:
            config = run["flexdemo_config"]
            assert (config["progress_scale"], config["outer_lr"], config["local_steps"], config["outer_delay"]) == (
                "batch", 1.0, 8, 1)
            label, bits = '`progress_scale="batch"`, `outer_lr=1`', f"{_bits_sent(run):.3g}"
            gap = _gap(run, base7 if seed == 7 else base)
        assert (f"| {label} | {_written(run['lr'])} | {seed} | {run['final_eval_loss']:.3f} | "
                f"{run['best_eval_loss']:.3f} | {gap} | {bits} |") in PAGE.splitlines()
    batch = base["training_args"]["per_device_train_batch_size"] * 8
    along = _gaps_along(scaled_best, base)
    narrowest, widest = min(along, key=along.get), max(along, key=along.get)
    assert _behind_at(scaled_best, base) == _evaluations(base) and (narrowest, widest) == (200, 1000)
    weak = result("sweep_nodes_weak")["runs"]
    at2000 = _lengthened_headline(weak, 8)
    at4 = _lengthened_headline(weak, 4)
    gap, gap7 = (_percent(run["final_eval_loss"], ref["final_eval_loss"])
                 for run, ref in ((scaled_best, base), (scaled7, base7)))
    mean = (gap + gap7) / 2
    along7 = _gaps_along(scaled7, base7)
    assert _behind_at(scaled7, base7) == _evaluations(base7) and (min(along7, key=along7.get),
                                                                  max(along7, key=along7.get)) == (200, 1000)
    assert mean > at4 > at2000
    assert (f"**Over 1,000 steps at 8 weak nodes, as many passes over the data as 4 weak nodes take in 2,000, the "
            f"lengthened exchange is {mean:+.2f} % behind AdamW-HSDP on the mean of two seeds, each method at its best "
            f"of three lrs: the {at2000:+.2f} % over 2,000 steps comes where AdamW-HSDP runs out of data, and where it "
            f"does not the 8-node gap is larger than the 4-node one ({at4:+.2f} %).** `python benchmarks/sweep.py "
            f"nodes_weak_long` (`benchmarks/results/sweep_nodes_weak_long.json`, each run with the commit it ran at, "
            f"from clean trees, AMD EPYC: {first}, {lowest} for each method's lowest lr and {second} for seed 7) runs "
            f"the 8 × 1 weak-scaling topology over 1,000 steps (`convergence.py --long`: "
            f"{base['training_args']['warmup_steps']} warm-up steps, linear decay, an evaluation every "
            f"{base['curve'][1]['step']} steps): {batch * 1000:,} sequences, {batch * 1000 / 29_000:.1f} passes over "
            f"the data.") in PROSE
    assert f"| vs AdamW-HSDP at {_written(base['lr'])} of the same seed, final |" in PAGE
    assert (f"Each method's best lr lies between two it beats: AdamW-HSDP is best at {_written(base['lr'])}, with "
            f"{_written(adamw[0]['lr'])} {_gap(adamw[0], base)} and {_written(adamw[2]['lr'])} {_gap(adamw[2], base)} "
            f"above it, and the lengthened exchange at {_written(scaled_best['lr'])}, with "
            f"{_written(scaled[2]['lr'])} {_gap(scaled[2], scaled_best)} and {_written(scaled[0]['lr'])} "
            f"{_gap(scaled[0], scaled_best)} above it. At {_written(scaled_best['lr'])} it is behind AdamW-HSDP at "
            f"{_written(base['lr'])} at every evaluation: {along[100]:+.2f} % at step 100, {along[200]:+.2f} % at "
            f"step 200 (its narrowest) and {along[1000]:+.2f} % at step 1,000 (its widest), with a training loss over "
            f"the last 200 steps of {_tail(scaled_best):.3f} against {_tail(base):.3f}, so the gap is optimisation "
            f"speed, as at 4 nodes. At the same lr of {_written(base['lr'])} it is {_gap(scaled[2], base)}. With seed "
            f"7 AdamW-HSDP ends at {base7['final_eval_loss']:.3f} and the lengthened exchange at "
            f"{scaled7['final_eval_loss']:.3f}, {gap7:+.2f} %, again behind at every evaluation, narrowest at step 200 "
            f"({along7[200]:+.2f} %) and widest at step 1,000. On the mean of two seeds, {abs(gap - gap7):.2f} points "
            f"apart, the gap is {mean:+.2f} %: where the data do not run out, issue 32's ≤ 4 % at 8 weak nodes is "
            f"missed by {mean - 4:.2f} points") in PROSE
    assert f"{_SCALED_SUMMARY} | " in PAGE and (
        "| the same at 8 weak nodes over 1,000 steps (8.8 passes over the data, as 4 nodes over 2,000: AdamW-HSDP does "
        f"not flatten), each method at its best of three lrs, mean of two seeds ([\"Weak scaling\"]"
        f"(#weak-scaling-each-node-keeps-its-batch)) | {mean:+.2f} % | – |") in PAGE
    assert f"at lr 4.24e-3 {at2000:+.2f} %, but {mean:+.2f} % over 1,000 steps, before the data run out)" in README


def test_adamw_hsdp_at_8_weak_nodes_a_step_above_its_best_is_the_json():
    """"Weak scaling": AdamW-HSDP at lr 8.49e-3 against its 6e-3 on 8 weak nodes, and the final losses of its lrs in
    steps of sqrt(2) from 3e-3 to 1.2e-2."""
    runs = result("sweep_nodes_weak")["runs"]
    grid = [_weak_adamw(runs, lr=lr) for lr in ("0.003", "0.00424", "0.006", "0.00849", "0.012")]
    above, six = grid[3], grid[2]
    assert _best_adamw(runs, 8) is six and _best_step(above) == 1600
    assert _behind_at(above, six) == _evaluations(six)
    assert [b["lr"] / a["lr"] for a, b in zip(grid, grid[1:])] == pytest.approx([2 ** 0.5] * 4, rel=1e-3)
    finals = ", ".join(f"{run['final_eval_loss']:.3f}" for run in grid[:-1])
    assert (f"**At 8.49e-3, the √2 step above 6e-3, AdamW-HSDP ends {_gap(above, six)} behind it: on a grid of √2 "
            f"steps from 3e-3 to 1.2e-2, 6e-3 is AdamW-HSDP's best lr at 8 weak nodes.** AdamW-HSDP at lr 8.49e-3 (at "
            f"commit {_commit_of('sweep_nodes_weak', above)} from a clean tree, the same grid, AMD EPYC) ends at "
            f"{above['final_eval_loss']:.3f} (best {above['best_eval_loss']:.3f} at step 1,600, "
            f"{_gap(above, six, 'best_eval_loss')} against 6e-3's best), behind 6e-3 at every evaluation "
            f"({_loss_at(above, 200):.3f} against {_loss_at(six, 200):.3f} at step 200, {_loss_at(above, 600):.3f} "
            f"against {_loss_at(six, 600):.3f} at step 600), with a training loss over the last 200 steps of "
            f"{_tail(above):.3f} against {_tail(six):.3f}: the longer step trains slower, not only generalises worse. "
            f"So AdamW-HSDP's final losses on seed 42 from 3e-3 to 1.2e-2 in steps of √2 are {finals} and "
            f"{grid[-1]['final_eval_loss']:.3f}, and the gaps with each method at its best lr "
            f"({_two_seeds_best_lr_gap(runs):+.2f} % for the defaults, "
            f"{_lengthened_headline(runs, 8):+.2f} % for the lengthened exchange) are against the "
            f"best of them (on seed 7, of 4.24e-3 and 6e-3). One seed.") in PROSE
    assert {r["lr"] for r in runs.values() if r["method"] == "adamw" and r["knobs"]["nodes"] == 8
            and r["knobs"].get("seed") == 7} == {4.24e-3, 6e-3}


def test_progress_scaled_to_the_nodes_batch_at_2_nodes_is_the_json():
    """"Bits at 2 nodes": progress_scale="batch" against the defaults of the same seed and landing."""
    data = result("sweep_bits")
    runs = data["runs"]
    scaled, defaults, base = (runs[key] for key in ("flexdemo lr=0.003 outer_delay=2 progress_scale=batch",
                                                    "flexdemo lr=0.003 outer_delay=2", "adamw lr=0.003"))
    invocation = data["invocations"][scaled["invocation"]]
    assert invocation["machine"]["cpu_model"] == "AMD EPYC" and not invocation["git_dirty"]
    assert scaled["flexdemo_config"]["outer_delay"] == defaults["flexdemo_config"]["outer_delay"] == 2
    assert scaled["flexdemo_config"]["outer_lr"] == 1.0 and scaled["flexdemo_config"]["progress_scale"] == "batch"
    assert _behind_at(scaled, defaults) == _evaluations(scaled)[1:]
    assert (f"`progress_scale=\"batch\"` (at commit {invocation['git_commit'][:7]} from a clean tree, the same grid, "
            f"landing after two steps as the defaults do;") in PROSE
    assert (f"It ends at {scaled['final_eval_loss']:.3f}, {_gap(scaled, base)} against AdamW-HSDP and "
            f"{_gap(scaled, defaults)} against the defaults of the same seed ({defaults['final_eval_loss']:.3f}), "
            f"ahead of them at step 200 ({_loss_at(scaled, 200):.3f} against {_loss_at(defaults, 200):.3f}) and "
            f"behind from step 400 on, with a training loss over the last 200 steps of {_tail(scaled):.3f} against "
            f"{_tail(defaults):.3f}: one seed") in PROSE
    uniform = result("sweep_bits_outer")["runs"]["flexdemo lr=0.003 outer_lr=1.41"]
    assert f"(`outer_lr=1.41`, {_gap(uniform, base)})" in PROSE


def test_the_weak_scaling_lr_bracket_and_rounds_of_4_are_the_json():
    """"Weak scaling": AdamW-HSDP one lr step past its best at 8 nodes and at 4, the defaults' at 4, and rounds of 4 at
    8 nodes, as the page quotes them against the runs they are read against."""
    data = result("sweep_nodes_weak")
    runs = data["runs"]
    defaults, base, best, higher, four = (runs[f"{run} nodes=8 procs_per_node=1 scaling=weak"] for run in (
        "flexdemo lr=0.003", "adamw lr=0.003", "adamw lr=0.006", "adamw lr=0.012", "flexdemo lr=0.003 local_steps=4"))
    defaults4, base4, high4, fell4 = (runs[f"{run} nodes=4 procs_per_node=2 scaling=weak"] for run in (
        "flexdemo lr=0.003", "adamw lr=0.003", "adamw lr=0.006", "flexdemo lr=0.006"))
    higher_at, four_at, high4_at, fell4_at = (data["invocations"][r["invocation"]]
                                              for r in (higher, four, high4, fell4))
    assert all(not i["git_dirty"] and i["machine"]["cpu_model"].startswith("AMD EPYC")
               for i in (higher_at, four_at, high4_at, fell4_at))

    assert (f"at 1.2e-2 (at commit {higher_at['git_commit'][:7]}, on the AMD EPYC), AdamW-HSDP ends at "
            f"{higher['final_eval_loss']:.3f}, {_gap(higher, best)} against its 6e-3 and behind it at every "
            f"evaluation ({_loss_at(higher, 200):.3f} against {_loss_at(best, 200):.3f} at step 200)") in PROSE
    assert _behind_at(higher, best) == _evaluations(best)

    assert _best_adamw(runs, 4) is base4
    assert (f"AdamW-HSDP at 6e-3 (at commit {high4_at['git_commit'][:7]}, on the AMD EPYC) ends at "
            f"{high4['final_eval_loss']:.3f}, {_gap(high4, base4)} against its 3e-3, ahead only at step 200 "
            f"({_loss_at(high4, 200):.3f} against {_loss_at(base4, 200):.3f}) and behind from step 400 on "
            f"({_loss_at(high4, 400):.3f} against {_loss_at(base4, 400):.3f}), with a training loss over the last "
            f"200 steps of {_tail(high4):.3f} against {_tail(base4):.3f}") in PROSE
    assert _behind_at(high4, base4) == _evaluations(base4)[1:] and _behind_at(base4, high4) == [200]
    assert f"there the gap of {_gap(defaults4, base4)} is each at its best" in PROSE
    assert (f"The defaults at 6e-3 (at commit {fell4_at['git_commit'][:7]}, on the AMD EPYC) end at "
            f"{fell4['final_eval_loss']:.3f}, {_gap(fell4, defaults4)} against their 3e-3, ahead only at step 200 "
            f"({_loss_at(fell4, 200):.3f} against {_loss_at(defaults4, 200):.3f}) and behind from step 400 on "
            f"({_loss_at(fell4, 400):.3f} against {_loss_at(defaults4, 400):.3f}), with a training loss over the last "
            f"200 steps of {_tail(fell4):.3f} against {_tail(defaults4):.3f}: as at 2 and 8 nodes, 3e-3 is their best "
            f"measured lr") in PROSE
    assert _behind_at(fell4, defaults4) == _evaluations(defaults4)[1:] and _behind_at(defaults4, fell4) == [200]

    bits, bits4 = _bits_sent(defaults), _bits_sent(four)
    assert four["flexdemo_config"]["outer_lr"] == 2.0 and round(bits4 / bits, 1) == 2.0
    assert (f"Rounds of 4 (`local_steps=4`, at commit {four_at['git_commit'][:7]}, the same grid: {bits4:.2f} bits "
            f"per parameter and step, twice the defaults') at the default outer step end at "
            f"{four['final_eval_loss']:.3f}, {_gap(four, defaults)} against the defaults' rounds of 8 and "
            f"{_gap(four, base)} against AdamW-HSDP at 3e-3: ahead of the defaults at steps 200 and 400 "
            f"({_loss_at(four, 400):.3f} against {_loss_at(defaults, 400):.3f} at step 400) and behind from step 600 "
            f"on ({_loss_at(four, 600):.3f} against {_loss_at(defaults, 600):.3f}), with a lower training loss over "
            f"the last 200 steps ({_tail(four):.3f} against {_tail(defaults):.3f})") in PROSE
    assert _behind_at(four, defaults) == _evaluations(defaults)[2:] and _tail(four) < _tail(defaults)


def test_the_weak_scaling_rounds_of_16_are_the_json():
    """"Weak scaling": rounds of 16 at 8 nodes against the defaults' rounds of 8 and AdamW-HSDP at both lrs, the same
    halving's cost at 2 nodes (grid bits, two seeds, both landing after one step) and at 8 strong nodes."""
    data = result("sweep_nodes_weak")
    runs = data["runs"]
    defaults, base, best = _weak_defaults(runs), *(_weak_adamw(runs, lr=lr) for lr in ("0.003", "0.006"))
    sixteen = runs["flexdemo lr=0.003 local_steps=16 nodes=8 procs_per_node=1 scaling=weak"]
    invocation = data["invocations"][sixteen["invocation"]]
    assert invocation["machine"]["cpu_model"] == "AMD EPYC" and not invocation["git_dirty"]
    bits, bits8 = _bits_sent(sixteen), _bits_sent(defaults)
    assert sixteen["bytes_sent"]["bits_per_param_received"] == bits and round(bits8 / bits, 1) == 2.0
    margin = _percent(sixteen["final_eval_loss"], defaults["final_eval_loss"])
    gaps = {seed: _best_lr_gap(runs, seed) for seed in (42, 7)}
    assert margin < abs(gaps[42] - gaps[7])
    lag = {c["step"]: c["eval_loss"] - ref["eval_loss"] for c, ref in zip(sixteen["curve"][1:], defaults["curve"][1:])}
    assert min(lag.values()) > 0 and max(lag, key=lag.get) == 400 and min(lag, key=lag.get) == 1800
    two = result("sweep_bits")["runs"]
    cost2 = _mean_gap(two, "flexdemo lr=0.003 local_steps=16") - _mean_gap(two, "flexdemo lr=0.003")
    landed = [r["flexdemo_config"]["outer_delay"] for r in (sixteen, defaults, *(
        two[f"flexdemo lr=0.003{knob}{seed}"] for knob in ("", " local_steps=16") for seed in ("", " seed=7")))]
    assert landed == [1] * 6
    assert (f"Rounds of 16 (`local_steps=16`, at commit {invocation['git_commit'][:7]}, the same grid: {bits:.3f} bits "
            f"per parameter and step sent, and as many received, half the defaults' {bits8:.2f}) at the default outer "
            f"step end at {sixteen['final_eval_loss']:.3f}, {margin:+.2f} % against the defaults' rounds of 8 and "
            f"{_gap(sixteen, base)} against AdamW-HSDP at 3e-3 ({_gap(sixteen, best)} against its best lr, 6e-3, where "
            f"the defaults are {gaps[42]:+.2f} % on this seed): behind the defaults at every evaluation, most at step "
            f"400 ({_loss_at(sixteen, 400):.3f} against {_loss_at(defaults, 400):.3f}) and least at 1,800 "
            f"({_loss_at(sixteen, 1800):.3f} against {_loss_at(defaults, 1800):.3f}), with a training loss over the "
            f"last 200 steps of {_tail(sixteen):.3f} against {_tail(defaults):.3f}. At 2 nodes the same halving costs "
            f"{cost2:.2f} points on the mean of two seeds "
            f"({_mean_gap(two, 'flexdemo lr=0.003 local_steps=16'):+.2f} % against "
            f"{_mean_gap(two, 'flexdemo lr=0.003'):+.2f} %") in PROSE
    assert (f"The margin ({margin:.2f} points) is inside the seeds' spread of the defaults' gap "
            f"({abs(gaps[42] - gaps[7]):.2f} points)") in PROSE
    sixteen7, defaults7, best7 = (runs[key + " seed=7"] for key in (
        "flexdemo lr=0.003 local_steps=16 nodes=8 procs_per_node=1 scaling=weak",
        "flexdemo lr=0.003 nodes=8 procs_per_node=1 scaling=weak",
        "adamw lr=0.006 nodes=8 procs_per_node=1 scaling=weak"))
    at7 = data["invocations"][sixteen7["invocation"]]
    assert at7["machine"]["cpu_model"] == "AMD EPYC" and not at7["git_dirty"] and _bits_sent(sixteen7) == bits
    assert _behind_at(sixteen7, defaults7) == _evaluations(sixteen7)
    margin7 = _percent(sixteen7["final_eval_loss"], defaults7["final_eval_loss"])
    gap16 = 50 * (sixteen["final_eval_loss"] / best["final_eval_loss"] + sixteen7["final_eval_loss"] / best7[
        "final_eval_loss"] - 2)
    assert (f"With seed 7 (at commit {at7['git_commit'][:7]}, the same grid) rounds of 16 end at "
            f"{sixteen7['final_eval_loss']:.3f}, {margin7:+.2f} % against the defaults' rounds of 8 of that seed and "
            f"{_gap(sixteen7, best7)} against AdamW-HSDP at 6e-3 (the defaults: {gaps[7]:+.2f} %), behind the defaults "
            f"at every evaluation ({_loss_at(sixteen7, 200):.3f} against {_loss_at(defaults7, 200):.3f} at step 200): "
            f"on the mean of two seeds they cost {(margin + margin7) / 2:.2f} points, {gap16:+.2f} % against "
            f"AdamW-HSDP at its best lr where the defaults are {_two_seeds_best_lr_gap(runs):+.2f} %.") in PROSE
    assert "**Rounds of 16 halve the bits for under a point at 8 weak nodes (two seeds)" in PROSE
    assert (margin + margin7) / 2 < 1

    strong = result("sweep_nodes_outer")
    sixteen, rule = (strong["runs"][f"flexdemo lr=0.003 {knob}nodes=8 outer_lr=2 procs_per_node=1 scaling=strong"]
                     for knob in ("local_steps=16 ", ""))
    at = strong["invocations"][sixteen["invocation"]]
    assert at["machine"]["cpu_model"] == "AMD EPYC" and not at["git_dirty"] and _bits_sent(sixteen) == bits
    adamw = _strong_adamw(8)
    behind = list(_gaps_along(sixteen, rule).values())
    assert behind == sorted(behind) and behind[0] > 0
    assert (f"(grid `nodes_outer`, at commit {at['git_commit'][:7]}, [above](#loss-against-the-number-of-nodes)), "
            f"rounds of 16 at the rule's outer step end at {sixteen['final_eval_loss']:.3f}, {_gap(sixteen, rule)} "
            f"against the rule's rounds of 8 and {_gap(sixteen, adamw)} against AdamW-HSDP, behind at every evaluation "
            f"and by more at each ({behind[0]:+.2f} % at step 200, {_loss_at(sixteen, 200):.3f} against "
            f"{_loss_at(rule, 200):.3f}), with a training loss over the last 200 steps of {_tail(sixteen):.3f} against "
            f"{_tail(rule):.3f}") in PROSE


def test_the_fronts_are_the_json():
    """"Loss against bits": each front's runs, by bits, with their gaps, as frontier.py wrote them."""
    data = result("frontier")
    points = {p["key"]: p for p in data["points"]}
    assert len(points) == len(data["points"]) and not data["git_dirty"]
    assert f"`frontier.png`, at commit {data['git_commit'][:7]} from a clean tree)" in PROSE
    fronts = "; ".join(f"{curve}: " + ", ".join(f"{points[k]['bits_sent']:.3g} bits at {points[k]['gap_pct']:+.2f} %"
                                                for k in sorted(keys, key=lambda k: points[k]["bits_sent"]))
                       for curve, keys in data["fronts"].items())
    assert f"The fronts (two seeds where a setting has them, at the mean of their gaps): {fronts}." in PROSE
    field = min(data["points"], key=lambda p: p["bits_sent"])
    assert "local_steps=30" in field["key"] and "compression_chunk=64" in field["key"]
    assert (f"the field's point, run here, sends {field['bits_sent']:.3g} bits per parameter and step at "
            f"{field['gap_pct']:+.2f} %") in PROSE


def test_the_node_fault_costs_are_the_json():
    """docs/faults.md, "A node that dies and comes back": the restarts' table (the watcher's steps lost equal the
    trainer's own record), the loss and wall-clock cost against the job without faults, a checkpoint's stall."""
    data, page = result("elastic_restart"), (ROOT / "docs" / "faults.md").read_text()
    prose = " ".join(page.split())
    runs, summary = data["runs"], data["summary"]
    faults, straight, bare = runs["faults"], runs["straight"], runs["no_checkpoints"]
    assert f"at commit {data['git_commit'][:7]} from a clean tree" in prose and not data["git_dirty"]
    restarts, changes = faults["timeline"]["restarts"], faults["topology_changes"]
    assert len(restarts) == 2 and [c["steps_lost"] for c in changes] == [r["steps_lost"] for r in restarts]
    for name, restart, change in zip(("node B killed", "a node joins"), restarts, changes):
        (a, b), (c, d) = change["saved"], change["now"]
        assert (f"| {name} | {restart['last_step_before']} | checkpoint-{restart['resumed_from']} | {a} × {b} → "
                f"{c} × {d} | {restart['steps_lost']} | {restart['downtime_s']:.1f} s | {restart['cost_s']:.1f} s |"
                in page.splitlines())
    assert f"the median step ({faults['timeline']['median_step_s']:.3f} s)" in prose
    assert (f"took {summary['wall_clock_cost_s']:.1f} s longer than the same job without faults "
            f"({faults['train_seconds']:.1f} s of training against {straight['train_seconds']:.1f} s)") in prose
    loss = summary["final_eval_loss"]
    assert (f"is {loss['faults']:.3f} against {loss['straight']:.3f}, "
            f"+{summary['faults_gap_pct_vs_straight']:.2f} %") in prose
    assert loss["straight"] == loss["no_checkpoints"]
    stall, step = straight["timeline"]["checkpoint_stall_s"], straight["timeline"]["median_step_s"]
    sync = runs["sync_save"]["timeline"]
    assert summary["checkpoint_stall_s"] == {"straight": stall, "sync_save": sync["checkpoint_stall_s"]}
    assert (f"**A checkpoint stalls the run for {stall:.3f} s with the optimizer state written in the background "
            f"(the default, `async_save`), against {sync['checkpoint_stall_s']:.3f} s written before the next step**"
            ) in prose
    assert f"({straight['timeline']['checkpoints_timed']} checkpoints timed in each;" in prose
    assert straight["timeline"]["checkpoints_timed"] == sync["checkpoints_timed"]
    assert (f"Every 40 steps that is {100 * stall / 40 / step:.1f} % of the step time, every 200 steps "
            f"{100 * stall / 200 / step:.1f} %") in prose
    assert loss["sync_save"] == loss["straight"]
    assert (f"the job with checkpoints took {summary['checkpoint_overhead_pct']:.1f} % longer than the one without "
            f"({straight['train_seconds']:.1f} s against {bare['train_seconds']:.1f} s)") in prose
    medians = [f"{r['timeline']['median_step_s']:.3f}" for r in (straight, runs["sync_save"])]
    assert f"median steps differ by 8 % ({medians[0]} and {medians[1]} s)" in prose


def test_the_compute_only_reference_run_is_the_json():
    data = result("bandwidth_reference")
    at = {t["link_mbit"]: t["variants"]["flexdemo"] for t in data["targets"].values()}
    assert (f"**{at[10.0]['value']:.2f} ± {at[10.0]['error']:.2f} × the limit at 10 Mbit/s and "
            f"{at[100.0]['value']:.2f} ± {at[100.0]['error']:.2f} × at 100 Mbit/s**") in PROSE
    assert f"at commit {data['git_commit'][:7]} from a clean tree" in PROSE and not data["git_dirty"]


def test_the_headline_node_scaling_gaps_are_the_json():
    """The README's and the summary's 2-, 4- and 8-node gaps at 2,000 steps: the outer step of the default
    (sqrt(R / 2)) against AdamW-HSDP on the same nodes and seed, at 8 nodes the mean of two seeds."""
    outer_sweep = result("sweep_nodes_outer")
    runs = {**result("sweep_nodes")["runs"], **outer_sweep["runs"]}
    gaps = []
    for nodes, procs, outer, seeds in ((4, 2, "1.41", [""]), (8, 1, "2", ["", " seed=7"])):
        where = f"nodes={nodes} procs_per_node={procs} scaling=strong"
        each = [runs[f"flexdemo lr=0.003 nodes={nodes} outer_lr={outer} procs_per_node={procs} scaling=strong{seed}"]
                ["final_eval_loss"] / runs[f"adamw lr=0.003 {where}{seed}"]["final_eval_loss"] for seed in seeds]
        gaps.append(_percent(sum(each), len(each)))
    cell = f"+{gaps[0]:.2f} % / +{gaps[1]:.2f} % | – |"
    two = _mean_gap(result("sweep_bits")["runs"], "flexdemo lr=0.003 outer_delay=2")  # the defaults now
    assert f"| {cell}" in PAGE and f"| +{two:.2f} % | – |" in PAGE
    assert f"| +{two:.2f} % / {cell}" in README
    seven, base7 = (runs[f"{method} lr=0.003 nodes=8{outer} procs_per_node=1 scaling=strong seed=7"]
                    for method, outer in (("flexdemo", " outer_lr=2"), ("adamw", "")))
    base42 = runs["adamw lr=0.003 nodes=8 procs_per_node=1 scaling=strong"]
    invocation = outer_sweep["invocations"][seven["invocation"]]
    assert not invocation["git_dirty"] and invocation["git_commit"] == outer_sweep["invocations"][
        base7["invocation"]]["git_commit"]
    assert (f"**At 8 nodes the rule's step is +{gaps[1]:.2f} % on the mean of two seeds**: with seed 7 (at commit "
            f"{invocation['git_commit'][:7]}) it is {_gap(seven, base7)} against AdamW-HSDP of the same seed, behind "
            f"it at every evaluation ({_loss_at(seven, 200):.3f} against {_loss_at(base7, 200):.3f} at step 200), "
            f"where AdamW-HSDP itself moved {_gap(base7, base42)} between the seeds ({base42['final_eval_loss']:.3f} "
            f"and {base7['final_eval_loss']:.3f})") in PROSE
    assert _behind_at(seven, base7) == _evaluations(base7)


MODEL_SIZE = ("d_model", "d_ff", "num_layers")  # grid sizes' run flags; absent: the quick model


def _same_start(run: dict) -> tuple:
    """What a run's AdamW-HSDP reference shares with it: the learning rate, the seed and the model's size."""
    return (run["lr"], *(run["knobs"].get(flag) for flag in ("seed", *MODEL_SIZE)))


def _seed_gaps(runs: dict, key: str) -> list[float]:
    """Run ``key``'s final gap (%) against the AdamW-HSDP run of its lr, seed and model, with seeds 42 and 7."""
    adamw = {_same_start(r): r["final_eval_loss"] for r in runs.values() if r["method"] == "adamw"}
    return [_percent(runs[f"{key}{tail}"]["final_eval_loss"], adamw[_same_start(runs[f"{key}{tail}"])])
            for tail in ("", " seed=7")]


def _mean_gap(runs: dict, key: str) -> float:
    """The mean over seeds 42 and 7 of run ``key``'s final gap against the AdamW-HSDP run of its seed."""
    return sum(_seed_gaps(runs, key)) / 2


def test_the_headline_short_run_gaps_are_the_json():
    """The README's and the summary's gap at 300 steps: the defaults (rounds of 4 under 1,000 steps), rounds of 8
    landing two steps after the start (the default before), and landing after one step, on the same machine."""
    runs = result("sweep_outer_delay")["runs"]
    now = _mean_gap(runs, "flexdemo lr=0.003 local_steps=4")
    rounds_of_8, before = _mean_gap(runs, "flexdemo lr=0.003 outer_delay=2"), _mean_gap(runs, "flexdemo lr=0.003")
    assert f"| +{now:.2f} % | – |" in PAGE and f"(mean of two seeds) | +{now:.2f} % | – |" in README
    assert f"| +{rounds_of_8:.2f} % | – |" in PAGE
    assert f"| +{before:.2f} % / " in PAGE  # then the Xeon's, checked in test_docs.py


def test_the_flat_exchange_row_is_the_json():
    """"Received bytes flat in the number of nodes": each run of grid nodes_leader, its gap against AdamW-HSDP on the
    same nodes (grid nodes) and a node's bits per parameter and step."""
    data = result("sweep_nodes_leader")
    adamw = result("sweep_nodes")["runs"]
    assert f"at commit\n{data['git_commit'][:7]} from a clean tree" in PAGE and not data["git_dirty"]
    for key, run in data["runs"].items():
        nodes, procs = run["knobs"]["nodes"], run["knobs"]["procs_per_node"]
        reference = adamw[f"adamw lr=0.003 nodes={nodes} procs_per_node={procs} scaling=strong"]["final_eval_loss"]
        gap = _percent(run["final_eval_loss"], reference)
        bits = _bits_sent(run)
        cells = f"| {run['final_eval_loss']:.3f} | {gap:+.2f} % | {bits:.3g} |"
        assert sum(line.startswith(f"| {nodes} × {procs} | `replicator=\"leader\"`") and line.endswith(cells)
                   for line in PAGE.splitlines()) == 1, key
    leader = data["runs"]["flexdemo lr=0.003 nodes=8 procs_per_node=1 replicator=leader scaling=strong"]
    all_gather = result("sweep_nodes_outer")["runs"]["flexdemo lr=0.003 nodes=8 outer_lr=2 procs_per_node=1 "
                                                      "scaling=strong seed=7"]
    assert (f"sends and receives {_bits_sent(leader):.3g} bits per parameter and step against the all-gather's "
            f"{_bits_sent(all_gather):.3g}") in PROSE


OWNER_FILES = {"sweep_nodes_owner_lagged": "a round late", "sweep_nodes_owner": "leaning on its own share"}


def _strong_adamw(nodes: int, seed: int = 42) -> dict:
    """AdamW-HSDP at 3e-3 on ``nodes`` nodes with the global batch fixed: grid nodes at 8 x 1 and 4 x 2, grid
    nodes_outer at 8 x 1 with seed 7, grid bits at 2 x 2 with either seed."""
    at = "" if seed == 42 else f" seed={seed}"
    if nodes == 2:
        return result("sweep_bits")["runs"]["adamw lr=0.003" + at]
    grid = "sweep_nodes" if seed == 42 else "sweep_nodes_outer"
    return result(grid)["runs"][f"adamw lr=0.003 nodes={nodes} procs_per_node={8 // nodes} scaling=strong{at}"]


def _owner_gaps(name: str) -> dict[str, tuple[dict, float]]:
    """Each run of one grid nodes_owner file and its gap against AdamW-HSDP on the same nodes and seed
    (:func:`_strong_adamw`)."""
    def gap(run: dict) -> float:
        reference = _strong_adamw(run["knobs"].get("nodes", 2), run["knobs"].get("seed", 42))
        return _percent(run["final_eval_loss"], reference["final_eval_loss"])

    return {key: (run, gap(run)) for key, run in result(name)["runs"].items()}


def test_the_owner_rows_are_the_json():
    """"Received bytes flat in the number of nodes": each run of grid nodes_owner, a round late and leaning on its
    own share, is one row (its final loss, its gap, a node's bits sent and received), and the prose quotes the same
    figures and the clean commits the runs were at."""
    owner8, owner2 = ("flexdemo lr=0.003 nodes=8 procs_per_node=1 replicator=owner scaling=strong",
                      "flexdemo lr=0.003 replicator=owner scaling=strong")
    owner8_lr1 = "flexdemo lr=0.003 nodes=8 outer_lr=1 procs_per_node=1 replicator=owner scaling=strong"
    exact8 = ("flexdemo lr=0.003 compression_rate=1 nodes=8 procs_per_node=1 replicator=owner scaling=strong "
              "value_dtype=float32")
    gaps = {}
    for name, how in OWNER_FILES.items():
        data = result(name)
        assert all(not invocation["git_dirty"] for invocation in data["invocations"])
        assert all(invocation["git_commit"][:7] in PROSE for invocation in data["invocations"])
        gaps[name] = _owner_gaps(name)
        for run, gap in gaps[name].values():
            knobs, sent = run["knobs"], run["bytes_sent"]
            exact = " (rate 1, float32)" if knobs.get("value_dtype") == "float32" else ""
            exact += f" at `outer_lr={knobs['outer_lr']:g}`" if "outer_lr" in knobs else ""
            label = ("the dense mean at once" if knobs["replicator"] == "full" else how) + (
                f", seed {knobs['seed']}" if "seed" in knobs else "")
            row = (f"| {knobs.get('nodes', 2)} × {knobs.get('procs_per_node', 2)} | "
                   f"`replicator=\"{knobs['replicator']}\"`{exact}, {label} | {run['final_eval_loss']:.3f} | "
                   f"{gap:+.2f} % | {sent['bits_per_param_sent']:.3g}, {sent['bits_per_param_received']:.3g} |")
            assert PAGE.splitlines().count(row) == 1, row
    lagged, lean = gaps["sweep_nodes_owner_lagged"], gaps["sweep_nodes_owner"]
    bits8, bits2 = (lean[key][0]["bytes_sent"]["bits_per_param_received"] for key in (owner8, owner2))
    full8 = lagged["flexdemo lr=0.003 nodes=8 procs_per_node=1 replicator=full scaling=strong"][1]
    all_gather = result("sweep_nodes_outer")["runs"]["flexdemo lr=0.003 nodes=8 outer_lr=2 procs_per_node=1 "
                                                      "scaling=strong seed=7"]["bytes_sent"]["bits_per_param_received"]
    phrases = (f"sends and receives {bits8:.3g} bits per parameter and step, {bits8 / bits2:.2f} × its {bits2:.3g}",
               f"all-gather: {all_gather:.3g}, {all_gather / bits2:.0f} ×)",
               f"the loss was {lagged[owner8][1]:+.2f} % at 8 nodes and {lagged[owner2][1]:+.2f} % at 2",
               f"the replicas reach {lean[owner8][1]:+.2f} % and {lean[owner2][1]:+.2f} %",
               f"is {lagged[exact8][1]:+.2f} % a round late and {lean[exact8][1]:+.2f} % leaning, against "
               f"{full8:+.2f} % for the dense mean",
               f"the owner reaches {lean[owner8_lr1][1]:+.2f} % at 8 nodes, against {lean[owner8][1]:+.2f} % at the "
               "default 2")
    for phrase in phrases:
        assert phrase in PROSE, phrase


def test_the_owner_at_4_nodes_and_its_second_seed_are_the_json():
    """"Received bytes flat in the number of nodes": the owner at 4 nodes against the all-gather there (bits, the
    doctor's estimate of them, loss at every evaluation), and its second seeds at 8 and 2 nodes against the
    all-gather's."""
    from hf_flexdemo.wire.estimate import payload_bits_per_param

    lean = _owner_gaps("sweep_nodes_owner")
    prefix = "flexdemo lr=0.003 nodes={} {}procs_per_node={} replicator=owner scaling=strong"
    (owner4, gap4) = lean[prefix.format(4, "", 2)]
    owner2 = lean["flexdemo lr=0.003 replicator=owner scaling=strong"][0]
    (_, gap8), (owner7, gap7) = (lean[prefix.format(8, "outer_lr=1 ", 1) + seed] for seed in ("", " seed=7"))
    assert owner4["flexdemo_config"]["outer_lr"] == owner7["flexdemo_config"]["outer_lr"] == 1.0
    outer = result("sweep_nodes_outer")["runs"]
    all_gather4 = outer["flexdemo lr=0.003 nodes=4 outer_lr=1.41 procs_per_node=2 scaling=strong"]
    all_gather8, all_gather7 = (
        _percent(outer[f"flexdemo lr=0.003 nodes=8 outer_lr=2 procs_per_node=1 scaling=strong{at}"]["final_eval_loss"],
                 _strong_adamw(8, seed)["final_eval_loss"]) for at, seed in (("", 42), (" seed=7", 7)))
    bits4, bits2, gather4 = (_bits_sent(run) for run in (owner4, owner2, all_gather4))
    estimate = payload_bits_per_param(4, {"replicator": "owner"})[0]
    assert _behind_at(owner4, all_gather4) == _evaluations(owner4)
    assert (f"With seed 7 (at commit {_commit_of('sweep_nodes_owner', owner7)}) the owner at `outer_lr=1` is "
            f"{gap7:+.2f} % against AdamW-HSDP of that seed, where the all-gather at its 2 is {all_gather7:+.2f} %: on "
            f"the mean of two seeds {(gap8 + gap7) / 2:+.2f} % against the all-gather's "
            f"{(all_gather8 + all_gather7) / 2:+.2f} %") in PROSE
    assert (f"At 4 nodes (at commit {_commit_of('sweep_nodes_owner', owner4)}, at its default outer step 1) a node "
            f"sends and receives {bits4:.3g} bits per parameter and step, {bits4 / bits2:.2f} × its 2-node figure (the "
            f"all-gather: {gather4:.3g}, {gather4 / bits2:.2f} ×; the doctor's estimate, {estimate:.3g}, is within "
            f"{100 * abs(bits4 / estimate - 1):.1f} % of what the run logged), and the owner ends at "
            f"{owner4['final_eval_loss']:.3f}, {gap4:+.2f} %, behind the all-gather at its 1.41 "
            f"({_gap(all_gather4, _strong_adamw(4))}) at every evaluation ({_loss_at(owner4, 200):.3f} against "
            f"{_loss_at(all_gather4, 200):.3f} at step 200)") in PROSE
    assert abs(bits4 / estimate - 1) < 0.01
    two = result("sweep_bits")["runs"]
    (_, gap2), (owner27, gap27) = (lean["flexdemo lr=0.003 replicator=owner scaling=strong" + seed] for seed in
                                   ("", " seed=7"))
    all_gather2 = [_percent(two["flexdemo lr=0.003" + at]["final_eval_loss"], _strong_adamw(2, seed)["final_eval_loss"])
                   for at, seed in (("", 42), (" seed=7", 7))]
    assert (f"At 2 nodes, with seed 7 (at commit {_commit_of('sweep_nodes_owner', owner27)}), it is {gap27:+.2f} % "
            f"(seed 42: {gap2:+.2f} %): {(gap2 + gap27) / 2:+.2f} % on the mean of two seeds, against the "
            f"all-gather's {sum(all_gather2) / 2:+.2f} % (grid `bits`, landing one step after the start)") in PROSE


def test_the_shared_positions_probe_is_the_json():
    """"Received bytes flat in the number of nodes": replicator="random" on the quick preset, its gap against the
    committed quick run's AdamW."""
    probe, quick = result("convergence_quick_random"), result("convergence_quick")
    loss, adamw = probe["methods"]["flexdemo"]["final_eval_loss"], quick["methods"]["adamw"]["final_eval_loss"]
    assert probe["methods"]["flexdemo"]["flexdemo_config"]["replicator"] == "random" and not probe["git_dirty"]
    assert f"at commit {probe['git_commit'][:7]} from a clean tree" in PROSE
    assert f"at **{loss:.3f}**, against the defaults' {quick['methods']['flexdemo']['final_eval_loss']:.3f}" in PROSE
    assert f"AdamW's {adamw:.3f}" in PROSE
    assert f"+{_percent(loss, adamw):.2f} % where the defaults' own top-k is " \
           f"+{quick['final_eval_loss_gap_vs_adamw_pct']['flexdemo']:.2f} %" in PROSE


def _written(lr: float) -> str:
    """An lr as the page writes it: 5e-4, 1.2e-2."""
    mantissa, exponent = f"{lr:.3e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _assert_one_row_per_run(runs: dict, reference: dict) -> None:
    """Every run of a 2-node sweep is one row of the page (its key, maybe with a note after it): its final loss, its
    gap against the AdamW-HSDP run of its lr, seed and model in ``reference`` (where there is none at its lr: the
    best of its seed and model, and the row's note names that lr and seed), and the bits per parameter and step a
    node sends."""
    adamw = {_same_start(r): r for r in reference.values() if r["method"] == "adamw"}
    lines = PAGE.splitlines()
    for key, run in runs.items():
        assert run["status"] == "ok", key
        start = f"| `{key}`"
        if run["method"] == "adamw":
            cells = f"| {run['final_eval_loss']:.3f} | – | 16 (bf16) |"
        else:
            dense = adamw.get(_same_start(run))
            if dense is None:
                dense = min((r for at, r in adamw.items() if at[1:] == _same_start(run)[1:]),
                            key=lambda r: r["final_eval_loss"])
                start += f" (against AdamW-HSDP at {_written(dense['lr'])}, seed {run['training_args']['seed']}) |"
            gap = _percent(run["final_eval_loss"], dense["final_eval_loss"])
            cells = f"| {run['final_eval_loss']:.3f} | {gap:+.2f} % | {run['bytes_sent']['bits_per_param_sent']:.3g} |"
        assert sum(line.startswith(start) and line.endswith(cells) for line in lines) == 1, key


def test_the_bits_at_two_nodes_table_is_the_json():
    """"Bits at 2 nodes over 2,000 steps": every run of grid bits (and its outer-step run) is one row: its final loss,
    its gap against the grid's AdamW-HSDP, and the bits per parameter and step a node sends."""
    bits, outer = result("sweep_bits"), result("sweep_bits_outer")
    _assert_one_row_per_run({**bits["runs"], **outer["runs"]}, reference=bits["runs"])

    defaults = _seed_gaps(bits["runs"], "flexdemo lr=0.003")
    decay = _seed_gaps(bits["runs"], "flexdemo lr=0.003 feedback_decay=0.95")
    assert (f"**At 2,000 steps the defaults are +{sum(defaults) / 2:.2f} % on the mean of two seeds "
            f"(+{defaults[0]:.2f} % and +{defaults[1]:.2f} %), under the 2 % bar") in PROSE
    assert f"`feedback_decay=0.95` is +{sum(decay) / 2:.2f} % (+{decay[0]:.2f} % and +{decay[1]:.2f} %)" in PROSE
    later = _seed_gaps(bits["runs"], "flexdemo lr=0.003 outer_delay=2")
    quick = result("sweep_outer_delay")
    commits = [i["git_commit"][:7] for i in quick["invocations"] if not i["git_dirty"]]
    assert commits == ["3d9ae8b", "f377dc8"] and quick["runs"]["flexdemo lr=0.003 local_steps=4"]["invocation"] == 1
    assert "at commit 3d9ae8b from a clean tree, AMD EPYC; `convergence.py --quick`" in PROSE
    one, two = _seed_gaps(quick["runs"], "flexdemo lr=0.003")
    one_late, two_late = _seed_gaps(quick["runs"], "flexdemo lr=0.003 outer_delay=2")
    assert (f"`outer_delay=2` +{one_late:.2f} % / +{two_late:.2f} % (mean +{(one_late + two_late) / 2:.2f} %) "
            f"against +{one:.2f} % / +{two:.2f} % (mean +{(one + two) / 2:.2f} %) landing after one step") in PROSE
    short = _seed_gaps(quick["runs"], "flexdemo lr=0.003 local_steps=4")
    short_bits = quick["runs"]["flexdemo lr=0.003 local_steps=4"]["bytes_sent"]["bits_per_param_sent"]
    assert (f"(commit f377dc8, from a clean tree, the same machine), rounds of 4 (`local_steps=4`; each fragment's "
            f"exchange then lands after one step, the fragments being a step apart) are +{short[0]:.2f} % / "
            f"+{short[1]:.2f} % (mean +{sum(short) / 2:.2f} %) at 300 steps") in PROSE
    assert f"at twice the bits ({short_bits:.2f} per parameter and step)" in PROSE
    assert all(g < late - 0.8 for g, late in zip(short, (one_late, two_late)))  # "a point under ... on both seeds"
    assert (f"It is +{sum(later) / 2:.2f} % on the mean of two seeds (+{later[0]:.2f} % and +{later[1]:.2f} %), where "
            f"landing after one step is +{sum(defaults) / 2:.2f} %") in PROSE
    for data in (bits, outer):
        assert not data["git_dirty"] and all(not i["git_dirty"] for i in data["invocations"])


def test_the_learning_rate_on_the_long_horizon_is_the_json():
    """"Bits at 2 nodes", grid lr_horizon: rounds of 16 at twice the quick model's lr and at 4e-3 (landing after one
    step, seed 42), AdamW-HSDP at half, 4e-3 and twice, and the defaults at half and twice, against grid bits' runs at
    3e-3; from clean trees at the commits the page names."""
    data, bits = result("sweep_lr_horizon"), result("sweep_bits")["runs"]
    assert all(not i["git_dirty"] and i["git_commit"][:7] in PROSE for i in data["invocations"])
    assert {i["machine"]["cpu_model"].split(" @")[0] for i in data["invocations"]} == {"Intel(R) Xeon(R) Processor"}
    assert "`benchmarks/results/sweep_lr_horizon.json`, `.png`, from clean trees, Intel Xeon:" in PROSE
    rounds_16 = {r["lr"]: r for r in data["runs"].values() if r["knobs"].get("local_steps") == 16}
    assert all((r["flexdemo_config"]["local_steps"], r["flexdemo_config"]["outer_delay"]) == (16, 1)
               for r in rounds_16.values())
    adamw, same = bits["adamw lr=0.003"]["final_eval_loss"], bits["flexdemo lr=0.003 local_steps=16"]["final_eval_loss"]
    loss = rounds_16[6e-3]["final_eval_loss"]
    assert (f"They end at {loss:.3f}, {_percent(loss, adamw):+.2f} % against AdamW-HSDP at 3e-3 (the table's, on "
            f"the AMD EPYC;") in PROSE
    assert f"where at 3e-3 they are {_percent(same, adamw):+.2f} %" in PROSE
    half = data["runs"]["adamw lr=0.0015"]["final_eval_loss"]
    assert f"1.5e-3, ends at {half:.3f}, {_percent(half, adamw):+.2f} % above its 3e-3" in PROSE and half > adamw
    double = data["runs"]["adamw lr=0.006"]["final_eval_loss"]
    assert f"6e-3, it ends at {double:.3f}, {_percent(double, adamw):+.2f} %" in PROSE and double > adamw
    rounds, dense = rounds_16[4e-3]["final_eval_loss"], data["runs"]["adamw lr=0.004"]["final_eval_loss"]
    assert (f"rounds of 16 end at {rounds:.3f}, {_percent(rounds, adamw):+.2f} % against AdamW-HSDP at 3e-3"
            in PROSE and rounds > same)
    assert f"AdamW-HSDP ends at {dense:.3f}, +{_percent(dense, adamw):.2f} % above its 3e-3" in PROSE
    # "AdamW-HSDP's best of the four lrs", "rounds of 16 do best there too, of the three they ran at"
    assert adamw < min(r["final_eval_loss"] for r in data["runs"].values() if r["method"] == "adamw")
    assert same < min(r["final_eval_loss"] for r in rounds_16.values())

    defaults = {r["lr"]: r for r in data["runs"].values() if r["method"] == "flexdemo" and not r["knobs"]}
    assert sorted(defaults) == [1.5e-3, 6e-3] and all(
        (r["flexdemo_config"]["local_steps"], r["flexdemo_config"]["outer_delay"]) == (8, 2) for r in defaults.values())
    at_3e3 = bits["flexdemo lr=0.003 outer_delay=2"]["final_eval_loss"]
    gap = {lr: _percent(r["final_eval_loss"], adamw) for lr, r in defaults.items()}
    assert (f"at 6e-3 they end at {defaults[6e-3]['final_eval_loss']:.3f}, {gap[6e-3]:+.2f} % against AdamW-HSDP at "
            f"3e-3, and at 1.5e-3 at {defaults[1.5e-3]['final_eval_loss']:.3f}, {gap[1.5e-3]:+.2f} %, where at 3e-3 "
            f"they are {_percent(at_3e3, adamw):+.2f} %") in PROSE
    assert at_3e3 < min(r["final_eval_loss"] for r in defaults.values())  # "do best at 3e-3 too"
    # "below the best lr they lose more than AdamW-HSDP does ..., above it less"
    below, above = (_percent(defaults[lr]["final_eval_loss"], data["runs"][f"adamw lr={lr}"]["final_eval_loss"])
                    for lr in (1.5e-3, 6e-3))
    assert f"(at 1.5e-3 {below:+.2f} % against AdamW-HSDP at 1.5e-3), above it less (at 6e-3 {above:+.2f} %" in PROSE


def test_the_rounds_by_length_table_is_the_json():
    """"Bits at 2 nodes": grid rounds_by_length at 1,000 steps, one row per run (its gap against AdamW-HSDP of its
    seed and a node's bits), the means the rule rests on, and the commit."""
    data = result("sweep_rounds_by_length")
    assert f"at commit {data['git_commit'][:7]} from a\nclean tree" in PAGE and not data["git_dirty"]
    _assert_one_row_per_run(data["runs"], reference=data["runs"])
    eight = _mean_gap(data["runs"], "flexdemo lr=0.003")
    four = _mean_gap(data["runs"], "flexdemo lr=0.003 local_steps=4")
    assert f"Rounds of 8 are +{eight:.2f} % on the mean of the two seeds at 1,000 steps" in PROSE and eight < 2
    assert f"and rounds of 4 +{four:.2f} %" in PROSE


@pytest.mark.parametrize(("name", "commit"), [("time_to_target_short", None), ("time_to_target_delay2", "3d9ae8b"),
                                             ("time_to_target_links", "08a1911")])
def test_the_time_to_target_on_links_of_1_2_10_is_the_json(name, commit):
    """"Time to target on a slow link", at the defaults (this short run's rounds of 4), in rounds of 8 landing two
    steps after the start and landing after one (the defaults before): per link what it stands for (a 1 B model at
    1 s per step), FlexDeMo's time and step to target, its ratio to the compute-only run, its step and the
    optimizer's wait; the summary quotes the defaults and rounds of 8, the README the defaults."""
    data = result(name)
    commit = commit or data["git_commit"][:7]
    assert f"`benchmarks/results/{name}.json`, `.png`, at commit {commit} from a clean tree" in PROSE
    assert data["git_commit"].startswith(commit) and not data["git_dirty"]
    runs = {(r["method"], r["link"]["rate_mbit"]): r for r in data["runs"]}
    reference, ratios = runs["adamw", None], []
    target, seconds = data["target"]["target_eval_loss"], data["compute_only"]["seconds"]
    assert f"reaches the target ({target:.4f}) at **{seconds:.1f} s**" in PROSE
    for link in (1, 2, 10):
        run, reached = runs["flexdemo", float(link)], data["time_to_target"][str(link)]["flexdemo"]
        stands = link * 1e9 / run["parameters"] * reference["seconds_per_step"]
        ratio = data["vs_compute_only"][str(link)]["flexdemo"]
        row = (f"| {link} Mbit/s | {stands:.0f} Mbit/s | {reached['seconds']:.1f} (step {reached['step']:.0f}) | "
               f"**{ratio:.2f}**")
        ratios.append(f"{ratio:.2f}")
        assert sum(line.startswith(row) and line.endswith(
            f"| {run['seconds_per_step']:.3f} | {1e3 * run['flexdemo_comm_seconds_per_step']:.1f} ms |")
            for line in PAGE.splitlines()) == 1, link
    if name in ("time_to_target_short", "time_to_target_delay2"):
        assert f"| {' / '.join(ratios)} | (stopped by the run's budget) |" in PAGE
    if name == "time_to_target_short":
        assert all(r["flexdemo_config"]["local_steps"] == 4 for r in data["runs"] if r["method"] == "flexdemo")
        adamw = data["vs_compute_only"]["10"]
        assert (f"| {' / '.join(ratios)} | at 10 Mbit/s ≥ {adamw['adamw_lower_bound']:.2f} (stopped by the budget; "
                f"{adamw['adamw_projected']:.2f} projected) |") in README


def test_the_second_model_size_over_2000_steps_is_the_json():
    """"A second model size", over 2,000 steps: every run of grid sizes_long is one row, each gap against AdamW-HSDP at
    the run's lr and seed (seed 7's rounds of 16 against seed 7's AdamW-HSDP, at its best lr), from a clean tree at the
    commit the page names; the claim with each method at its best lr, per seed and on their mean; the defaults at
    both methods' best lrs, against AdamW-HSDP's best."""
    data = result("sweep_sizes_long")
    assert all(not i["git_dirty"] and i["git_commit"][:7] in PROSE for i in data["invocations"])
    assert {i["machine"]["cpu_model"].split(" @")[0] for i in data["invocations"]} == {"Intel(R) Xeon(R) Processor"}
    assert "`benchmarks/results/sweep_sizes_long.json`, `.png`, from clean trees, Intel Xeon:" in PROSE
    _assert_one_row_per_run(data["runs"], reference=data["runs"])
    unseeded = [r for r in data["runs"].values() if "seed" not in r["knobs"]]
    adamw_runs = {r["lr"]: r for r in unseeded if r["method"] == "adamw"}
    adamw = {lr: r["final_eval_loss"] for lr, r in adamw_runs.items()}
    rounds = {r["lr"]: r for r in unseeded if r["method"] == "flexdemo" and r["knobs"].get("local_steps") == 16}
    bits = rounds[1e-3]["bytes_sent"]["bits_per_param_sent"]
    same_lr = _percent(rounds[1e-3]["final_eval_loss"], adamw[1e-3])
    assert f"rounds of 16 send {bits:.3g} bits per parameter and step at {same_lr:+.2f} %" in PROSE
    best, mine = min(adamw, key=adamw.get), min(rounds, key=lambda lr: rounds[lr]["final_eval_loss"])
    loss = rounds[mine]["final_eval_loss"]
    gap = _percent(loss, adamw[best])
    assert (f"against AdamW-HSDP at its best lr of the {len(adamw)}, {_written(best)} ({adamw[best]:.3f}), rounds of "
            f"16 at their best of the {len(rounds)}, {_written(mine)} ({loss:.3f}), are {gap:+.2f} %") in PROSE

    seven = [r for r in data["runs"].values() if r["knobs"].get("seed") == 7]
    (dense,), (seventh,), (defaults_7,) = ([r for r in seven if (r["method"], r["knobs"].get("local_steps")) == run]
                                           for run in (("adamw", None), ("flexdemo", 16), ("flexdemo", None)))
    # seed 7 runs each method at seed 42's best lr
    assert (dense["lr"], seventh["lr"], defaults_7["lr"]) == (best, mine, mine)
    gap_7 = _percent(seventh["final_eval_loss"], dense["final_eval_loss"])
    assert (f"rounds of 16 are {(gap + gap_7) / 2:+.2f} % on the mean of two seeds ({gap:+.2f} % and {gap_7:+.2f} %)"
            in PROSE)

    defaults = {r["lr"]: r for r in unseeded if r["method"] == "flexdemo" and "local_steps" not in r["knobs"]}
    assert sorted(defaults) == sorted({best, mine}) and all(
        r["flexdemo_config"]["local_steps"] == 8 for r in defaults.values())
    eight = {lr: _percent(r["final_eval_loss"], adamw[best]) for lr, r in defaults.items()}
    sent = defaults[mine]["bytes_sent"]["bits_per_param_sent"]
    eight_7 = _percent(defaults_7["final_eval_loss"], dense["final_eval_loss"])
    mean = (eight[mine] + eight_7) / 2
    assert (f"**Rounds of 8 (the defaults when they ran; {sent:.2f} bits per parameter and step) end {mean:+.2f} % on "
            f"the mean of two seeds ({eight[mine]:+.2f} % and {eight_7:+.2f} %) against AdamW-HSDP at its best lr at "
            f"{_written(mine)}**") in PROSE
    assert (f"At {_written(best)}, AdamW-HSDP's best lr, rounds of 8 end at {defaults[best]['final_eval_loss']:.3f}, "
            f"{eight[best]:+.2f} %") in PROSE
    # "ahead of AdamW-HSDP at 5e-4 at every evaluation" at 1e-3 with both seeds, "behind ... at every evaluation" at
    # 5e-4
    evaluations = _evaluations(dense)
    assert _behind_at(adamw_runs[best], defaults[mine]) == _behind_at(dense, defaults_7) == evaluations
    assert _behind_at(defaults[best], adamw_runs[best]) == evaluations
    summary = PAGE.split("## Summary")[1].split("\n## ")[0]
    sixteen = (gap + gap_7) / 2
    assert (f"| validation loss vs AdamW-HSDP at 2,000 steps, 2 nodes, the d256 model (8.37 M parameters), mean of "
            f"two seeds, the defaults at {_written(mine)} against AdamW-HSDP at {_written(best)}, each its best "
            f"lr: rounds of 16 there (a long run on 8 M parameters or more), {bits:.3g} bits per parameter and step "
            f"/ rounds of 8, {sent:.2f} bits") in summary
    assert f"| {sixteen:+.2f} % / {mean:+.2f} % |" in summary
    assert (f"The d256 front has two points, each on two seeds: {bits:.3g} bits at {(gap + gap_7) / 2:+.2f} % and "
            f"{sent:.2f} bits at {mean:+.2f} %") in PROSE

    # the rule that takes rounds of 16 on this model's size: within issue 32's bar, where the quick model's are not
    from hf_flexdemo import knobs

    rule = PAGE.split("**So a long run on a model of this size takes rounds of 16")[1].split("\n\n")[0]
    rule = " ".join(rule.split())
    assert sixteen <= 2 < _mean_gap(result("sweep_bits")["runs"], "flexdemo lr=0.003 local_steps=16") and bits <= 0.1
    assert (knobs.LARGE_MODEL_LOCAL_STEPS, knobs.LARGE_MODEL_STEPS) == (16, 2000)
    assert (f"`local_steps=None` resolves to 16 for a run of 2,000 steps or more on "
            f"{knobs.LARGE_MODEL_PARAMETERS // 10**6} M trained parameters or more") in rule
    assert all(r["curve"][-1]["step"] == knobs.LARGE_MODEL_STEPS for r in data["runs"].values())
    assert (f"On the d256 model that is {bits:.3g} bits per parameter and step at {sixteen:+.2f} % on the mean of two "
            f"seeds, each method at its best lr: under issue 32's 0.1 bits at 2 %. Rounds of 8 keep "
            f"{sixteen - mean:.2f} points more of the loss for twice the bits") in rule
    quick = _mean_gap(result("sweep_bits")["runs"], "flexdemo lr=0.003 local_steps=16")
    assert f"On the quick model (1.44 M parameters) rounds of 16 are {quick:+.2f} %" in rule
    weak = result("sweep_nodes_weak")["runs"]
    behind = [(weak[key.format("local_steps=16 ")]["final_eval_loss"] - weak[key.format("")]["final_eval_loss"])
              / weak[f"adamw lr=0.003 nodes={nodes} procs_per_node={8 // nodes} scaling=weak"]["final_eval_loss"] * 100
              for nodes, key in (
                  (4, "flexdemo lr=0.003 {}nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"),
                  (8, "flexdemo lr=0.003 {}nodes=8 procs_per_node=1 scaling=weak"))]  # points of AdamW-HSDP's loss
    assert f"only the quick model ran rounds of 16, {behind[0]:.2f} and {behind[1]:.2f} points behind" in rule
    at_adamw = _percent(rounds[best]["final_eval_loss"], adamw[best])
    assert (f"at AdamW-HSDP's {_written(best)} rounds of 16 are {at_adamw:+.2f} % and rounds of 8 {eight[best]:+.2f} "
            f"%, one seed: both miss the bar") in rule


def test_the_two_model_sizes_table_is_the_json():
    """"A second model size": every run of grid sizes is one row, the fronts quote the mean of the two seeds' gaps
    on each model, and the parameter counts are the models' own; the size from which a long run takes rounds of 16
    is the larger model's, rounded down to the million, above the quick model's."""
    from transformers import T5ForConditionalGeneration

    from hf_flexdemo.knobs import LARGE_MODEL_PARAMETERS
    from hf_flexdemo.seq2seq.tiny_t5 import tiny_t5_config

    data = result("sweep_sizes")
    assert all(not i["git_dirty"] and i["git_commit"][:7] in PROSE for i in data["invocations"])
    _assert_one_row_per_run(data["runs"], reference=data["runs"])
    runs, settings = data["runs"], data["settings"]
    sizes = [run["knobs"] for run in runs.values() if run["method"] == "adamw" and "seed" not in run["knobs"]]
    assert len(sizes) == 2  # the quick model and the d256 model
    for knobs in sizes:
        size = "the d256 model" if knobs else "the quick model"
        config = tiny_t5_config(settings["vocab_size"], d_model=knobs.get("d_model", settings["d_model"]),
                                num_layers=knobs.get("num_layers", settings["num_layers"]),
                                num_heads=settings["num_heads"], d_ff=knobs.get("d_ff", settings["d_ff"]))
        parameters = sum(p.numel() for p in T5ForConditionalGeneration(config).parameters())
        if knobs:
            assert LARGE_MODEL_PARAMETERS == parameters // 10**6 * 10**6
        else:
            assert parameters < LARGE_MODEL_PARAMETERS
        tail = "".join(f" {k}={v}" for k, v in sorted(knobs.items()))
        front = []
        for key in (f"flexdemo lr=0.003{tail}", f"flexdemo lr=0.003 compression_rate=0.0625{tail}"):
            gaps = _seed_gaps(runs, key)
            front.append(f"{runs[key]['bytes_sent']['bits_per_param_sent']:.3g} bits at {sum(gaps) / 2:+.2f} % "
                         f"({gaps[0]:+.2f} / {gaps[1]:+.2f})")
        assert f"{size} ({parameters / 1e6:.2f} M parameters): {front[0]}, {front[1]}" in PROSE


def test_the_length_factor_study_is_the_json():
    """"Weak scaling": the signal's share and the factor at 8 nodes, as progress_scale estimates them and as measured
    at the weights, on 8 and on 32 sequences a step; the uniform step the paragraph names is the strong grid's, and so
    are the rounds of 4 that test its reading."""
    data = result("length_factor")
    assert not data["git_dirty"] and data["machine"]["cpu_model"] == "AMD EPYC" and data["nodes"] == 8
    at = {(row["batch_size"], row["step"]): row for row in data["rows"]}

    def three(batch: int, field: str, spec: str) -> str:
        return ", ".join(format(at[batch, step][field], spec) for step in (200, 450, 800))

    for batch in (8, 32):  # the estimate's factor is shorter than the weights' at every checkpoint
        assert all(at[batch, step]["f_ema"] < at[batch, step]["f_probe"] for step in (200, 450, 800))
    uniform = result("sweep_nodes_outer")["runs"]["flexdemo lr=0.003 nodes=8 outer_lr=2.83 procs_per_node=1 "
                                                  "scaling=strong"]
    assert (f"near √8, the uniform step that costs {_gap(uniform, _strong_adamw(8))} under strong scaling.** "
            f"`python -m benchmarks.studies.length_factor` (`benchmarks/results/length_factor.json`, at commit "
            f"{data['git_commit'][:7]} from a clean tree, AMD EPYC)") in PROSE
    assert (f"from {data['probes']} independent batches. On 8 sequences the estimate reads "
            f"{three(8, 'ema_share', '.3f')} where the weights' share is {three(8, 'probe_share', '.4f')}; on 32 it "
            f"reads {three(32, 'ema_share', '.3f')} where the weights' is {three(32, 'probe_share', '.3f')}.") in PROSE
    assert (f"{three(8, 'f_ema', '.2f')} against {three(8, 'f_probe', '.2f')} on 8 sequences, "
            f"{three(32, 'f_ema', '.2f')} against {three(32, 'f_probe', '.2f')} on 32 (per tensor, from the sums; the "
            f"mean of the per-element factor the optimizer applies is {three(8, 'f_element', '.2f')} and "
            f"{three(32, 'f_element', '.2f')}).") in PROSE
    assert (f"is {at[8, 200]['f_probe']:.2f} already at step 200 (√8 = {8 ** 0.5:.2f}), where on 32 it reaches "
            f"{at[32, 800]['f_probe']:.2f} only by step 800.") in PROSE
    strong = result("sweep_nodes_outer")["runs"]
    four, eight, plain4 = (strong[f"flexdemo lr=0.003 {knobs}scaling=strong"] for knobs in (
        "local_steps=4 nodes=8 procs_per_node=1 progress_scale=batch ",
        "nodes=8 procs_per_node=1 progress_scale=batch ", "local_steps=4 nodes=8 procs_per_node=1 "))
    plain8 = result("sweep_nodes")["runs"]["flexdemo lr=0.003 nodes=8 procs_per_node=1 scaling=strong"]
    adamw = _strong_adamw(8)
    assert four["flexdemo_config"]["local_steps"] == 4 and four["flexdemo_config"]["outer_lr"] == 1.0
    assert (f"`progress_scale=\"batch\"` with `local_steps=4` at 8 strong nodes (grid `nodes_outer`, at commit "
            f"{_commit_of('sweep_nodes_outer', four)}, {_bits_sent(four):.3g} bits) ends at "
            f"{four['final_eval_loss']:.3f}, {_gap(four, adamw)} against AdamW-HSDP: {_gap(four, eight)} against "
            f"itself in rounds of 8, but {_gap(four, plain4)} against the same rounds of 4 sent unscaled "
            f"({_gap(plain4, adamw)}), where in rounds of 8 it was {_gap(eight, plain8)}. One seed.") in PROSE


def test_the_lengthenings_estimate_with_a_memory_of_its_own_is_the_json():
    """"Weak scaling": progress_scale_decay=0.99 at 4 weak nodes, both seeds, against AdamW-HSDP and against the
    estimate at beta2's of the same seed: the mean of the two seeds' gaps, where along the run each is ahead, and the
    spread of the two seeds at beta2's that the margins are read against."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch {}scaling=weak{}"
    own, shared = ({seed: runs[key.format(decay, more)] for seed, more in ((42, ""), (7, " seed=7"))}
                   for decay in ("progress_scale_decay=0.99 ", ""))
    base = {seed: _best_adamw(runs, 4, seed) for seed in (42, 7)}
    assert base[42]["lr"] == base[7]["lr"] == 3e-3
    for seed, run in own.items():
        assert run["flexdemo_config"]["progress_scale_decay"] == 0.99 and run["knobs"].get("seed", 42) == seed
        assert {k: v for k, v in run["knobs"].items() if k != "progress_scale_decay"} == shared[seed]["knobs"]
    gaps, gaps_shared = ([_percent(runs_[seed]["final_eval_loss"], base[seed]["final_eval_loss"]) for seed in (42, 7)]
                         for runs_ in (own, shared))
    along = {seed: _gaps_along(own[seed], shared[seed]) for seed in (42, 7)}
    assert max(abs(along[42][step]) for step in (200, 400, 600, 800)) == abs(along[42][200])
    assert all(along[42][step] < 0 for step in along[42] if step >= 1000)
    assert [step for step in along[7] if along[7][step] < 0] == list(range(200, 1400, 200))
    assert all(run["best_eval_loss"] == run["final_eval_loss"] for run in own.values())
    spread = _percent(shared[7]["final_eval_loss"], shared[42]["final_eval_loss"])
    prose = (
        f"is {sum(gaps) / 2:+.2f} % on the mean of two seeds, where at β2's it is {sum(gaps_shared) / 2:+.2f} %.** "
        f"Grid `nodes_weak` runs it at lr 3e-3 and `outer_lr=1`, AMD EPYC, from a clean tree. Seed 42 (at commit "
        f"{_commit_of('sweep_nodes_weak', own[42])}) ends at {own[42]['final_eval_loss']:.3f}, {gaps[0]:+.2f} % "
        f"against AdamW-HSDP at 3e-3 and {_gap(own[42], shared[42])} against the estimate at β2's, within "
        f"{abs(along[42][200]):.2f} % of it up to step 800 and ahead from step 1,000 on, with a training loss over the "
        f"last 200 steps of {_tail(own[42]):.3f} against {_tail(shared[42]):.3f}. Seed 7 (at commit "
        f"{_commit_of('sweep_nodes_weak', own[7])}) ends at {own[7]['final_eval_loss']:.3f}, {gaps[1]:+.2f} % against "
        f"AdamW-HSDP of that seed and {_gap(own[7], shared[7])} against the estimate at β2's: ahead of it up to step "
        f"1,200 and behind from step 1,400 on, with a training loss over the last 200 steps of {_tail(own[7]):.3f} "
        f"against {_tail(shared[7]):.3f}. The two seeds move in opposite directions, each by about the spread of the "
        f"two seeds at β2's ({spread:.2f} %)")
    _assert_in_prose(prose)
    assert (_percent(own[42]["final_eval_loss"], shared[42]["final_eval_loss"]) < 0
            < _percent(own[7]["final_eval_loss"], shared[7]["final_eval_loss"]))


def test_the_lengthening_in_the_dense_limit_is_the_json():
    """"Weak scaling": the dense mean in rounds of 2 at 4 weak nodes, lengthened and not, against AdamW-HSDP, the dense
    step-wise rule and the lengthened dense mean in rounds of 8, and the study's reading of the signal it quotes."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 {}nodes=4 outer_lr=1 procs_per_node=2 {}replicator=full scaling=weak"
    plain, scaled, scaled8 = (runs[key.format(rounds, scale)] for rounds, scale in
                              (("local_steps=2 ", ""), ("local_steps=2 ", "progress_scale=batch "),
                               ("", "progress_scale=batch ")))
    step_wise = result("sweep_nodes_weak_step_wise")["runs"][
        "flexdemo lr=0.003 local_steps=1 nodes=4 procs_per_node=2 replicator=full scaling=weak value_dtype=float32"]
    base = _best_adamw(runs, 4)
    assert base["lr"] == 3e-3
    for run in (plain, scaled):
        config = run["flexdemo_config"]
        assert (config["local_steps"], config["outer_lr"], config["replicator"]) == (2, 1.0, "full")
        assert round(_bits_sent(run)) == 24 and run["best_eval_loss"] == run["final_eval_loss"]
    assert [run["flexdemo_config"]["progress_scale"] for run in (plain, scaled)] == ["none", "batch"]
    early = _gaps_along(plain, step_wise)
    cost = _gaps_along(scaled, plain)
    widest = max(cost, key=cost.get)
    drift = _gaps_along(scaled, scaled8)
    assert min(early.values()) > 0 and min(cost.values()) > 0
    study = {(row["batch_size"], row["step"]): row for row in result("length_factor")["rows"]}[32, 200]
    prose = (
        f"the dense mean in rounds of 2 lengthened ends {_gap(scaled, plain)} above the same rounds unlengthened, so "
        f"part of what the lengthening adds to each element is not progress, and what the compressed exchange gains "
        f"from it comes with the filter of its top-k.** Grid `nodes_weak` runs both at 4 weak nodes × 2 processes, "
        f"lr 3e-3, `replicator=\"full\"`, `local_steps=2` and `outer_lr=1` ({_bits_sent(plain):.0f} bits per "
        f"parameter and step), AMD EPYC, from a clean tree. Unlengthened (at commit "
        f"{_commit_of('sweep_nodes_weak', plain)}) the rounds of 2 end at {plain['final_eval_loss']:.3f}, "
        f"{_gap(plain, base)} against AdamW-HSDP at 3e-3 and {_gap(plain, step_wise)} against the dense step-wise rule "
        f"(above), within {max(early[s] for s in (200, 400, 600)):.2f} % of it up to step 600. With "
        f"`progress_scale=\"batch\"` (at commit {_commit_of('sweep_nodes_weak', scaled)}) they end at "
        f"{scaled['final_eval_loss']:.3f}, {_gap(scaled, base)} against AdamW-HSDP: behind the unlengthened rounds at "
        f"every evaluation, by {cost[widest]:.2f} % at step {widest:,} (the widest) and {cost[2000]:.2f} % at step "
        f"2,000, with a training loss over the last 200 steps of {_tail(scaled):.3f} against {_tail(plain):.3f}. They "
        f"stay within {max(map(abs, drift.values())):.2f} % of the lengthened dense mean in rounds of 8 "
        f"({_gap(scaled8, base)}) at every evaluation, so the cost does not grow with how far a round drifts. A "
        f"reading, which the micro-batch estimate below refutes: a node's step on one gradient's noise moves the next "
        f"gradient against that noise, so the products of consecutive gradients read the signal low (in the study "
        f"above, {study['lag_share']:.3f} of the second moment over the last 100 steps at step 200 on 32 sequences, "
        f"where the share at the weights is {study['probe_share']:.3f})")
    _assert_in_prose(prose)
    assert early[800] > max(early[s] for s in (200, 400, 600)) and result("length_factor")["window"] == 100


def test_the_lengthened_exchange_on_the_top_eighth_is_the_json():
    """"Weak scaling": progress_scale="batch" at compression_rate 1/8 on 4 weak nodes against AdamW-HSDP, the top
    quarter in rounds of 8 and of 16, and the bits it sends."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 {}nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"
    eighth, quarter, sixteen = (runs[key.format(knob)] for knob in ("compression_rate=0.125 ", "", "local_steps=16 "))
    base = _best_adamw(runs, 4)
    assert eighth["flexdemo_config"]["compression_rate"] == 1 / 8 and eighth["flexdemo_config"]["local_steps"] == 8
    behind, ahead = _gaps_along(eighth, quarter), _gaps_along(eighth, sixteen)
    assert min(behind.values()) > 0 and max(ahead.values()) < 0
    assert _bits_sent(sixteen) < _bits_sent(eighth) < _bits_sent(quarter)
    prose = (
        f"the lengthened exchange on the top eighth of each block ends {_gap(eighth, quarter)} above the top quarter "
        f"at 4 weak nodes, for {_bits_sent(eighth):.3g} bits per parameter and step instead of "
        f"{_bits_sent(quarter):.3g} (the bitmask's bit per element stays).** `progress_scale=\"batch\"` at "
        f"`outer_lr=1` and `compression_rate=1/8` (at commit {_commit_of('sweep_nodes_weak', eighth)} from a clean "
        f"tree, the same grid, AMD EPYC) ends at {eighth['final_eval_loss']:.3f}, {_gap(eighth, base)} against "
        f"AdamW-HSDP at 3e-3: behind the top quarter at every evaluation (by {behind[200]:.2f} % at step 200), with a "
        f"training loss over the last 200 steps of {_tail(eighth):.3f} against {_tail(quarter):.3f}. Against rounds of "
        f"16 on the top quarter ({_bits_sent(sixteen):.3g} bits) it is {_gap(eighth, sixteen)}, ahead of them at every "
        f"evaluation, so it joins the 4-weak front between the two.")
    _assert_in_prose(prose)
    front = result("frontier")["fronts"]["4 nodes, weak scaling"]
    assert key.format("compression_rate=0.125 ") in front


def test_the_micro_batch_estimate_is_the_json():
    """"Weak scaling": progress_scale_estimate="micro_batches" at 4 weak nodes, compressed and in the dense rounds of
    2, against AdamW-HSDP, the consecutive estimate and the unlengthened rounds; the study's reading of both estimates
    on one run, and the seeds' spread the margins are read against."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 {}nodes=4 outer_lr=1 procs_per_node=2 {}scaling=weak"
    micro = "progress_scale=batch progress_scale_estimate=micro_batches "
    compressed, dense = (runs[key.format(f"gradient_accumulation_steps=2 {rounds}", f"{micro}{wire}")]
                         for rounds, wire in (("", ""), ("local_steps=2 ", "replicator=full ")))
    scaled, full = "progress_scale=batch ", "replicator=full "
    consecutive_dense, plain = (runs[key.format("local_steps=2 ", scale)] for scale in (scaled + full, full))
    _, consecutive, spread = _against_lengthened_at_4(runs, key.format("gradient_accumulation_steps=2 ", micro))
    base = _best_adamw(runs, 4)
    assert base["lr"] == 3e-3
    for run in (compressed, dense):
        assert run["flexdemo_config"]["progress_scale_estimate"] == "micro_batches"
        assert run["training_args"]["gradient_accumulation_steps"] == 2
        assert run["training_args"]["per_device_train_batch_size"] == 8  # 2 x 8 per rank, 32 per node and step
    behind, ahead, cost = (_gaps_along(compressed, consecutive), _gaps_along(dense, consecutive_dense),
                           _gaps_along(dense, plain))
    assert min(behind.values()) > 0 and max(ahead.values()) < 0 and min(cost.values()) > 0
    widest = max(cost, key=cost.get)
    study = result("length_factor_micro")
    assert study["micro_batches"] and study["nodes"] == 4
    rows = {row["step"]: row for row in study["rows"] if row["batch_size"] == 32}
    margins = [_percent(compressed["final_eval_loss"], consecutive["final_eval_loss"]),
               _percent(dense["final_eval_loss"], plain["final_eval_loss"])]
    prose = (
        f"the lengthened exchange ends {_gap(compressed, consecutive)} above the estimate from consecutive gradients "
        f"at 4 weak nodes, and in the dense rounds of 2 it still costs {_gap(dense, plain)} over no lengthening.** "
        f"Grid `nodes_weak` runs `progress_scale_estimate=\"micro_batches\"` at lr 3e-3, `outer_lr=1` and "
        f"`gradient_accumulation_steps=2` (each node's 32 sequences a step in two micro-batches of 16), AMD EPYC, from "
        f"a clean tree. Compressed (at commit {_commit_of('sweep_nodes_weak', compressed)}) it ends at "
        f"{compressed['final_eval_loss']:.3f}, {_gap(compressed, base)} against AdamW-HSDP at 3e-3, behind the "
        f"consecutive estimate at every evaluation (by {behind[200]:.2f} % at step 200, {behind[2000]:.2f} % at step "
        f"2,000), with a training loss over the last 200 steps of {_tail(compressed):.3f} against "
        f"{_tail(consecutive):.3f}. In the dense rounds of 2 (at commit {_commit_of('sweep_nodes_weak', dense)}, "
        f"{_bits_sent(dense):.0f} bits per parameter and step) it ends at {dense['final_eval_loss']:.3f}, "
        f"{_gap(dense, base)} against AdamW-HSDP: {_gap(dense, consecutive_dense)} against the consecutive estimate's "
        f"lengthening there and ahead of it at every evaluation, but {_gap(dense, plain)} against the same rounds "
        f"unlengthened and behind them at every evaluation (by {cost[widest]:.2f} % at step {widest:,}, the widest), "
        f"with a training loss over the last 200 steps of {_tail(dense):.3f} against {_tail(consecutive_dense):.3f} "
        f"and {_tail(plain):.3f}. "
        f"`python -m benchmarks.studies.length_factor --micro_batches --batch_sizes 32 --nodes 4` "
        f"(`benchmarks/results/length_factor_micro.json`, at commit {study['git_commit'][:7]} from a clean tree, AMD "
        f"EPYC) reads both estimates on one node's run of 32 sequences a step in two micro-batches: at step 800 the "
        f"micro-batches' products give the signal a share of {rows[800]['micro_share']:.3f} of the second moment, the "
        f"consecutive products {rows[800]['ema_share']:.3f} and the weights {rows[800]['probe_share']:.3f} (at step "
        f"200: {rows[200]['micro_share']:.3f}, {rows[200]['ema_share']:.3f} and {rows[200]['probe_share']:.3f}), so "
        f"the factor at 4 nodes averages {rows[800]['f_micro_element']:.3f} per element from the micro-batches and "
        f"{rows[800]['f_element']:.3f} from consecutive gradients.")
    _assert_in_prose(prose)
    assert not study["git_dirty"] and rows[800]["f_micro_element"] < rows[800]["f_element"]
    assert rows[800]["micro_share"] > rows[800]["ema_share"] > rows[800]["probe_share"]
    assert (f"the margins are {margins[0] / spread:.1f} and {margins[1] / spread:.1f} times the spread of the two "
            f"seeds in rounds of 8 ({spread:.2f} %). One seed each.") in PROSE


def test_the_lengthening_waited_for_in_the_dense_limit_is_the_json():
    """"Weak scaling": the dense_lengthening study (the lengthened mean against AdamW on the mean gradient in one
    process) and the lengthened dense rounds of 2 waited for in step(), against the same rounds landing a step late,
    lengthened and not, the dense step-wise rule and AdamW-HSDP."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 local_steps=2 nodes=4 outer_lr=1 {}procs_per_node=2 {}replicator=full scaling=weak"
    waited, late, plain = (runs[key.format(*knobs)] for knobs in
                           (("overlap=none ", "progress_scale=batch "), ("", "progress_scale=batch "), ("", "")))
    step_wise = result("sweep_nodes_weak_step_wise")["runs"][
        "flexdemo lr=0.003 local_steps=1 nodes=4 procs_per_node=2 replicator=full scaling=weak value_dtype=float32"]
    base = _best_adamw(runs, 4)
    config = waited["flexdemo_config"]
    assert (config["overlap"], config["local_steps"], config["progress_scale"]) == ("none", 2, "batch")
    assert late["flexdemo_config"]["overlap"] == "delayed"
    ahead, against_plain = _gaps_along(waited, late), _gaps_along(waited, plain)
    assert max(ahead.values()) < 0
    assert [step for step, gap in against_plain.items() if gap > 0] == [400, 600]
    study = result("dense_lengthening")
    assert (study["nodes"], study["batch"]) == (4, 32) and not study["git_dirty"]
    loss = {(row["way"], row["step"]): row for row in study["rows"]}
    at = {way: loss[way, 400]["eval_loss"] for way in ("adamw", "oracle", "estimated", "mean")}
    assert all(loss["mean", step]["eval_loss"] > loss[way, step]["eval_loss"]
               for step in (100, 200, 300, 400) for way in ("adamw", "oracle", "estimated"))
    below = {name: -_percent(waited["final_eval_loss"], run["final_eval_loss"])
             for name, run in (("late", late), ("plain", plain))}
    prose = (
        f"the lengthened dense rounds of 2 waited for in `step()` end {below['late']:.2f} % below the same rounds "
        f"landing a step late, and {below['plain']:.2f} % below those unlengthened; in one process, with every node "
        f"at the same weights every step, the lengthened mean is AdamW's step on the mean gradient.** `python -m "
        f"benchmarks.studies.dense_lengthening` (`benchmarks/results/dense_lengthening.json`, at commit "
        f"{study['git_commit'][:7]} from a clean tree, AMD EPYC) trains the quick model on 4 simulated nodes of 32 "
        f"sequences in one process, every node at the same weights every step (the dense step-wise limit), for 400 "
        f"steps from one initialisation and data order. AdamW on the nodes' mean gradient ends at {at['adamw']:.3f}; "
        f"the mean of the nodes' AdamW steps lengthened by the oracle's factor √(v / v_mean) (algebraically AdamW on "
        f"the mean of the nodes' own clipped gradients) at {at['oracle']:.3f}, lengthened by the estimated factor at "
        f"{at['estimated']:.3f}, and not lengthened at {at['mean']:.3f} ({_percent(at['mean'], at['adamw']):+.2f} %). "
        f"Weighted by each node's step, the estimated factor averages {loss['estimated', 400]['f_estimated']:.3f} over "
        f"steps 301 to 400, where the oracle's is {loss['estimated', 400]['f_oracle']:.3f}.")
    _assert_in_prose(prose)
    prose = (
        f"Waited for in `step()` (`overlap=\"none\"`, at commit {_commit_of('sweep_nodes_weak', waited)}, the same "
        f"grid, AMD EPYC, {_bits_sent(waited):.0f} bits per parameter and step), the lengthened rounds of 2 end at "
        f"{waited['final_eval_loss']:.3f}, {_gap(waited, base)} against AdamW-HSDP at 3e-3: ahead of the same rounds "
        f"landing late at every evaluation (by {-ahead[200]:.2f} % at step 200), ahead of the unlengthened ones "
        f"landing late but at steps 400 and 600, and {_gap(waited, step_wise)} against the dense step-wise rule, with "
        f"a training loss over the last 200 steps of {_tail(waited):.3f} against {_tail(late):.3f} and "
        f"{_tail(plain):.3f}.")
    _assert_in_prose(prose)
    assert f"What is left to AdamW-HSDP ({_gaps_along(waited, base)[400]:+.2f} % at step 400," in PROSE
    assert abs(_percent(at["estimated"], at["adamw"])) < 0.5


def _against_lengthened_at_4(runs: dict, key: str) -> tuple[dict, dict, float]:
    """Grid nodes_weak's run ``key``, the lengthened exchange at 4 weak nodes it varies (lr 3e-3, outer_lr=1, seed 42)
    and the spread of that exchange's two seeds, in percent: what the variant's margin is read against."""
    own = "flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"
    return runs[key], runs[own], _percent(runs[own + " seed=7"]["final_eval_loss"], runs[own]["final_eval_loss"])


def test_the_compressed_exchange_waited_for_is_the_json():
    """"Weak scaling": the lengthened compressed exchange waited for in step() at 4 weak nodes, against the same
    exchange streamed (a step late, in fragments), AdamW-HSDP and the seeds' spread in rounds of 8."""
    runs = result("sweep_nodes_weak")["runs"]
    waited, streamed, spread = _against_lengthened_at_4(
        runs, "flexdemo lr=0.003 nodes=4 outer_lr=1 overlap=none procs_per_node=2 progress_scale=batch scaling=weak")
    assert (waited["flexdemo_config"]["overlap"], waited["flexdemo_config"]["outer_fragments"]) == ("none", 1)
    assert (streamed["flexdemo_config"]["overlap"], streamed["flexdemo_config"]["outer_fragments"]) == ("delayed", 4)
    base = _best_adamw(runs, 4)
    behind = _gaps_along(waited, streamed)
    early = [gap for step, gap in behind.items() if step <= 1000]
    prose = (
        f"lengthened and waited for in `step()` at 4 weak nodes, it ends {_gap(waited, streamed)} above the same "
        f"exchange streamed.** Grid `nodes_weak` runs `progress_scale=\"batch\"` at lr 3e-3, `outer_lr=1` and "
        f"`overlap=\"none\"` (at commit {_commit_of('sweep_nodes_weak', waited)} from a clean tree, AMD EPYC, "
        f"{_bits_sent(waited):.3f} bits per parameter and step, as streamed). Waited for, the whole model crosses once "
        f"a round (`outer_fragments` resolves to 1), where streamed its 4 fragments cross two steps apart and each "
        f"lands a step later. It ends at {waited['final_eval_loss']:.3f}, {_gap(waited, base)} against AdamW-HSDP at "
        f"3e-3: within {max(early):.2f} % of the streamed exchange to step 1,000, then behind by {behind[1200]:.2f} % "
        f"at step 1,200 and by {behind[2000]:.2f} % at step 2,000, with a training loss over the last 200 steps of "
        f"{_tail(waited):.3f} against {_tail(streamed):.3f}. The margin is "
        f"{_percent(waited['final_eval_loss'], streamed['final_eval_loss']) / spread:.1f} times the seeds' spread in "
        f"rounds of 8 ({spread:.2f} %).")
    _assert_in_prose(prose)
    assert f"{_bits_sent(streamed):.3f}" == f"{_bits_sent(waited):.3f}" and min(early) > 0
    assert min(gap for step, gap in behind.items() if step >= 1200) > 1.9


def _lengthening_study(name: str) -> tuple[dict, dict[tuple[str, int], float]]:
    """A dense_lengthening study's JSON, checked to be the runs the page compares (4 nodes of 32 sequences, 512
    validation pairs, seed 42, from a clean tree), and its validation loss by way and step."""
    study = result(name)
    assert (study["nodes"], study["batch"], study["validation"], study["seed"]) == (4, 32, 512, 42)
    assert not study["git_dirty"]
    return study, {(row["way"], row["step"]): row["eval_loss"] for row in study["rows"]}


def test_the_lengthening_in_rounds_is_the_json():
    """"Weak scaling": the dense_lengthening study in rounds of 2, each node on its own path and walking its lengthened
    steps, against the study's AdamW on the mean gradient and its every-step lengthening."""
    studies = [_lengthening_study(name) for name in ("dense_lengthening", "dense_lengthening_rounds2",
                                                     "dense_lengthening_rounds2_path")]
    _, (own, _), (walked, _) = studies
    # the run on each node's own path is from before the flag, which defaults to it
    assert (own["rounds"], bool(own.get("lengthen_path")), walked["rounds"], walked["lengthen_path"]) == (2, False, 2,
                                                                                                         True)
    loss = [losses for _, losses in studies]
    adamw = loss[0]["adamw", 400]
    ahead = {step: _percent(loss[2]["estimated", step], loss[1]["estimated", step]) for step in (100, 200, 300, 400)}
    assert max(ahead.values()) < 0
    prose = (
        f"walked, the lengthened mean in rounds of 2 ends {_percent(loss[2]['estimated', 400], adamw):+.2f} % from "
        f"AdamW on the mean gradient, where on each node's own path it ends "
        f"{_percent(loss[1]['estimated', 400], adamw):+.2f} %, and unlengthened "
        f"{_percent(loss[1]['mean', 400], adamw):+.2f} %.** `python -m benchmarks.studies.dense_lengthening --rounds 2 "
        f"--ways estimated oracle mean` (`benchmarks/results/dense_lengthening_rounds2.json`, at commit "
        f"{own['git_commit'][:7]} from a clean tree, AMD EPYC) runs the study above in rounds of 2 waited for: each "
        f"node takes 2 steps from the anchor at its own weights, on its own AdamW's path, before the anchor moves by "
        f"the mean of the nodes' lengthened progress. At step 400 the estimated lengthening ends at "
        f"{loss[1]['estimated', 400]:.3f} and the oracle's at {loss[1]['oracle', 400]:.3f}, against {adamw:.3f} for "
        f"AdamW on the mean gradient (the run above: the same initialisation, data and validation pairs) and "
        f"{loss[1]['mean', 400]:.3f} for the rounds unlengthened: the lengthening is "
        f"{_percent(loss[1]['estimated', 400], loss[1]['mean', 400]):+.2f} % against no lengthening, where every step "
        f"it is {_percent(loss[0]['estimated', 400], loss[0]['mean', 400]):+.2f} %. With `--lengthen_path` "
        f"(`benchmarks/results/dense_lengthening_rounds2_path.json`, at commit {walked['git_commit'][:7]} from a clean "
        f"tree, AMD EPYC) each node's weights move by its lengthened steps, so that its second step's gradient is "
        f"taken where the nodes' mean moves: the estimated lengthening ends at {loss[2]['estimated', 400]:.3f} and the "
        f"oracle's at {loss[2]['oracle', 400]:.3f} ({_percent(loss[2]['oracle', 400], adamw):+.2f} %), ahead of the "
        f"own path at every checkpoint (by {-ahead[100]:.2f} % at step 100 and {-ahead[400]:.2f} % at step 400).")
    _assert_in_prose(prose)


def test_the_lengthened_path_in_compressed_rounds_is_the_json():
    """"Weak scaling": progress_scale_path="lengthened" at 4 weak nodes, against each node's own path, AdamW-HSDP and
    the seeds' spread in rounds of 8."""
    runs = result("sweep_nodes_weak")["runs"]
    walked, own, spread = _against_lengthened_at_4(runs, "flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 "
                                                   "progress_scale=batch progress_scale_path=lengthened scaling=weak")
    assert walked["flexdemo_config"]["progress_scale_path"] == "lengthened"
    assert (walked["flexdemo_config"]["overlap"], walked["flexdemo_config"]["outer_fragments"]) == ("delayed", 4)
    behind = _gaps_along(walked, own)
    assert min(behind.values()) > 0
    prose = (
        f"`progress_scale_path=\"lengthened\"` at 4 weak nodes ends {_gap(walked, own)} above each node's own "
        f"path.** Grid `nodes_weak` runs it at lr 3e-3 and `outer_lr=1`, streamed as the defaults stream (at commit "
        f"{_commit_of('sweep_nodes_weak', walked)} from a clean tree, AMD EPYC, {_bits_sent(walked):.3f} bits per "
        f"parameter and step). It ends at {walked['final_eval_loss']:.3f}, {_gap(walked, _best_adamw(runs, 4))} "
        f"against AdamW-HSDP at 3e-3, behind the own path at every evaluation (by {behind[200]:.2f} % at step 200, "
        f"{behind[1000]:.2f} % at step 1,000 and {behind[2000]:.2f} % at step 2,000), with a training loss over the "
        f"last 200 steps of {_tail(walked):.3f} against {_tail(own):.3f}. The margin is "
        f"{_percent(walked['final_eval_loss'], own['final_eval_loss']) / spread:.1f} times the seeds' spread in rounds "
        f"of 8 ({spread:.2f} %).")
    _assert_in_prose(prose)


def test_the_lengthening_in_rounds_of_8_is_the_json():
    """"Weak scaling": the dense_lengthening study in rounds of 8, each node on its own path, walking its lengthened
    steps and unlengthened, against the study's AdamW on the mean gradient."""
    studies = [_lengthening_study(name) for name in ("dense_lengthening", "dense_lengthening_rounds8",
                                                     "dense_lengthening_rounds8_path")]
    (_, every), (own, _), (walked, _) = studies
    assert (own["rounds"], walked["rounds"], own["lengthen_path"], walked["lengthen_path"]) == (8, 8, False, True)
    adamw = every["adamw", 400]
    loss = [losses for _, losses in studies[1:]]
    lengthened, plain, walk = loss[0]["estimated", 400], loss[0]["mean", 400], loss[1]["estimated", 400]
    assert own["git_commit"] == walked["git_commit"]
    prose = (
        f"`benchmarks/results/dense_lengthening_rounds8_path.json`, both at commit {own['git_commit'][:7]} from a "
        f"clean tree, AMD EPYC) ends at step 400 at {lengthened:.3f} lengthened on each node's own path "
        f"({_percent(lengthened, adamw):+.2f} % against AdamW on the mean gradient), {plain:.3f} unlengthened "
        f"({_percent(plain, adamw):+.2f} %) and {walk:.3f} walked ({_percent(walk, adamw):+.2f} %). Walked, the "
        f"lengthening is {_percent(walk, plain):+.2f} % against no lengthening; on the own path it is "
        f"{_percent(lengthened, plain):+.2f} %.")
    _assert_in_prose(prose)


def test_the_walk_in_the_dense_rounds_of_8_is_the_json():
    """"Weak scaling": the dense mean in rounds of 8, walked, at 4 weak nodes, against the dense mean on each node's
    own path, the compressed exchange walked and on its own path, and AdamW-HSDP."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch {}scaling=weak"
    dense_walked, dense, walked, own = (runs[key.format(knobs)] for knobs in (
        "progress_scale_path=lengthened replicator=full ", "replicator=full ", "progress_scale_path=lengthened ", ""))
    config = dense_walked["flexdemo_config"]
    assert (config["replicator"], config["local_steps"], config["progress_scale_path"]) == ("full", 8, "lengthened")
    assert max(_gaps_along(dense_walked, dense).values()) < 0
    prose = (
        f"Grid `nodes_weak` runs `replicator=\"full\"` with `progress_scale_path=\"lengthened\"` at lr 3e-3 and "
        f"`outer_lr=1` (at commit {_commit_of('sweep_nodes_weak', dense_walked)} from a clean tree, AMD EPYC, "
        f"{_bits_sent(dense_walked):.2f} bits per parameter and step). It ends at "
        f"{dense_walked['final_eval_loss']:.3f}, {_gap(dense_walked, _best_adamw(runs, 4))} against AdamW-HSDP at "
        f"3e-3: {_gap(dense_walked, dense)} against the dense mean on each node's own path and ahead of it at every "
        f"evaluation, {_gap(dense_walked, walked)} against the walked compressed exchange, and "
        f"{_gap(dense_walked, own)} against the compressed exchange on each node's own path, with a training loss over "
        f"the last 200 steps of {_tail(dense_walked):.3f} against {_tail(dense):.3f} (dense, own path) and "
        f"{_tail(own):.3f} (compressed, own path). On each node's own path the compression is worth {_gap(own, dense)} "
        f"over the dense mean; walked, it is worth {_gap(walked, dense_walked)}.")
    _assert_in_prose(prose)


def test_the_dense_limit_over_2000_steps_is_the_json():
    """"Weak scaling": the dense_lengthening study over the whole horizon, lengthened and not, against its AdamW on the
    mean gradient, beside the package's dense step-wise rule and its lengthened compressed exchange at 4 weak nodes."""
    study, loss = _lengthening_study("dense_lengthening_long")
    steps = list(range(200, 2001, 200))
    assert study["rounds"] == 1 and sorted({row["step"] for row in study["rows"]}) == steps
    gap = {way: {step: _percent(loss[way, step], loss["adamw", step]) for step in steps}
           for way in ("estimated", "mean")}
    early = [step for step in steps if step <= 1000]
    assert min(gap["estimated"][step] for step in steps if step > 1000) > 0 and min(gap["mean"].values()) > 0
    assert all(gap["mean"][a] < gap["mean"][b] for a, b in zip(steps[4:], steps[5:]))  # further behind from 1,000 on
    last = next(row for row in study["rows"] if (row["way"], row["step"]) == ("estimated", 2000))
    runs = result("sweep_nodes_weak")["runs"]
    compressed = runs["flexdemo lr=0.003 nodes=4 outer_lr=1 procs_per_node=2 progress_scale=batch scaling=weak"]
    step_wise = result("sweep_nodes_weak_step_wise")["runs"][
        "flexdemo lr=0.003 local_steps=1 nodes=4 procs_per_node=2 replicator=full scaling=weak value_dtype=float32"]
    kept = (gap["mean"][2000] - gap["estimated"][2000]) / gap["mean"][2000]
    prose = (
        f"in one process the lengthened mean of every step ends {gap['estimated'][2000]:+.2f} % from AdamW on the mean "
        f"gradient, where unlengthened it ends {gap['mean'][2000]:+.2f} %.** `python -m "
        f"benchmarks.studies.dense_lengthening --at {' '.join(map(str, steps))} --ways adamw estimated mean --out "
        f"benchmarks/results/dense_lengthening_long.json` (at commit {study['git_commit'][:7]} from a clean tree, AMD "
        f"EPYC) runs the study above over the horizon preset's whole 2,000 steps: 4 nodes of 32 sequences, every node "
        f"at the same weights every step. AdamW on the mean gradient ends at {loss['adamw', 2000]:.3f}. The estimated "
        f"lengthening is within {max(abs(gap['estimated'][step]) for step in early):.2f} % of it to step 1,000 and "
        f"behind from step 1,200 on ({gap['estimated'][1200]:+.2f} % there, {gap['estimated'][2000]:+.2f} % at step "
        f"2,000), its factor averaging {last['f_estimated']:.3f} over the last 200 steps where the oracle's on the "
        f"same weights is {last['f_oracle']:.3f}. Unlengthened, the mean ends at {loss['mean', 2000]:.3f}, behind at "
        f"every checkpoint and further behind at each from step 1,000 on ({gap['mean'][1000]:+.2f} % there), as the "
        f"package's dense step-wise rule at 4 weak nodes is {_gap(step_wise, _best_adamw(runs, 4))} against "
        f"AdamW-HSDP (above). So over the long horizon the lengthening takes back {100 * kept:.0f} % of what the "
        f"normalisation before the mean costs in the dense limit, not all of it, and the "
        f"{gap['estimated'][2000]:.1f} points it leaves come late, as the compressed exchange's gap does "
        f"({_gap(compressed, _best_adamw(runs, 4))} at 4 weak nodes)")
    _assert_in_prose(prose)


def test_dilocos_rule_at_4_weak_nodes_is_the_json():
    """"Weak scaling": the dense mean of rounds of 8 waited for at an outer step of 1 (DiLoCo's rule at plain
    averaging), against AdamW-HSDP, the defaults and the lengthened compressed exchange at 4 weak nodes."""
    runs = result("sweep_nodes_weak")["runs"]
    key = "flexdemo lr=0.003 nodes=4 {}procs_per_node=2 {}scaling=weak"
    diloco, defaults, lengthened = (runs[key.format(*knobs)] for knobs in (
        ("outer_lr=1 overlap=none ", "replicator=full "), ("", ""), ("outer_lr=1 ", "progress_scale=batch ")))
    config = diloco["flexdemo_config"]
    assert (config["replicator"], config["local_steps"], config["overlap"], config["outer_fragments"],
            config["outer_lr"], config["progress_scale"]) == ("full", 8, "none", 1, 1.0, "none")
    adamw = _best_adamw(runs, 4)
    assert min(_gaps_along(diloco, adamw).values()) > 0 and min(_gaps_along(diloco, defaults).values()) > 0
    under = -_percent(defaults["final_eval_loss"], diloco["final_eval_loss"])
    nesterov = result("sweep_nodes_outer")["runs"][
        "flexdemo lr=0.003 nodes=8 outer_lr=0.7 outer_momentum=0.9 procs_per_node=1 scaling=strong"]
    prose = (
        f"DiLoCo's own rule is further behind: the dense mean of rounds of 8, waited for, at an outer step of 1, ends "
        f"{_gap(diloco, adamw)} at 4 weak nodes, where the defaults end {under:.2f} % under it at a tenth of its "
        f"bits.** Grid `nodes_weak` runs `replicator=\"full\"` with `overlap=\"none\"` "
        f"and `outer_lr=1` (at commit {_commit_of('sweep_nodes_weak', diloco)} from a clean tree, AMD EPYC, "
        f"{_bits_sent(diloco):.2f} bits per parameter and step)")
    _assert_in_prose(prose)
    assert f"of hundreds of steps, is {_gap(nesterov, _strong_adamw(8))} at 8 nodes, above)" in PROSE
    prose = (
        f"It ends at {diloco['final_eval_loss']:.3f}, behind AdamW-HSDP at every evaluation (by "
        f"{_gaps_along(diloco, adamw)[200]:.2f} % at step 200) and behind the defaults at every evaluation, which send "
        f"{_bits_sent(diloco) / _bits_sent(defaults):.1f} times fewer bits; the lengthened compressed exchange ends "
        f"{-_percent(lengthened['final_eval_loss'], diloco['final_eval_loss']):.2f} % under it, with a training loss "
        f"over the last 200 steps of {_tail(lengthened):.3f} against its {_tail(diloco):.3f}.")
    _assert_in_prose(prose)


def test_the_oracles_dense_limit_over_2000_steps_is_the_json():
    """"Weak scaling": the dense_lengthening study over the whole horizon with the oracle's factor, against the same
    study's AdamW on the mean gradient and its estimated lengthening (one initialisation, data and validation)."""
    oracle_study, oracle = _lengthening_study("dense_lengthening_long_oracle")
    _, loss = _lengthening_study("dense_lengthening_long")
    steps = list(range(200, 2001, 200))
    assert oracle_study["rounds"] == 1 and sorted(step for way, step in oracle if way == "oracle") == steps
    to_adamw = {step: _percent(oracle["oracle", step], loss["adamw", step]) for step in steps}
    behind = {step: _percent(loss["estimated", step], oracle["oracle", step]) for step in steps}
    assert min(value for step, value in behind.items() if step >= 400) > 0
    estimated = _percent(loss["estimated", 2000], loss["adamw", 2000])
    assert round(behind[2000]) == 2 and 0.4 < behind[2000] / estimated < 0.6  # "about two", "about half"
    prose = (
        f"**With the oracle's factor the dense limit ends {to_adamw[2000]:+.2f} % from AdamW over 2,000 steps: about "
        f"half of what the lengthening leaves is its estimate's.** The same study with the oracle's factor (`--ways "
        f"oracle --out benchmarks/results/dense_lengthening_long_oracle.json`, at commit "
        f"{oracle_study['git_commit'][:7]} from a clean tree, AMD EPYC; the same initialisation, data and validation "
        f"pairs) ends at {oracle['oracle', 2000]:.3f}: within "
        f"{max(abs(to_adamw[step]) for step in steps if step <= 1600):.2f} % of AdamW on the mean gradient to step "
        f"1,600, then {to_adamw[1800]:+.2f} % at step 1,800, where it differs from AdamW on the mean by each node "
        f"clipping its own gradient alone. The estimated lengthening is behind the oracle's at every checkpoint from "
        f"step 400 on, by {behind[2000]:.2f} % at step 2,000. So about two of the {estimated:.2f} points")
    _assert_in_prose(prose)
