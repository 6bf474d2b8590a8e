"""The layers: each folder imports only the ones below it (the wire, the optimizer core, the Trainer integration, the
recipes' support); the core imports torch only and loads without the Hugging Face stack; the trainers load on first
use; the library never imports the recipes or the benchmarks; docs/how-it-works.md names every folder and module."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import hf_flexdemo

HEAVY = ("transformers", "accelerate", "datasets", "evaluate")
PACKAGE = Path(hf_flexdemo.__file__).parent
# Bottom to top: a module may import its own layer and the layers before it (the root modules are the vocabulary
# every layer shares; doctor, launch and testing are tools on top of the core).
LAYERS = ("root", "wire", "optim", "trainer", "seq2seq", "tools")
ROOT_MODULES = {"knobs", "policies"}
TOOLS = {"doctor", "launch", "testing", "__init__"}
TORCH_ONLY = ("root", "wire", "optim")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) == 1:
        return "root" if rel.stem in ROOT_MODULES else "tools"
    return rel.parts[0]


def _runtime_imports(path: Path) -> list[str]:
    """Absolute names of what ``path`` imports when it runs (not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    parts = ["hf_flexdemo", *path.relative_to(PACKAGE).with_suffix("").parts]
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    names = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
                names += [f"{target}.{alias.name}" for alias in node.names] if not node.module else [target]
            else:
                names.append(node.module)
    return names


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "metric_scripts" not in p.parts)


def _layer_of_name(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "hf_flexdemo" or len(parts) == 1:
        return None
    if parts[1] in LAYERS[1:5]:
        return parts[1]
    return "root" if parts[1] in ROOT_MODULES else "tools"


def test_every_folder_imports_only_the_layers_below_it():
    wrong = []
    for path in _modules():
        here = LAYERS.index(_layer(path))
        for name in _runtime_imports(path):
            layer = _layer_of_name(name)
            if layer is not None and LAYERS.index(layer) > here:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not wrong, wrong


def test_the_core_imports_torch_and_the_standard_library_only():
    allowed = set(sys.stdlib_module_names) | {"torch", "hf_flexdemo"}
    wrong = [f"{path.relative_to(PACKAGE)} imports {name}" for path in _modules() if _layer(path) in TORCH_ONLY
             for name in _runtime_imports(path) if name.split(".")[0] not in allowed]
    assert not wrong, wrong


def test_optimizer_import_leaves_the_hf_stack_unloaded():
    loaded = _run(
        "import sys\n"
        "from hf_flexdemo import CompressionPolicy, FlexDeMo, FlexDeMoConfig, build_hybrid_mesh, resolve_shard_size\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert loaded.strip() == "[]"


def test_every_library_module_imports_without_the_recipes_or_benchmarks():
    modules = sorted(m.name for m in pkgutil.walk_packages(hf_flexdemo.__path__, "hf_flexdemo.")
                     if "metric_scripts" not in m.name)
    assert "hf_flexdemo.seq2seq.data" in modules and "hf_flexdemo.optim.optimizer" in modules
    loaded = _run(
        "import importlib, sys\n"
        "sys.path = [p for p in sys.path if not p.rstrip('/').endswith(('recipes', 'benchmarks'))]\n"
        "import hf_flexdemo\n"
        "print(sorted(m for m in sys.modules if m.startswith('hf_flexdemo.seq2seq')))\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('seq2seq', 'convergence_worker', 'harness') if m in sys.modules))\n"
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


def test_the_docs_layout_names_every_folder_and_module():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "how-it-works.md").read_text()
    layout = docs.split("### Layout", 1)[1]
    names = {str(p.relative_to(PACKAGE).with_suffix("")).replace("/__init__", "/") for p in _modules()} - {"__init__"}
    missing = sorted(name for name in names if f"`{name}`" not in layout)
    assert not missing, f"the Layout table of docs/how-it-works.md lacks {missing}"
