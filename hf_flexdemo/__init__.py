"""FlexDeMo for the Hugging Face stack: FSDP2 inside a node, compressed momentum between nodes."""

from .config import FlexDeMoConfig
from .mesh import build_hybrid_mesh, shard_model
from .optimizer import FlexDeMo
from .trainer import FlexDeMoSeq2SeqTrainer, FlexDeMoTrainer

__all__ = [
    "FlexDeMo",
    "FlexDeMoConfig",
    "FlexDeMoSeq2SeqTrainer",
    "FlexDeMoTrainer",
    "build_hybrid_mesh",
    "shard_model",
]
__version__ = "0.1.0"
