"""The README's two scripts run as written: each code block is extracted verbatim and launched as the README says,
``accelerate launch --config_file accelerate_configs/cpu_2x2.yaml SCRIPT`` (4 gloo ranks as 2 nodes x 2 processes),
and must train, exchange between the nodes and save a model that loads."""

from __future__ import annotations

import re
from pathlib import Path

from launch import accelerate_launch

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "accelerate_configs" / "cpu_2x2.yaml"
README = (ROOT / "README.md").read_text()


def readme_script(name: str) -> str:
    """The README's ```python block whose first line is ``# name``."""
    blocks = re.findall(r"^```python\n(# " + re.escape(name) + r"\n.*?)^```$", README, flags=re.S | re.M)
    assert len(blocks) == 1, f"the README has {len(blocks)} code blocks starting '# {name}'"
    return blocks[0]


def readme_command(name: str) -> str:
    """The README's CPU launch command of ``name``."""
    command = f"accelerate launch --config_file accelerate_configs/cpu_2x2.yaml {name}"
    assert command in README, command
    return command


def logged(stdout: str, key: str) -> list[float]:
    """Every value of ``key`` in the Trainer's printed log dicts (rank 0 prints them)."""
    return [float(v) for v in re.findall(rf"'{re.escape(key)}': '?([-+0-9.e]+)'?", stdout)]


def run(name: str, tmp_path: Path) -> str:
    readme_command(name)
    script = tmp_path / name
    script.write_text(readme_script(name))
    proc = accelerate_launch(CONFIG, script, [], timeout=240, cwd=tmp_path)
    return proc.stdout


def test_the_causal_lm_quickstart_runs_as_written(tmp_path):
    from transformers import LlamaForCausalLM

    out = run("quickstart.py", tmp_path)
    losses = logged(out, "loss")
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0], losses  # it learns
    assert all(v > 0 for v in logged(out, "flexdemo/bytes_sent"))  # the two nodes exchange
    assert min(logged(out, "flexdemo/compression_ratio")) > 35  # rounds of 4: about 41 x fewer bytes than bf16
    assert logged(out, "flexdemo/outer_rounds")[-1] == 12  # 48 steps in rounds of 4, the defaults' under 1,000 steps
    assert logged(out, "flexdemo/final_round_bytes_sent")  # the end-of-run landing
    model = LlamaForCausalLM.from_pretrained(tmp_path / "quickstart-out")  # the README's comment
    assert model.config.vocab_size == 256


def test_the_t5_snippet_runs_as_written(tmp_path):
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    out = run("t5_quickstart.py", tmp_path)
    losses = logged(out, "loss")
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0], losses
    assert all(v > 0 for v in logged(out, "flexdemo/bytes_sent"))
    assert logged(out, "flexdemo/outer_rounds")[-1] == 12  # 48 steps in rounds of 4
    (eval_loss,) = (float(v) for v in re.findall(r"^\s*eval_loss\s*=\s*([0-9.]+)$", out, flags=re.M))  # rank 0's
    assert eval_loss < losses[0]
    model = T5ForConditionalGeneration.from_pretrained(tmp_path / "t5-out")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "t5-out")
    assert model.config.vocab_size == len(tokenizer)
