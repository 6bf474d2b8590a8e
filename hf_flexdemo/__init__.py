"""FlexDeMo for the Hugging Face stack: FSDP2 inside a node, compressed momentum between nodes.

The optimizer, its config and the mesh helpers need only torch, so they are imported eagerly. The
trainers need transformers and accelerate (seconds to import): they load on first access, so that
``from hf_flexdemo import FlexDeMo`` stays a torch-only import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .optim.mesh import build_hybrid_mesh, resolve_shard_size, shard_model
from .optim.optimizer import FlexDeMo
from .policies import BudgetPolicy, CompressionPolicy, GuardPolicy, OuterPolicy, StepRulePolicy
from .trainer.config import FlexDeMoConfig

if TYPE_CHECKING:
    from .trainer.trainer import FlexDeMoSeq2SeqTrainer, FlexDeMoTrainer

_LAZY = {"FlexDeMoTrainer": "trainer.trainer", "FlexDeMoSeq2SeqTrainer": "trainer.trainer"}

__all__ = [
    "BudgetPolicy",
    "CompressionPolicy",
    "FlexDeMo",
    "FlexDeMoConfig",
    "FlexDeMoSeq2SeqTrainer",
    "FlexDeMoTrainer",
    "GuardPolicy",
    "OuterPolicy",
    "StepRulePolicy",
    "build_hybrid_mesh",
    "resolve_shard_size",
    "shard_model",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import the trainer symbols (and with them transformers/accelerate) on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
