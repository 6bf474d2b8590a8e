"""The front door: the README stays a five-minute read (at most 250 lines, no history), its links and the docs'
resolve, docs/configuration.md is what docs/generate_configuration.py writes from the knobs' definition today, and
the figures the README and docs/how-it-works.md quote are the committed results'."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
RESULTS_PAGE = (DOCS / "results.md").read_text()


def result(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())


def prose(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_is_short_and_has_no_history():
    assert len(README.splitlines()) <= 250
    assert not re.findall(r"#\d+|\bissues?\s+\d+", README, flags=re.I), "issue numbers belong in docs/results.md"
    hashes = [word for word in re.findall(r"\b[0-9a-f]{7,40}\b", README) if re.search(r"\d", word)
              and re.search(r"[a-f]", word)]
    assert not hashes, f"commit hashes in the README: {hashes}"
    assert not re.findall(r"EPYC|Xeon|AMD|Intel", README), "CPU models belong in docs/results.md"


def test_the_readme_links_every_doc_and_every_link_resolves():
    for page in PAGES:
        assert f"(docs/{page.name}" in README, f"the README does not link docs/{page.name}"
    for source in (ROOT / "README.md", *PAGES):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", source.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (source.parent / target).exists(), f"{source.name} links {target}, which does not exist"


def test_anchors_into_the_docs_name_a_heading():
    """A link's ``#anchor`` is the GitHub slug of a heading in the page it points to."""

    def slugs(page: Path) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}

    for source in (ROOT / "README.md", *PAGES):
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", source.read_text()):
            page = source.parent / target if target else source
            if page.suffix == ".md" and page.is_relative_to(ROOT):
                assert anchor in slugs(page), f"{source.name} links {target}#{anchor}: no such heading"


def test_the_configuration_page_is_generated_from_the_knobs():
    spec = importlib.util.spec_from_file_location("generate_configuration", DOCS / "generate_configuration.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (DOCS / "configuration.md").read_text() == generator.render(), (
        "docs/configuration.md is stale: run `make docs` (python docs/generate_configuration.py)")


def test_the_configuration_page_has_every_knob_and_field():
    import dataclasses

    from hf_flexdemo import knobs
    from hf_flexdemo.trainer.config import FlexDeMoConfig

    page = (DOCS / "configuration.md").read_text()
    names = {*knobs.DEFAULTS, *(field.name for field in dataclasses.fields(FlexDeMoConfig))}
    missing = sorted(name for name in names if f"### `{name}`" not in page)
    assert not missing, missing
    for name, help_text in knobs.HELP.items():
        assert help_text in page, name


def test_the_readme_headline_table_is_the_json():
    """The README's bits row, and the results summary's gaps landing after one step on the Xeon (the README's loss and
    time rows, at today's defaults, are checked in test_readme_results.py), from the same JSON as docs/results.md."""
    sweep, xeon = result("sweep_local"), result("convergence_quick_xeon")
    defaults = {"local_steps": 8, "value_dtype": "int2", "overlap": "delayed", "outer_fragments": 4,
                "compression_transform": "none"}
    runs = [r for r in sweep["runs"].values() if r["status"] == "ok"]

    def final(method: str, seed: int, **knobs) -> float:
        (run,) = [r for r in runs if r["method"] == method and r["knobs"].get("seed", 42) == seed
                  and all(r["knobs"].get(k) == v for k, v in knobs.items())]
        return run["curve"][-1]["eval_loss"]

    gaps = [100 * (final("flexdemo", 42, **defaults) / xeon["methods"]["adamw"]["final_eval_loss"] - 1),
            100 * (final("flexdemo", 7, **defaults) / final("adamw", 7) - 1)]
    long = {(r["method"], r["knobs"].get("local_steps"), r["knobs"].get("compression_transform"),
             r["knobs"].get("seed", 42)): r["curve"][-1]["eval_loss"]
            for r in result("sweep_local_long")["runs"].values() if r["status"] == "ok"}
    long_gaps = [100 * (long["flexdemo", 8, "none", seed] / long["adamw", None, None, seed] - 1) for seed in (42, 7)]
    assert f" / {sum(gaps) / 2:+.2f} % / {sum(long_gaps) / 2:+.2f} % | – |" in RESULTS_PAGE

    data = result("replicator_bytes")
    row = next(r for r in data["rows"] if r["replicas"] == 2)
    bits = {name: 8 * row["bytes"][name] / data["local_shard"]["numel"] for name in ("demo", "adamw_bf16")}
    assert f"| {bits['demo']:.2f} | {bits['adamw_bf16']:.0f} (bf16) |" in README


def test_the_results_summary_is_the_json():
    """docs/results.md's summary table quotes figures its sections check; the bits per parameter are computed."""
    data = result("replicator_bytes")
    row = next(r for r in data["rows"] if r["replicas"] == 2)
    bits = 8 * row["bytes"]["demo"] / data["local_shard"]["numel"]
    summary = RESULTS_PAGE.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert f"| {bits:.2f} | 16 (bf16), 32 (fp32) |" in summary
    assert f"about {data['crossover']['demo_ge_dense_bf16_from_R_exact']:.0f} |" in summary
    ratio = result("optimizer_step")["ratios"]["flexdemo/adamw (mean)"]
    assert f"| {ratio:.2f} | 1 |" in summary
    r = result("time_to_target_rounds_of_8_no_transform")["vs_compute_only"]
    assert (f"| {r['10']['flexdemo']:.2f} / {r['25']['flexdemo']:.2f} / {r['1000']['flexdemo']:.2f} | "
            f"{r['10']['adamw_projected']:.2f} / {r['25']['adamw_projected']:.2f} (both projected: stopped by the "
            f"run's budget) / {r['1000']['adamw']:.2f} |") in summary
    quick = result("convergence_quick")["methods"]
    assert f"| {quick['adamw']['bytes_sent']['per_step'] / 2 / quick['flexdemo']['bytes_sent']['per_step']:.1f} × " \
           "fewer than bf16 AdamW-HSDP |" in summary
    weak = next(line for line in README.splitlines() if "(weak scaling)" in line).rsplit("|", 3)[1]
    assert re.fullmatch(r"( [+-]\d+\.\d+ % /)* [+-]\d+\.\d+ % ", weak)
    assert f"|{weak}| – |" in summary  # the README's weak-scaling row, checked against the JSON


@pytest.mark.parametrize("page", ["how-it-works.md"])
def test_the_figures_in_why_the_defaults_are_the_results(page):
    """Every decimal figure (``1.24 ×``, ``+1.96 %``) that "Why the defaults" quotes is one docs/results.md holds."""
    section = (DOCS / page).read_text().split("## Why the defaults", 1)[1].split("\n## ", 1)[0]
    figures = re.findall(r"[+-]?\d+\.\d+ [×%]", section)
    assert figures
    missing = [figure for figure in figures if figure not in prose(RESULTS_PAGE)]
    assert not missing, missing
