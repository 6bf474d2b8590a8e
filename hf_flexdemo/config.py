"""``FlexDeMoConfig``: the training setup in one dataclass that ``HfArgumentParser`` can fill.

Choices are ``Literal`` types, so ``--help`` lists them and argparse refuses anything else. Defaults,
help texts and validation come from :mod:`hf_flexdemo.knobs`, the same source ``FlexDeMo`` reads, so the
config and the optimizer cannot disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from . import knobs
from .knobs import (
    Consensus,
    DriftAction,
    Momentum,
    NonfiniteAction,
    Overlap,
    Preset,
    Replicator,
    Transform,
    Update,
    ValueDtype,
)

Method = Literal["flexdemo", "demo", "adamw"]
METHODS: tuple[str, ...] = get_args(Method)
ReduceDtype = Literal["float32", "bfloat16"]
REDUCE_DTYPES: tuple[str, ...] = get_args(ReduceDtype)
# What a new node's per-node optimizer state starts from when a checkpoint resumes on another topology
# (hf_flexdemo.reshard).
ResumePolicy = Literal["average", "reset", "keep"]
RESUME_POLICIES: tuple[str, ...] = get_args(ResumePolicy)
RESUME_POLICY_HELP = (
    "Resuming a checkpoint written on another topology (nodes x processes per node): what each new node's per-node "
    "optimizer state (error feedback, the replica's gradient moments; with local steps the inner AdamW moments and "
    "a mid-round local shard) starts from. average: the mean over the old nodes; reset: zeros, as a fresh "
    "optimizer; keep: new node n takes old node n's (the number of nodes unchanged, e.g. a new number of processes "
    "per node). Replicated state (anchor, consensus-fed AdamW moments, step counts) reshards exactly under every "
    "policy. None (the default): refuse a topology change, since it cannot resume exactly (per-node momentum is "
    "merged or dropped, and the global batch changes with the world size); a wrong launch would otherwise continue "
    "as a different run without a word. The same topology always resumes exactly.")
# the rest are FlexDeMo's keywords
_SETUP_FIELDS = ("method", "flexdemo_preset", "shard_size", "reduce_dtype", "resume_policy")


def _knob(name: str) -> Any:
    """A dataclass field for the FlexDeMo knob ``name``: its default and help from :mod:`hf_flexdemo.knobs`."""
    return field(default=knobs.DEFAULTS[name], metadata={"help": knobs.HELP[name]})


@dataclass
class FlexDeMoConfig:
    """How to train across nodes. ``method`` picks the whole setup; the rest tunes FlexDeMo.

    * ``flexdemo``: FSDP2 inside each node, FlexDeMo (compressed momentum) across nodes.
    * ``demo``: no sharding; every rank is its own replica and DeMo runs across all of them.
    * ``adamw``: the stock baseline: FSDP2 HSDP (dense all-reduce across nodes) with torch AdamW.

    The learning rate, weight decay and AdamW constants come from ``TrainingArguments``.

    What does not apply is refused rather than ignored: with ``method="adamw"`` the FlexDeMo knobs (every field
    but ``method``, ``shard_size``, ``reduce_dtype`` and ``resume_policy``) and ``flexdemo_preset`` must stay at
    their defaults, since the baseline runs torch's AdamW and FSDP's dense all-reduce and reads none of them;
    ``reduce_dtype`` is the baseline's alone; ``method="demo"`` shards nothing, so ``shard_size`` is ``None`` or 1;
    a knob that only acts with another one (``outer_*`` with ``local_steps > 1``, the budget's rate bounds with a
    budget) is refused without it (:func:`hf_flexdemo.knobs.validate`).
    """

    method: Method = field(default="flexdemo", metadata={"help": "Training setup: flexdemo (FSDP2 inside each node, "
                                           "FlexDeMo between nodes), demo (every rank a replica, DeMo), adamw "
                                           "(FSDP2 HSDP with torch AdamW, the baseline)."})
    # Named flexdemo_preset, as the recipes' data set of the paper is --data_preset: "preset" alone means either.
    flexdemo_preset: Preset = field(default="default", metadata={"help": knobs.PRESET_HELP})
    compression_rate: float | None = _knob("compression_rate")
    compression_topk: int | None = _knob("compression_topk")
    compression_chunk: int = _knob("compression_chunk")
    compression_transform: Transform = _knob("compression_transform")
    compression_decay: float = _knob("compression_decay")
    compression_feedback: float = _knob("compression_feedback")
    momentum: Momentum = _knob("momentum")
    update: Update = _knob("update")
    replicator: Replicator = _knob("replicator")
    consensus: Consensus = _knob("consensus")
    value_dtype: ValueDtype = _knob("value_dtype")
    replicator_seed: int = _knob("replicator_seed")
    overlap: Overlap = _knob("overlap")
    bucket_cap_mb: float = _knob("bucket_cap_mb")
    budget_bytes: int | None = _knob("budget_bytes")
    budget_fraction: float | None = _knob("budget_fraction")
    budget_min_rate: float = _knob("budget_min_rate")
    budget_max_rate: float = _knob("budget_max_rate")
    on_nonfinite: NonfiniteAction = _knob("on_nonfinite")
    drift_check_every: int = _knob("drift_check_every")
    on_drift: DriftAction = _knob("on_drift")
    drift_tolerance: float = _knob("drift_tolerance")
    local_steps: int = _knob("local_steps")
    outer_lr: float = _knob("outer_lr")
    outer_momentum: float = _knob("outer_momentum")
    outer_delay: int = _knob("outer_delay")
    outer_fragments: int | None = _knob("outer_fragments")
    shard_size: int | None = field(
        default=None,
        metadata={"help": "Processes per node (FSDP group size). Default: from the launcher (accelerate's "
                          "parallelism_config_dp_shard_size, else LOCAL_WORLD_SIZE)."},
    )
    reduce_dtype: ReduceDtype = field(
        default="float32",
        metadata={"help": "method='adamw' only: dtype of FSDP2's gradient reduce-scatter and cross-node all-reduce "
                          "(MixedPrecisionPolicy.reduce_dtype; float32 as torchtitan, bfloat16 halves the bytes)."},
    )
    resume_policy: ResumePolicy | None = field(default=None, metadata={"help": RESUME_POLICY_HELP})

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"FlexDeMoConfig: invalid method={self.method!r}; accepted: {' | '.join(METHODS)}.")
        if self.shard_size is not None and (not isinstance(self.shard_size, int) or self.shard_size < 1):
            raise ValueError(
                f"FlexDeMoConfig: invalid shard_size={self.shard_size!r}; accepted: None or an integer >= 1."
            )
        if self.reduce_dtype not in REDUCE_DTYPES:
            raise ValueError(f"FlexDeMoConfig: invalid reduce_dtype={self.reduce_dtype!r}; accepted: "
                             f"{' | '.join(REDUCE_DTYPES)}.")
        if self.resume_policy is not None and self.resume_policy not in RESUME_POLICIES:
            raise ValueError(f"FlexDeMoConfig: invalid resume_policy={self.resume_policy!r}; accepted: None | "
                             f"{' | '.join(RESUME_POLICIES)}.")
        if self.reduce_dtype != "float32" and self.method != "adamw":
            raise ValueError(f"FlexDeMoConfig: reduce_dtype={self.reduce_dtype!r} with method={self.method!r}; "
                             "accepted: reduce_dtype='float32' unless method='adamw' (it sets the AdamW-HSDP "
                             "baseline's gradient reduction; FlexDeMo's exchange has its own wire type, "
                             "value_dtype).")
        if self.method == "adamw":
            moved = {key: value for key, value in self.optimizer_kwargs().items() if value != knobs.DEFAULTS[key]}
            if self.flexdemo_preset != "default":
                moved = {"flexdemo_preset": self.flexdemo_preset, **moved}
            if moved:
                given = ", ".join(f"{key}={value!r}" for key, value in moved.items())
                raise ValueError(f"FlexDeMoConfig: {given} with method='adamw'; accepted: the defaults with "
                                 "method='adamw' (the AdamW-HSDP baseline: torch's AdamW and FSDP's dense all-reduce "
                                 "between nodes, which read no FlexDeMo knob), or method='flexdemo' | 'demo' to "
                                 "use them.")
            return  # nothing to resolve: the fields keep their defaults (replace() and a re-parse round-trip)
        if self.method == "demo" and self.shard_size not in (None, 1):
            raise ValueError(f"FlexDeMoConfig: shard_size={self.shard_size!r} with method='demo'; accepted: None or 1 "
                             "with method='demo' (every rank is its own replica: nothing is sharded), or "
                             "method='flexdemo' to shard inside nodes.")
        preset = knobs.apply_preset(self.flexdemo_preset, self.optimizer_kwargs(), field="flexdemo_preset")
        knobs.validate(preset)
        for key, value in knobs.resolve(preset).items():
            setattr(self, key, value)  # the fields show the knobs in use (model card, results JSONs)

    def optimizer_kwargs(self) -> dict[str, Any]:
        """The FlexDeMo constructor arguments this config sets."""
        return {k: v for k, v in asdict(self).items() if k not in _SETUP_FIELDS}
