"""``FlexDeMoConfig``: the training setup in one dataclass that ``HfArgumentParser`` can fill.

Choices are ``Literal`` types, so ``--help`` lists them and argparse refuses anything else; the
optimizer validates the same fields again (with the accepted values in the message) when the config
is built in code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from .compression import Consensus
from .guards import DriftAction, NonfiniteAction
from .optimizer import (
    DEFAULT_BUCKET_MB,
    DEFAULT_CHUNK,
    DEFAULT_MAX_RATE,
    DEFAULT_MIN_RATE,
    DEFAULT_RATE,
    Momentum,
    Overlap,
    Replicator,
    Update,
    ValueDtype,
    validate_knobs,
)

Method = Literal["flexdemo", "demo", "adamw"]
METHODS: tuple[str, ...] = get_args(Method)


@dataclass
class FlexDeMoConfig:
    """How to train across nodes. ``method`` picks the whole setup; the rest tunes FlexDeMo.

    * ``flexdemo``: FSDP2 inside each node, FlexDeMo (compressed momentum) across nodes.
    * ``demo``: no sharding; every rank is its own replica and DeMo runs across all of them.
    * ``adamw``: the stock baseline: FSDP2 HSDP (dense all-reduce across nodes) with torch AdamW.
    """

    method: Method = field(default="flexdemo", metadata={"help": "Training setup."})
    compression_rate: float | None = field(
        default=None,
        metadata={"help": f"Fraction of each DCT block's coefficients that travels between nodes (default "
                          f"{DEFAULT_RATE:g} unless compression_topk is set)."},
    )
    compression_topk: int | None = field(
        default=None, metadata={"help": "DeMo's convention instead of a rate: coefficients kept per block."}
    )
    compression_chunk: int = field(default=DEFAULT_CHUNK, metadata={"help": "Largest DCT block side."})
    compression_decay: float = field(default=0.999, metadata={"help": "Momentum decay in [0, 1)."})
    compression_feedback: float = field(
        default=1.0, metadata={"help": "Fraction of the sent signal error feedback removes from the momentum."}
    )
    momentum: Momentum = field(
        default="adam", metadata={"help": "A gradient enters the momentum as lr * g (lr), (1 - decay) * g (ema), or "
                                        "AdamW's first moment (avg) or direction m / (sqrt(v) + eps) (adam)."}
    )
    update: Update = field(default="sgd", metadata={"help": "Update rule."})
    replicator: Replicator = field(default="demo", metadata={"help": "Cross-node exchange."})
    consensus: Consensus = field(
        default="replicas",
        metadata={"help": "replicator='demo': a coefficient is the mean over the replicas that chose it (choosers, "
                          "DeMo) or over all replicas (replicas: the mean momentum)."},
    )
    value_dtype: ValueDtype = field(
        default="auto",
        metadata={"help": "Wire type of coefficients (float8: e4m3 with a bfloat16 scale per block, demo only; auto: "
                          "float8 for replicator='demo', else bfloat16)."},
    )
    replicator_seed: int = field(default=0, metadata={"help": "Seed of replicator='random''s shared positions."})
    overlap: Overlap = field(
        default="none",
        metadata={"help": "When the exchange runs: in step() (none), started per bucket during backward (backward: "
                          "the same update), or travelling during the next step (delayed: one step stale)."},
    )
    bucket_cap_mb: float = field(default=DEFAULT_BUCKET_MB, metadata={"help": "Exchange bucket size in MB (DDP's)."})
    budget_bytes: int | None = field(
        default=None, metadata={"help": "Instead of a rate: inter-node bytes per step and rank the exchange may send."}
    )
    budget_fraction: float | None = field(
        default=None,
        metadata={"help": "Instead of a rate: the fraction of the step time the step may wait on the exchange "
                          "(the rate follows measured times, agreed by every rank)."},
    )
    budget_min_rate: float = field(default=DEFAULT_MIN_RATE, metadata={"help": "Lowest rate a budget may choose."})
    budget_max_rate: float = field(default=DEFAULT_MAX_RATE, metadata={"help": "Highest rate a budget may choose."})
    on_nonfinite: NonfiniteAction = field(
        default="skip", metadata={"help": "A NaN/Inf gradient on any rank: every rank skips the step, or raises."}
    )
    drift_check_every: int = field(
        default=100, metadata={"help": "Compare parameter fingerprints across nodes every N steps (0: never)."}
    )
    on_drift: DriftAction = field(default="raise", metadata={"help": "Replicas found different."})
    shard_size: int | None = field(
        default=None,
        metadata={"help": "Processes per node (FSDP group size). Default: from the launcher (accelerate's "
                          "parallelism_config_dp_shard_size, else LOCAL_WORLD_SIZE)."},
    )
    reduce_dtype: Literal["float32", "bfloat16"] = field(
        default="float32",
        metadata={"help": "method='adamw' only: dtype of FSDP2's gradient reduce-scatter and cross-node all-reduce "
                          "(MixedPrecisionPolicy.reduce_dtype; float32 as torchtitan, bfloat16 halves the bytes)."},
    )

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"FlexDeMoConfig: invalid method={self.method!r}; accepted: {' | '.join(METHODS)}.")
        if self.shard_size is not None and (not isinstance(self.shard_size, int) or self.shard_size < 1):
            raise ValueError(
                f"FlexDeMoConfig: invalid shard_size={self.shard_size!r}; accepted: None or an integer >= 1."
            )
        if self.reduce_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"FlexDeMoConfig: invalid reduce_dtype={self.reduce_dtype!r}; accepted: float32 | "
                             "bfloat16.")
        if self.reduce_dtype != "float32" and self.method != "adamw":
            raise ValueError(f"FlexDeMoConfig: reduce_dtype={self.reduce_dtype!r} with method={self.method!r}; "
                             "accepted: reduce_dtype='float32' unless method='adamw' (it sets the AdamW-HSDP "
                             "baseline's gradient reduction; FlexDeMo's exchange has its own wire type, "
                             "value_dtype).")
        validate_knobs(**self.optimizer_kwargs())

    def optimizer_kwargs(self) -> dict[str, Any]:
        """The FlexDeMo constructor arguments this config sets."""
        return {k: v for k, v in asdict(self).items() if k not in ("method", "shard_size", "reduce_dtype")}
