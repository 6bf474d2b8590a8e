"""``FlexDeMoConfig``: the training setup in one dataclass that ``HfArgumentParser`` can fill."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .optimizer import REPLICATORS, UPDATES, VALUE_DTYPES, validate_compression, validate_guards

METHODS = ("flexdemo", "demo", "adamw")


@dataclass
class FlexDeMoConfig:
    """How to train across nodes. ``method`` picks the whole setup; the rest tunes FlexDeMo.

    * ``flexdemo``: FSDP2 inside each node, FlexDeMo (compressed momentum) across nodes.
    * ``demo``: no sharding; every rank is its own replica and DeMo runs across all of them.
    * ``adamw``: the stock baseline: FSDP2 HSDP (dense all-reduce across nodes) with torch AdamW.
    """

    method: str = field(default="flexdemo", metadata={"help": f"Training setup: {' | '.join(METHODS)}."})
    compression_topk: int = field(default=4, metadata={"help": "DCT coefficients kept per block."})
    compression_chunk: int = field(default=64, metadata={"help": "Largest DCT block side."})
    compression_decay: float = field(default=0.999, metadata={"help": "Momentum decay in [0, 1)."})
    update: str = field(default="sign", metadata={"help": f"Update rule: {' | '.join(UPDATES)}."})
    replicator: str = field(default="demo", metadata={"help": f"Cross-node exchange: {' | '.join(REPLICATORS)}."})
    value_dtype: str = field(
        default="bfloat16", metadata={"help": f"Wire type of coefficients: {' | '.join(VALUE_DTYPES)}."}
    )
    on_nonfinite: str = field(
        default="skip", metadata={"help": "A NaN/Inf gradient on any rank: every rank skips the step, or raises."}
    )
    drift_check_every: int = field(
        default=100, metadata={"help": "Compare parameter fingerprints across nodes every N steps (0: never)."}
    )
    on_drift: str = field(default="raise", metadata={"help": "Replicas found different: raise | resync."})
    shard_size: int | None = field(
        default=None,
        metadata={"help": "Processes per node (FSDP group size). Default: from the launcher (accelerate's "
                          "parallelism_config_dp_shard_size, else LOCAL_WORLD_SIZE)."},
    )

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"FlexDeMoConfig: invalid method={self.method!r}; accepted: {' | '.join(METHODS)}.")
        if self.shard_size is not None and (not isinstance(self.shard_size, int) or self.shard_size < 1):
            raise ValueError(
                f"FlexDeMoConfig: invalid shard_size={self.shard_size!r}; accepted: None or an integer >= 1."
            )
        validate_compression(self.compression_topk, self.compression_chunk, self.compression_decay, self.update,
                             self.replicator, self.value_dtype)
        validate_guards(self.on_nonfinite, self.drift_check_every, self.on_drift)

    def optimizer_kwargs(self) -> dict[str, Any]:
        """The FlexDeMo constructor arguments this config sets."""
        return {k: v for k, v in asdict(self).items() if k not in ("method", "shard_size")}
