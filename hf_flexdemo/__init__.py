"""FlexDeMo for the Hugging Face stack: FSDP2 inside a node, compressed momentum between nodes."""

from .mesh import build_hybrid_mesh, shard_model
from .optimizer import FlexDeMo

__all__ = ["FlexDeMo", "build_hybrid_mesh", "shard_model"]
__version__ = "0.1.0"
