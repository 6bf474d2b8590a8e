"""The optimizer imports without the Hugging Face stack; the trainers load it on first use."""

import subprocess
import sys

HEAVY = ("transformers", "accelerate", "datasets", "evaluate")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_optimizer_import_leaves_the_hf_stack_unloaded():
    loaded = _run(
        "import sys\n"
        "from hf_flexdemo import FlexDeMo, FlexDeMoConfig, build_hybrid_mesh, resolve_shard_size\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert loaded.strip() == "[]"


def test_trainer_symbols_load_on_first_access():
    out = _run(
        "import sys\n"
        "import hf_flexdemo\n"
        "assert 'transformers' not in sys.modules\n"
        "from hf_flexdemo import FlexDeMoSeq2SeqTrainer, FlexDeMoTrainer\n"
        "import transformers\n"
        "print(issubclass(FlexDeMoSeq2SeqTrainer, transformers.Seq2SeqTrainer), "
        "issubclass(FlexDeMoTrainer, transformers.Trainer), 'FlexDeMoTrainer' in dir(hf_flexdemo))\n"
    )
    assert out.split() == ["True", "True", "True"]
