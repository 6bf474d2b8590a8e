"""The recipes as commands: ``--help`` (FlexDeMo's flags under their own heading, one default each) and bad input
ending the job with one ``error: <message>`` line (once per job on several ranks:
tests/distributed/test_recipe_cli_distributed.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRANSLATION = ROOT / "recipes" / "t5_translation.py"
KNOB_PRESET_ERROR = ("error: invalid data_preset='flexdemo-paper'; accepted: opus_books_en_fr | wikihow (the FlexDeMo "
                     "paper's data sets). 'flexdemo-paper' is a set of FlexDeMo knob values, not a data set: pass "
                     "--flexdemo_preset flexdemo-paper")


def recipe(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python recipes/t5_translation.py argv`` in one process, offline."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HF_FLEXDEMO_TRACEBACK"):
        if name not in (env or {}):
            full_env.pop(name, None)
    return subprocess.run([sys.executable, str(TRANSLATION), *argv], capture_output=True, text=True, timeout=300,
                          env=full_env, cwd=cwd)


def help_entries(text: str) -> dict[str, str]:
    """Each flag's ``--help`` entry, its lines joined: first option string -> text."""
    options = text.split("\noptions:\n", 1)[1]
    entries = re.split(r"\n  (?=-)", "\n" + options)
    return {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries if entry.strip().startswith("-")}


@pytest.fixture(scope="module")
def help_text() -> str:
    proc = recipe("--help")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_lists_flexdemos_flags_under_their_own_heading(help_text: str) -> None:
    headings = re.findall(r"^(\S[^\n]*):$", help_text, flags=re.M)
    assert headings == ["options", "Model (ModelArguments)", "Data (DataTrainingArguments)",
                        "Training (transformers' Seq2SeqTrainingArguments)",
                        "FlexDeMo (FlexDeMoConfig: the method and the optimizer's knobs, docs/configuration.md)"]
    flexdemo = help_text.split("\nFlexDeMo (FlexDeMoConfig", 1)[1]
    for flag in ("--method", "--flexdemo_preset", "--local_steps", "--compression_rate", "--resume_policy"):
        assert f"\n  {flag} " in flexdemo, flag
    assert "\n  --learning_rate " not in flexdemo and "\n  --data_preset " not in flexdemo


def test_every_flag_shows_one_default(help_text: str) -> None:
    entries = help_entries(help_text)
    assert len(entries) > 150
    for flag, entry in entries.items():
        if flag in ("-h", "--config"):
            continue
        assert entry.count("(default") <= 1, entry
        assert re.search(r"default", entry, flags=re.I), entry  # argparse's, or the one the text states
    # the help texts that state their own default no longer get argparse's (None) as well
    assert entries["--source_lang"].endswith("Source language code (default: en).")
    for flag in ("--target_lang", "--text_column", "--summary_column", "--source_prefix", "--max_source_length",
                 "--max_target_length", "--validation_split_percentage", "--config_name", "--outer_fragments"):
        assert "(default: None)" not in entries[flag], entries[flag]


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_knob_preset_as_data_preset_is_one_error_line() -> None:
    assert _one_error_line(recipe("--data_preset", "flexdemo-paper")) == KNOB_PRESET_ERROR


def test_an_argparse_error_is_one_error_line() -> None:
    line = _one_error_line(recipe("--method", "sgd"))
    assert line == "error: argument --method: invalid choice: 'sgd' (choose from 'flexdemo', 'demo', 'adamw')"


def test_a_typo_in_the_config_file_names_the_close_match_without_listing_every_field(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"max_stepz: 3\noutput_dir: {tmp_path / 'out'}\n")
    line = _one_error_line(recipe("--config", str(config)))
    assert line.startswith(f"error: --config {config}: unknown argument(s) ['max_stepz'] (did you mean 'max_steps' "
                           "for 'max_stepz'?); the ")
    assert "accepted fields are the flags --help lists" in line and len(line) < 300


def test_the_traceback_is_shown_when_asked_for() -> None:
    proc = recipe("--data_preset", "flexdemo-paper", env={"HF_FLEXDEMO_TRACEBACK": "1"})
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith("ValueError: " + KNOB_PRESET_ERROR.removeprefix("error: "))
