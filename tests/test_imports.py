"""The optimizer imports without the Hugging Face stack; the trainers load it on first use; the library
never imports the recipes or the benchmarks; the layout table of docs/how-it-works.md names every library
module."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import hf_flexdemo

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


# Modules that need the Hugging Face stack: never imported by ``import hf_flexdemo``.
SEQ2SEQ_MODULES = ("hf_flexdemo.arguments", "hf_flexdemo.seq2seq_data", "hf_flexdemo.seq2seq_metrics",
                   "hf_flexdemo.seq2seq_model")


def test_every_library_module_imports_without_the_recipes_or_benchmarks():
    modules = sorted(f"hf_flexdemo.{m.name}" for m in pkgutil.iter_modules(hf_flexdemo.__path__) if not m.ispkg)
    assert set(SEQ2SEQ_MODULES) <= set(modules)
    loaded = _run(
        "import importlib, sys\n"
        "sys.path = [p for p in sys.path if not p.rstrip('/').endswith(('recipes', 'benchmarks'))]\n"
        "import hf_flexdemo\n"
        f"print(sorted(m for m in {SEQ2SEQ_MODULES!r} if m in sys.modules))\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('seq2seq', 'convergence_worker') if m in sys.modules))\n"
    )
    assert loaded.split("\n")[:2] == ["[]", "[]"]


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


def test_the_docs_layout_names_every_library_module():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "how-it-works.md").read_text()
    layout = docs.split("### Layout", 1)[1]
    names = {m.name for m in pkgutil.iter_modules(hf_flexdemo.__path__)} - {"metric_scripts"}
    missing = sorted(name for name in names if f"`{name}`" not in layout and f"`{name}/`" not in layout)
    assert not missing, f"the Layout table of docs/how-it-works.md lacks {missing}"
