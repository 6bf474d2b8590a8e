"""The recipe launched on several ranks: bad input ends the job with one ``error: <message>`` line, once per job
(in one process, and ``--help``: tests/integration/test_recipe_cli.py)."""

from __future__ import annotations

from pathlib import Path

from launch import torchrun

TRANSLATION = Path(__file__).resolve().parents[2] / "recipes" / "t5_translation.py"
# the one-process message (tests/integration/test_recipe_cli.py)
KNOB_PRESET_ERROR = ("error: invalid data_preset='flexdemo-paper'; accepted: opus_books_en_fr | wikihow (the FlexDeMo "
                     "paper's data sets). 'flexdemo-paper' is a set of FlexDeMo knob values, not a data set: pass "
                     "--flexdemo_preset flexdemo-paper")


def test_bad_input_on_two_ranks_is_reported_once_for_the_job() -> None:
    """Both ranks refuse the flag; rank 0 reports it, the launcher ends rank 1 (which waits for that), and neither
    prints a traceback of the recipe (the launcher still prints its own summary of the failed ranks)."""
    proc = torchrun(TRANSLATION, 2, ["--data_preset", "flexdemo-paper"], timeout=240, check=False,
                    env={"HF_HUB_OFFLINE": "1"})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert output.count(KNOB_PRESET_ERROR) == 1, output
    assert "(rank 1)" not in output and 'seq2seq.py", line' not in output, output
