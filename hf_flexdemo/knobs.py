"""Every FlexDeMo knob, defined once: :data:`KNOBS`, one :class:`Knob` per row (torch-free).

A row holds the knob's name, default, type (a ``Literal`` for choices), help text and check, whether it may differ
between parameter groups, which modes read it, and the constructor policy it belongs to. Everything else is derived
from the table: :data:`DEFAULTS`, :data:`HELP`, :data:`PER_GROUP` / :data:`OPTIMIZER_WIDE`, the policy dataclasses
``FlexDeMo`` takes (:mod:`hf_flexdemo.policies`), ``FlexDeMoConfig``'s fields, :func:`validate` (which refuses a knob
the chosen mode does not read) and docs/configuration.md. The defaults are measured choices (docs/results.md).

Knobs are of two kinds, as in torch's optimizers:

* per-group knobs may differ between parameter groups (``lr``, the block size, the step-wise rule);
* optimizer-wide knobs hold for the whole optimizer, because every group's payload shares one exchange (the
  replicator, the wire, the schedule of the exchange, the guards). They live once on the optimizer
  (``FlexDeMo.options``), not in the param groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

Update = Literal["sign", "sgd", "adamw", "rmsprop"]
ReplicatorName = Literal["demo", "owner", "leader", "random", "full", "none"]
Momentum = Literal["lr", "ema", "avg", "adam"]
Overlap = Literal["auto", "none", "backward", "delayed"]
Consensus = Literal["choosers", "replicas"]
ValueDtype = Literal["auto", "bfloat16", "float32", "float8", "int4", "int2"]
NonfiniteAction = Literal["skip", "raise"]
DriftAction = Literal["auto", "raise", "resync", "tolerate"]
Preset = Literal["default", "step-wise", "flexdemo-paper", "demo-paper"]
Transform = Literal["auto", "dct", "none"]
Mode = Literal["local", "step-wise"]
ProgressScale = Literal["none", "batch"]
ProgressEstimate = Literal["consecutive", "micro_batches"]
ProgressPath = Literal["own", "lengthened"]

REPLICATORS: tuple[str, ...] = get_args(ReplicatorName)
UPDATES: tuple[str, ...] = get_args(Update)
DRIFT_ACTIONS: tuple[str, ...] = get_args(DriftAction)

DEFAULT_RATE = 1 / 4  # the rate used when neither compression_rate, compression_topk nor a budget is set
DEFAULT_CHUNK = 32
SCALED_VALUE_DTYPES = ("float8", "int4", "int2")  # a scale per block: demo's all-gather only, not random's sum
MAX_AUTO_DELAY = 2  # outer_delay=None's longest: the delay measured at no loss cost (docs/results.md)
# local_steps=None's choice: rounds of LONG_RUN_LOCAL_STEPS, or of SHORT_RUN_LOCAL_STEPS for a run known to be shorter
# than SHORT_RUN_STEPS steps (docs/results.md "Bits at 2 nodes over 2,000 steps"), or of LARGE_MODEL_LOCAL_STEPS for a
# run of at least LARGE_MODEL_STEPS steps on a model of at least LARGE_MODEL_PARAMETERS parameters, where they keep
# within 2 % of AdamW-HSDP at half the bits (docs/results.md "A second model size")
LONG_RUN_LOCAL_STEPS, SHORT_RUN_LOCAL_STEPS, SHORT_RUN_STEPS = 8, 4, 1000
LARGE_MODEL_LOCAL_STEPS, LARGE_MODEL_STEPS, LARGE_MODEL_PARAMETERS = 16, 2000, 8_000_000
BOTH: tuple[str, ...] = get_args(Mode)
LOCAL: tuple[str, ...] = ("local",)
STEP_WISE: tuple[str, ...] = ("step-wise",)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Knob:
    """One knob: ``ok(value)`` says whether a value is accepted, ``accepted`` says which in words (a ``Literal``
    type's choices need neither); ``policy`` is the constructor policy holding it as ``field`` (``None``: a keyword of
    ``FlexDeMo`` itself)."""

    name: str
    default: Any
    type: Any
    help: str
    per_group: bool = False
    modes: tuple[str, ...] = BOTH
    policy: str | None = None
    field: str | None = None
    ok: Callable[[Any], bool] | None = None
    accepted: str = ""

    @property
    def choices(self) -> tuple[str, ...]:
        """A ``Literal`` type's values (empty for other types)."""
        return get_args(self.type) if getattr(self.type, "__origin__", None) is Literal else ()

    def check(self, value: Any) -> None:
        """Raise ``ValueError`` naming the knob, ``value`` and what is accepted, unless ``value`` is."""
        if self.choices:
            check(value in self.choices, self.name, value, " | ".join(self.choices))
        elif self.ok is not None:
            check(self.ok(value), self.name, value, self.accepted)


def check(ok: bool, name: str, value: Any, accepted: str) -> None:
    if not ok:
        raise ValueError(f"FlexDeMo: invalid {name}={value!r}; accepted: {accepted}.")


KNOBS: tuple[Knob, ...] = (
    # ---- per parameter group, flat (as in torch's AdamW)
    Knob("lr", 1e-3, float, "Learning rate.", per_group=True, ok=lambda v: _number(v) and v >= 0,
         accepted="a float >= 0"),
    Knob("weight_decay", 0.0, float, "Decoupled weight decay.", per_group=True,
         ok=lambda v: _number(v) and v >= 0, accepted="a float >= 0"),
    Knob("betas", (0.9, 0.999), tuple[float, float], "AdamW constants (the inner steps; step-wise update='adamw'/"
         "'rmsprop', momentum='avg'/'adam').", per_group=True,
         ok=lambda v: len(v) == 2 and all(_number(b) and 0.0 <= b < 1.0 for b in v), accepted="two floats in [0, 1)"),
    Knob("eps", 1e-8, float, "AdamW's epsilon (as betas).", per_group=True, ok=lambda v: _number(v) and v > 0,
         accepted="a float > 0"),
    # ---- what travels (CompressionPolicy)
    Knob("compression_rate", None, float | None,
         f"Fraction of each block that travels between nodes: of its values (local steps' default) or of its DCT "
         f"coefficients (compression_transform); default {DEFAULT_RATE:g} unless compression_topk or a budget is "
         "set; kept per block: round(rate * block size).", per_group=True, policy="compression", field="rate",
         ok=lambda v: v is None or (_number(v) and 0 < v <= 1),
         accepted="a float in (0, 1], e.g. 0.125 (None: the default rate)"),
    Knob("compression_topk", None, int | None, "DeMo's convention instead of a rate: coefficients kept per block.",
         per_group=True, policy="compression", field="topk", ok=lambda v: v is None or (_integer(v) and v >= 1),
         accepted="an integer >= 1 (None: use compression_rate)"),
    Knob("compression_chunk", DEFAULT_CHUNK, int, "Largest block side (top-k and the scales run per block); each "
         "side is the largest divisor of the shard dimension not above it.", per_group=True, policy="compression",
         field="chunk", ok=lambda v: _integer(v) and v >= 1, accepted="an integer >= 1"),
    Knob("compression_transform", "auto", Transform, "What top-k selects from in each block: 'dct' (DeMo's DCT "
         "coefficients), 'none' (the values themselves, as SparseLoCo), or auto: none with local_steps > 1, dct with "
         "local_steps=1.", per_group=True, policy="compression", field="transform"),
    Knob("compression_feedback", 1.0, float, "Fraction in (0, 1] of the sent signal that error feedback removes from "
         "what is kept back.", per_group=True, policy="compression", field="feedback",
         ok=lambda v: _number(v) and 0.0 < v <= 1.0, accepted="a float in (0, 1]"),
    Knob("replicator", "demo", ReplicatorName, "Cross-node exchange: demo (top-k per block with a bitmask or indices, "
         "all-gather), owner (each block's owner node gets every node's top-k of it in an all-to-all and forwards the "
         "top-k of their mean with the next exchange, with error feedback on both sides: received bytes flat in the "
         "number of nodes, the consensus one exchange later, each node restarting meanwhile from the anchor moved by "
         "its own share; local steps only), leader (one node's top-k positions, "
         "chosen the exchange before and the node changing each exchange, are every node's; an all-reduce sums "
         "int2/int4 codes: received bytes flat in the number of nodes), random (shared random positions, all-reduce "
         "of the values), full (dense average), none (one node: emulates demo's wire; any other replicator on one "
         "node trains as its dense limit, torch's AdamW at the defaults).", policy="compression", field="replicator"),
    Knob("consensus", "replicas", Consensus, "replicator='demo' and 'owner': a coefficient is the mean over the "
         "replicas that chose it (choosers, DeMo) or over all replicas (replicas: the mean momentum).",
         policy="compression", field="consensus"),
    Knob("value_dtype", "auto", ValueDtype, "Wire type of coefficients (float8: e4m3 with a bfloat16 scale per "
         "block; int4/int2: 4 or 2 bits with a bfloat16 scale per block; these three demo and owner only, int4/int2 "
         "also leader, which needs them; auto: for replicator='demo' or 'owner' int2 with local_steps > 1, float8 with "
         "local_steps=1; int2 for leader; float32 for full, whose all-reduce sends the float32 momentum whole; else "
         "bfloat16).",
         policy="compression", field="value_dtype"),
    Knob("replicator_seed", 0, int, "Seed of replicator='random''s shared positions and of replicator='leader''s "
         "leaders and first positions (the same on every replica).",
         policy="compression", field="seed", ok=lambda v: _integer(v) and v >= 0, accepted="an integer >= 0"),
    # ---- local steps, the default mode (OuterPolicy; local_steps itself is a keyword)
    Knob("local_steps", None, int | None, "Local steps H: each node takes H AdamW steps on its own (no traffic), "
         "then the pseudo-gradient (anchor - local) enters error feedback, is compressed by the replicator and "
         "exchanged once, and every node restarts from the updated anchor (DiLoCo / SparseLoCo). 1: exchange every "
         "step (FlexDeMo's step-wise mode, preset='step-wise'). None (the default): 8, or 4 for a run the Trainer "
         "knows to be shorter than 1,000 steps (its max_steps, or the steps its epochs take), or 16 for a run of "
         "at least 2,000 steps on a model of at least 8 M parameters, resolved when the optimizer is built: short "
         "runs lose less with shorter rounds, at twice the bits; larger models stay on par with AdamW with "
         "longer ones, at half the bits.",
         ok=lambda v: v is None or (_integer(v) and v >= 1),
         accepted="None (the package's choice) or an integer >= 1 (1: exchange every step)"),
    Knob("outer_lr", None, float | None, "The anchor moves by outer_lr times the replicas' mean pseudo-gradient. None "
         "(the default): sqrt(R / 2) on R nodes, at least 1 (1 at 2 nodes, 1.41 at 4, 2 at 8), resolved at "
         "construction and again on a resume on other nodes: the mean of R AdamW updates, each on 1/R of the "
         "batch, is shorter than one update on their mean; 1 with replicator='full' or 'owner', which land a mean "
         "of the pseudo-gradients and overshoot at 2.", modes=LOCAL, policy="outer", field="lr",
         ok=lambda v: v is None or (_number(v) and v > 0),
         accepted="None or a float > 0 (1.0: the anchor moves by the mean)"),
    Knob("outer_momentum", 0.0, float, "Nesterov momentum of that outer step (DiLoCo: outer_lr 0.7, 0.9); 0: plain "
         "averaging with error feedback (SparseLoCo).", modes=LOCAL, policy="outer", field="momentum",
         ok=lambda v: _number(v) and 0.0 <= v < 1.0, accepted="a float in [0, 1) (0: no outer momentum)"),
    Knob("progress_scale", "none", ProgressScale, "What a node sends of a round: its own progress (none), or each "
         "element's inner AdamW steps lengthened to the step AdamW takes on the R nodes' mean gradient (batch): "
         "sqrt(R v / (v + (R - 1) s)) times, in [1, sqrt(R)], from the node's second moment v and the signal's s, "
         "estimated from the products of its consecutive gradients. The node's own path is unchanged; 12 more bytes "
         "of optimizer state per parameter.", modes=LOCAL, policy="outer", field="progress_scale"),
    Knob("progress_scale_decay", None, float | None, "progress_scale='batch': the decay of the EMAs its signal "
         "estimate reads (of consecutive gradients' products, and of squares). None (the default): the inner AdamW's "
         "beta2, whose second moment it shares, so the factor is the ratio of the two AdamW steps' denominators; a "
         "float keeps its own EMA of squares (4 more bytes of optimizer state per parameter) and follows the signal's "
         "current share with a memory of about 1 / (1 - decay) steps.", modes=LOCAL, policy="outer",
         field="progress_scale_decay", ok=lambda v: v is None or (_number(v) and 0.0 < v < 1.0),
         accepted="None (the inner AdamW's beta2) or a float in (0, 1)"),
    Knob("progress_scale_estimate", "consecutive", ProgressEstimate, "progress_scale='batch': where its signal "
         "estimate s comes from. consecutive (the default): the products of the node's consecutive gradients, which "
         "the step between them correlates; micro_batches: the product of a step's first micro-batches' gradient and "
         "its last one's, taken at the same weights, with its own EMA of squares (4 more bytes of optimizer state per "
         "parameter, and one gradient-sized buffer). It needs gradient_accumulation_steps >= 2 and a gradient "
         "reduced inside the node after every micro-batch (FlexDeMoTrainer sets Accelerate's sync_each_batch; a "
         "training loop of its own calls FlexDeMo.observe_micro_batch).", modes=LOCAL, policy="outer",
         field="progress_scale_estimate"),
    Knob("progress_scale_path", "own", ProgressPath, "progress_scale='batch': where a node walks during a round. own "
         "(the default): its own AdamW path, only what it sends lengthened (12 more bytes of optimizer state per "
         "parameter); lengthened: its weights move by the lengthened steps too, so its later steps in a round take "
         "their gradients where the nodes' mean moves, as the dense mean of every step does (8 more bytes; its own "
         "noise is lengthened too, and the mean cancels it).", modes=LOCAL, policy="outer",
         field="progress_scale_path"),
    Knob("outer_delay", None, int | None, "Streamed (overlap='delayed'): the inner steps a round's exchange travels "
         "during before it moves the anchor (Streaming DiLoCo's tau); the progress of those steps enters error "
         "feedback, so replicas restart from one anchor and nothing is lost. None (the default): until the next "
         "fragment's exchange starts, local_steps / outer_fragments steps, at most 2 (2 at the defaults: the link "
         "carries a round's mean rate, not bursts at twice it), else 1.", modes=LOCAL, policy="outer", field="delay",
         ok=lambda v: v is None or (_integer(v) and v >= 1),
         accepted="None (the package's choice) or an integer >= 1"),
    Knob("outer_fragments", None, int | None, "Streamed: split the parameters into this many fragments (balanced by "
         "size) whose rounds are staggered by local_steps / outer_fragments steps (Streaming DiLoCo), so each "
         "exchange carries about 1/outer_fragments of the payload and the link is busy evenly; each fragment still "
         "syncs every local_steps steps. Must divide local_steps, with outer_delay <= local_steps / outer_fragments. "
         "1: the whole model in one round. None (default): the largest divisor of local_steps up to 4 that leaves "
         "outer_delay <= local_steps / outer_fragments when streamed (4 at the defaults), else 1.", modes=LOCAL,
         policy="outer", field="fragments", ok=lambda v: v is None or (_integer(v) and v >= 1),
         accepted="None (the package's choice) or an integer >= 1 (1: the whole model in one round)"),
    Knob("feedback_decay", 0.999, float, "Error-feedback decay: what compression held back is multiplied by it once "
         "a round, before the next pseudo-gradient joins it.", per_group=True, modes=LOCAL, policy="outer",
         field="feedback_decay", ok=lambda v: _number(v) and 0.0 <= v < 1.0, accepted="a float in [0, 1)"),
    # ---- the step-wise mode's rule (StepRulePolicy)
    Knob("momentum", "adam", Momentum, "A gradient enters the momentum as lr * g (lr, DeMo), (1 - decay) * g (ema), "
         "or AdamW's bias-corrected first moment (avg) or direction m / (sqrt(v) + eps) (adam) of this replica's "
         "gradient.", per_group=True, modes=STEP_WISE, policy="step_rule", field="momentum"),
    Knob("momentum_decay", 0.999, float, "Momentum decay beta in [0, 1): the momentum is multiplied by it every "
         "step before the new gradient enters.", per_group=True, modes=STEP_WISE, policy="step_rule",
         field="momentum_decay", ok=lambda v: _number(v) and 0.0 <= v < 1.0, accepted="a float in [0, 1)"),
    Knob("update", "sgd", Update, "Update from the consensus Q: sign (DeMo), sgd, adamw (AdamW fed Q), or rmsprop "
         "(AdamW with beta1 = 0).", per_group=True, modes=STEP_WISE, policy="step_rule", field="update"),
    # ---- when the exchange runs (keywords)
    Knob("overlap", "auto", Overlap, "When the exchange runs: in step() (none), started per bucket during backward "
         "(backward, local_steps=1 only: the same update; gradients are read when FSDP2 finalises them, so clipping "
         "does not reach the exchange), or travelling during the next step (delayed: step-wise one step stale; with "
         "local steps streamed, see outer_delay). auto (the default): delayed with local_steps > 1, else none."),
    Knob("bucket_cap_mb", 25.0, float, "Exchange bucket size in MB of float32 local shards (DDP's bucket_cap_mb).",
         ok=lambda v: _number(v) and v > 0, accepted="a number of MB > 0"),
    # ---- a budget instead of a rate (BudgetPolicy)
    Knob("budget_bytes", None, int | None, "Instead of a rate: the largest rate whose payload fits this many "
         "inter-node bytes per step and rank (with local_steps > 1: a round's bytes over its local_steps steps).",
         policy="budget", field="bytes", ok=lambda v: v is None or (_integer(v) and v > 0),
         accepted="None or an integer > 0 (inter-node bytes per step and rank)"),
    Knob("budget_fraction", None, float | None, "Instead of a rate: the fraction of the step time the step may wait "
         "on the exchange (the rate follows measured times, agreed by every rank).", modes=STEP_WISE,
         policy="budget", field="fraction", ok=lambda v: v is None or (_number(v) and 0 < v < 1),
         accepted="None or a float in (0, 1) (of the step time)"),
    Knob("budget_min_rate", 1 / 64, float, "Lowest rate a budget may choose (refused without a budget).",
         policy="budget", field="min_rate"),
    Knob("budget_max_rate", 1 / 4, float, "Highest rate a budget may choose (refused without a budget).",
         policy="budget", field="max_rate"),
    # ---- guards (GuardPolicy)
    Knob("on_nonfinite", "skip", NonfiniteAction, "A NaN/Inf gradient on any rank: every rank skips the step (skip), "
         "or raises (raise).", policy="guards", field="on_nonfinite"),
    Knob("drift_check_every", 100, int, "Compare the replicas' parameters across nodes every N steps (0: never).",
         policy="guards", field="drift_check_every", ok=lambda v: _integer(v) and v >= 0,
         accepted="an integer >= 0 (0 disables the check)"),
    Knob("on_drift", "auto", DriftAction, "How replicas are compared and what a difference does. auto (the "
         "default): raise where every replica runs the same device model and torch/CUDA/NCCL versions, tolerate "
         "where they differ (decided at the first check, the same on every rank), so a mixed cluster trains on. "
         "raise: nodes of one hardware model round alike, so replicas are bit-identical; an 8-byte fingerprint per "
         "parameter travels and any difference stops the run naming the parameters. resync: copy replica 0's values "
         "instead. tolerate, for nodes of unlike hardware, whose kernels round differently in the last bit: replica "
         "0's shards are broadcast (one dense copy per check, counted in the bytes), a difference past "
         "drift_tolerance stops the run naming the parameters, a smaller one is logged (flexdemo/replica_drift) and "
         "replica 0's values are copied.", policy="guards", field="on_drift"),
    Knob("drift_tolerance", 2.0, float, "on_drift='tolerate': the largest difference between replicas, per "
         "parameter, in steps: drift_tolerance * (lr + eps * max|p|), lr the group's peak learning rate and eps that "
         "of the parameter's dtype. 2 lets a sign update flip where the consensus is within rounding of 0; last-bit "
         "rounding stays orders of magnitude below it (docs/results.md).", policy="guards", field="drift_tolerance",
         ok=lambda v: _number(v) and v > 0, accepted="a float > 0 (learning-rate steps, see HELP)"),
)
BY_NAME: dict[str, Knob] = {knob.name: knob for knob in KNOBS}
DEFAULTS: dict[str, Any] = {knob.name: knob.default for knob in KNOBS}
HELP: dict[str, str] = {knob.name: knob.help for knob in KNOBS}
PER_GROUP: tuple[str, ...] = tuple(knob.name for knob in KNOBS if knob.per_group)
OPTIMIZER_WIDE: tuple[str, ...] = tuple(knob.name for knob in KNOBS if not knob.per_group)
POLICIES: dict[str, tuple[Knob, ...]] = {}
for _knob in KNOBS:
    if _knob.policy is not None:
        POLICIES.setdefault(_knob.policy, ())
        POLICIES[_knob.policy] += (_knob,)


# Named sets of knob values (docs/how-it-works.md "Presets"): "step-wise" exchanges every step, as FlexDeMo does,
# with this package's rule; the paper presets reproduce the published rules.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "step-wise": {"local_steps": 1},
    # FlexDeMo (arXiv 2502.06728) as its authors run it: DeMo's rule on FSDP shards at their effective density,
    # 4 of every 64 coefficients (their FSDP1 shards are flat, so chunk 64 / top-k 4 keeps 1/16); float32 values.
    "flexdemo-paper": {"local_steps": 1, "momentum": "lr", "update": "sign", "consensus": "choosers",
                       "compression_topk": 4, "compression_chunk": 8, "value_dtype": "float32",
                       "momentum_decay": 0.999},
    # DeMo (arXiv 2411.19870)'s defaults: top-k 32 of each 64 x 64 block (1/128), sign-SGD, float32 values.
    "demo-paper": {"local_steps": 1, "momentum": "lr", "update": "sign", "consensus": "choosers",
                   "compression_topk": 32, "compression_chunk": 64, "value_dtype": "float32",
                   "momentum_decay": 0.999},
}
PRESET_HELP = ("A named set of knob values applied to the knobs left at their default: default (the package's "
               "measured defaults: local_steps=None (8, or 4 in a run under 1,000 steps, or 16 in a run of 2,000 "
               "steps or more on 8 M parameters or more), top-k of the values, int2, streamed in 4 fragments), "
               "step-wise (local_steps=1: a compressed momentum exchange every step, DCT, "
               "float8 values), flexdemo-paper (the FlexDeMo authors' rule: momentum=lr, update=sign, "
               "consensus=choosers, 4 of each 8 x 8 block, float32 values), demo-paper (DeMo's defaults: 32 of each "
               "64 x 64 block, sign, float32 values); the paper presets are step-wise. A knob set to anything but its "
               "default overrides the preset, except a local_steps that contradicts a step-wise preset, which is "
               "refused.")
# Knobs that define what a preset is: a caller's value that contradicts the preset's is refused, not kept (the
# step-wise and the paper presets exchange every step; local steps would be another mode under the preset's name).
PRESET_DEFINING: tuple[str, ...] = ("local_steps",)


def apply_preset(preset: str, values: dict[str, Any], *, field: str = "preset") -> dict[str, Any]:
    """``values`` with the preset's knobs in place of those left at their default: a knob set to anything but
    its default keeps the caller's value, except a :data:`PRESET_DEFINING` knob that contradicts the preset's,
    which is refused. ``field`` names the setting in an error."""
    check(preset in PRESETS, field, preset, " | ".join(PRESETS))
    for key in PRESET_DEFINING:
        wanted = PRESETS[preset].get(key, values[key])
        if values[key] not in (DEFAULTS[key], wanted):
            raise ValueError(f"FlexDeMo: invalid {key}={values[key]!r} with {field}={preset!r}; accepted: {wanted!r} "
                             f"(the preset's: {key}={wanted!r} is what {preset!r} means) or the default; for "
                             f"{key}={values[key]!r} drop the preset ({field}='default') and set the knobs you want.")
    return {**values, **{key: value for key, value in PRESETS[preset].items() if values[key] == DEFAULTS[key]}}


def resolve_value_dtype(value_dtype: str, replicator: str, local_steps: int) -> str:
    """``value_dtype="auto"``'s choice: for ``demo``'s all-gather int2 with local steps (error feedback sends what the
    2-bit rounding loses in the next round) and float8 step-wise; float32 for ``full``, the dense limit; bfloat16 for
    the other all-reduces, which add values (per-block scales do not add up); any other value as given
    (docs/how-it-works.md "Why the defaults")."""
    if value_dtype != "auto":
        return value_dtype
    if replicator == "leader":  # its all-reduce sums codes on a shared scale
        return "int2"
    if replicator == "full":  # the uncompressed all-reduce of the float32 momentum
        return "float32"
    if replicator not in ("demo", "owner", "none"):  # "none" emulates demo's wire on one node
        return "bfloat16"
    return "int2" if local_steps > 1 else "float8"


def resolve_transform(transform: str, local_steps: int) -> str:
    """``compression_transform="auto"``'s choice: ``"none"`` with local steps (top-k of the pseudo-gradient's values,
    as SparseLoCo), ``"dct"`` step-wise (DeMo's transform of the momentum); any other value as given
    (docs/how-it-works.md "Why the defaults")."""
    if transform != "auto":
        return transform
    return "none" if local_steps > 1 else "dct"


# Replicators whose exchange lands a mean of the nodes' pseudo-gradients (dense, or the top-k of that mean): at 8 nodes
# their outer step is best at 1, where the all-gather of each node's own top-k wants 2 (docs/results.md "Received bytes
# flat in the number of nodes").
MEAN_REPLICATORS: tuple[str, ...] = ("full", "owner")


def resolve_outer_lr(outer_lr: float | None, replicas: int, replicator: str) -> float:
    """``outer_lr=None``'s choice on ``replicas`` nodes: for the all-gather of each node's top-k (and the other
    sparse replicators), ``sqrt(replicas / 2)``, at least 1 (docs/results.md "Loss against the number of nodes"); for
    :data:`MEAN_REPLICATORS`, 1. Any other value as given."""
    if outer_lr is not None:
        return outer_lr
    return 1.0 if replicator in MEAN_REPLICATORS else max(1.0, math.sqrt(replicas / 2))


def resolve_outer_fragments(fragments: int | None, local_steps: int, overlap: str, outer_delay: int | None) -> int:
    """``outer_fragments=None``'s choice: with streamed local steps (``overlap`` resolved), the most fragments up to
    4 that fit: the largest divisor F <= 4 of ``local_steps`` with ``outer_delay <= local_steps / F`` (``None``:
    any delay, chosen after F); 1 otherwise (step-wise, or waiting for each exchange); any other value as given
    (docs/how-it-works.md "Why the defaults")."""
    if fragments is not None:
        return fragments
    if local_steps == 1 or overlap != "delayed":
        return 1
    return max(f for f in range(1, 5) if local_steps % f == 0 and (outer_delay or 1) <= local_steps // f)


def resolve_outer_delay(outer_delay: int | None, local_steps: int, overlap: str, fragments: int) -> int:
    """``outer_delay=None``'s choice: streamed (``overlap`` resolved), each fragment's exchange travels until the next
    fragment's starts, ``local_steps / fragments`` steps, at most :data:`MAX_AUTO_DELAY`; 1 otherwise; any other value
    as given (docs/results.md "Time to target on a slow link")."""
    if outer_delay is not None:
        return outer_delay
    if local_steps == 1 or overlap != "delayed":
        return 1
    return min(local_steps // fragments, MAX_AUTO_DELAY)


def resolve_local_steps(local_steps: int | None, max_steps: int | None = None, parameters: int | None = None) -> int:
    """``local_steps=None``'s choice for a run of ``max_steps`` steps on a model of ``parameters`` parameters (each
    ``None``: not known, as for an optimizer built by hand): :data:`SHORT_RUN_LOCAL_STEPS` under
    :data:`SHORT_RUN_STEPS` steps (docs/results.md "Bits at 2 nodes over 2,000 steps"),
    :data:`LARGE_MODEL_LOCAL_STEPS` from :data:`LARGE_MODEL_STEPS` steps on :data:`LARGE_MODEL_PARAMETERS` parameters
    or more (docs/results.md "A second model size"), else :data:`LONG_RUN_LOCAL_STEPS`; any other value as given."""
    if local_steps is not None:
        return local_steps
    if max_steps is None or max_steps <= 0:
        return LONG_RUN_LOCAL_STEPS
    if max_steps < SHORT_RUN_STEPS:
        return SHORT_RUN_LOCAL_STEPS
    large = parameters is not None and parameters >= LARGE_MODEL_PARAMETERS and max_steps >= LARGE_MODEL_STEPS
    return LARGE_MODEL_LOCAL_STEPS if large else LONG_RUN_LOCAL_STEPS


def resolve(values: dict[str, Any], max_steps: int | None = None, parameters: int | None = None) -> dict[str, Any]:
    """``values`` with every knob left to the package's choice (``"auto"``, or ``None``) replaced by that choice for
    a run of ``max_steps`` steps on a model of ``parameters`` parameters (each ``None``: not known), so that a
    state_dict, a model card or a results JSON records what actually ran."""
    local = resolve_local_steps(values["local_steps"], max_steps, parameters)
    overlap = ("delayed" if local > 1 else "none") if values["overlap"] == "auto" else values["overlap"]
    fragments = resolve_outer_fragments(values["outer_fragments"], local, overlap, values["outer_delay"])
    return {**values, "local_steps": local,
            "value_dtype": resolve_value_dtype(values["value_dtype"], values["replicator"], local),
            "compression_transform": resolve_transform(values["compression_transform"], local),
            "overlap": overlap, "outer_fragments": fragments,
            "outer_delay": resolve_outer_delay(values["outer_delay"], local, overlap, fragments)}


def with_default_rate(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``compression_rate`` at :data:`DEFAULT_RATE` where nothing else chooses the share that travels
    (no rate, no top-k, no budget)."""
    if all(values[key] is None for key in ("compression_rate", "compression_topk", "budget_bytes", "budget_fraction")):
        return {**values, "compression_rate": DEFAULT_RATE}
    return values


def mode_of(local_steps: int | None) -> str:
    """The mode ``local_steps`` selects: ``"local"`` (H > 1, or ``None``: H resolved from the run's length, always
    > 1) or ``"step-wise"`` (1)."""
    return "local" if local_steps is None or local_steps > 1 else "step-wise"


def _local_mode(knobs: Mapping[str, Any]) -> bool:
    """Whether ``knobs`` set local steps (``local_steps`` present, and ``None`` or > 1)."""
    return "local_steps" in knobs and mode_of(knobs["local_steps"]) == "local"


def validate(knobs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the field, its value and the accepted values for any invalid knob.

    Checks the knobs present in ``knobs`` (a relation between two knobs when both are present); it has no
    defaults of its own: callers pass what they will use.
    """
    get = knobs.get
    for name, value in knobs.items():
        if name in BY_NAME:
            BY_NAME[name].check(value)
    if get("compression_rate") is not None and get("compression_topk") is not None:
        raise ValueError(f"FlexDeMo: compression_rate={get('compression_rate')!r} and compression_topk="
                         f"{get('compression_topk')!r} are both set; accepted: one of them (a rate per block, or "
                         "DeMo's fixed count per block).")
    if "budget_min_rate" in knobs or "budget_max_rate" in knobs:
        low, high = get("budget_min_rate"), get("budget_max_rate")
        check(_number(low) and _number(high) and 0 < low <= high <= 1, "budget_min_rate, budget_max_rate",
              (low, high), "0 < budget_min_rate <= budget_max_rate <= 1")
    check(get("value_dtype") not in SCALED_VALUE_DTYPES or get("replicator") != "random", "value_dtype",
          get("value_dtype"), "'bfloat16' | 'float32' with replicator='random' (its all-reduce sums values; "
          "per-block scales do not add up), or replicator='demo' for float8 | int4 | int2")
    check(get("value_dtype") in ("auto", "int2", "int4", None) or get("replicator") != "leader", "value_dtype",
          get("value_dtype"), "'auto' | 'int2' | 'int4' with replicator='leader' (its all-reduce sums codes on a "
          "shared scale), or replicator='demo' for float8 | bfloat16 | float32")
    check(get("value_dtype") in ("auto", "float32", None) or get("replicator") != "full", "value_dtype",
          get("value_dtype"), "'auto' | 'float32' with replicator='full' (its all-reduce sends the float32 momentum "
          "whole, uncompressed), or replicator='demo' for a compressed wire type")
    if "local_steps" in knobs and not _local_mode(knobs):
        check(get("replicator") != "owner", "replicator", get("replicator"), "'demo' | 'leader' | 'random' | 'full' "
              f"with local_steps={get('local_steps')}; replicator='owner' lands a consensus one exchange after it is "
              "sent, a round late with local steps: set local_steps > 1 (or leave it to the package) to use it")
    if _local_mode(knobs):
        check(get("overlap") in ("auto", "none", "delayed", None), "overlap", get("overlap"),
              f"'auto' | 'none' | 'delayed' with local_steps={get('local_steps')} (the exchange runs once a round, "
              "from step(): waited for there, or travelling during the next round); overlap='backward' needs "
              "local_steps=1 (preset='step-wise')")
        check(get("budget_fraction") is None, "budget_fraction", get("budget_fraction"),
              f"None with local_steps={get('local_steps')} (a time budget measures every step's exchange); a time "
              "budget needs local_steps=1 (preset='step-wise')")
        # None: bound by the shorter rounds it may resolve to
        local = SHORT_RUN_LOCAL_STEPS if get("local_steps") is None else get("local_steps")
        delay = get("outer_delay") or 1
        check(get("overlap") not in ("delayed", "auto") or delay <= local, "outer_delay",
              get("outer_delay"), f"1 <= outer_delay <= local_steps={local} (the exchange lands within the next "
              "round)")
    _check_fragments(knobs)
    _check_mode(knobs)
    _check_no_effect(knobs)
    if get("budget_bytes") is not None or get("budget_fraction") is not None:
        check(get("budget_bytes") is None or get("budget_fraction") is None, "budget_bytes, budget_fraction",
              (get("budget_bytes"), get("budget_fraction")), "one of them (the other None)")
        check(get("compression_topk") is None, "compression_topk", get("compression_topk"),
              "None with a budget (the budget chooses a rate)")
        check(get("replicator") in ("demo", "random", None), "replicator", get("replicator"),
              "'demo' | 'random' with a budget ('full' and 'none' do not compress)")


def _check_fragments(knobs: Mapping[str, Any]) -> None:
    """``outer_fragments=F > 1`` against ``local_steps``, ``overlap`` and ``outer_delay`` (those present; ``None``
    chooses an F that fits them)."""
    fragments, local, overlap, delay = (knobs.get(key) for key in ("outer_fragments", "local_steps", "overlap",
                                                                   "outer_delay"))
    if fragments in (None, 1):
        return
    if local is not None:
        check(local > 1, "outer_fragments", fragments, f"1 with local_steps={local} (fragments stagger the rounds of "
              "local steps); set local_steps=H > 1, a multiple of outer_fragments")
        divisors = " | ".join(str(d) for d in range(1, local + 1) if local % d == 0)
        check(local % fragments == 0, "outer_fragments", fragments, f"a divisor of local_steps={local}: {divisors} "
              "(each fragment's round ends local_steps / outer_fragments steps after the previous fragment's); or "
              "change local_steps to a multiple of it")
    if overlap is not None:
        check(overlap in ("auto", "delayed"), "outer_fragments", fragments, f"1 with overlap={overlap!r} (fragments "
              "need the streamed exchange); set overlap='delayed' or 'auto'")
    if local is not None and delay is not None:
        slot = local // fragments
        check(delay <= slot, "outer_delay", delay, f"1 <= outer_delay <= local_steps / outer_fragments = {local} / "
              f"{fragments} = {slot} with outer_fragments={fragments} (one fragment's exchange in flight at a time); "
              "lower outer_delay or outer_fragments")


# What each mode is, for the refusal of a knob the mode does not read.
_MODE_READS = {"local": "local steps (local_steps > 1: AdamW inside a node, the outer rule on the anchor once a round)",
               "step-wise": "the step-wise mode (local_steps=1: the compressed momentum exchange every step)"}
_MODE_FIX = {"local": "set local_steps=H > 1", "step-wise": "set local_steps=1 (preset='step-wise')"}


def _check_mode(knobs: Mapping[str, Any]) -> None:
    """A knob set away from its default that the mode ``local_steps`` selects does not read (:attr:`Knob.modes`):
    refused, rather than accepted and ignored."""
    if "local_steps" not in knobs:
        return
    mode = mode_of(knobs["local_steps"])
    resolved = resolve({**DEFAULTS, "local_steps": knobs["local_steps"]})  # a default's choice in this mode
    for knob in KNOBS:
        if knob.name in knobs and mode not in knob.modes and knobs[knob.name] not in (knob.default,
                                                                                      resolved[knob.name]):
            (reader,) = knob.modes
            check(False, knob.name, knobs[knob.name], f"{knob.default!r} (the default) with "
                  f"local_steps={knobs['local_steps']}: only {_MODE_READS[reader]} reads it; {_MODE_FIX[reader]} to "
                  f"use {knob.name}, or leave it at its default")


def _check_no_effect(knobs: Mapping[str, Any]) -> None:
    """Knobs set away from their default where the mode reads them but nothing else they depend on lets them act
    (those present): refused, as a knob of the other mode is (:func:`_check_mode`)."""
    if _local_mode(knobs) and knobs.get("overlap") == "none" and knobs.get("outer_delay") not in (None, 1):
        check(False, "outer_delay", knobs["outer_delay"], f"{DEFAULTS['outer_delay']!r} (the default) or 1 with "
              "overlap='none': each round's exchange is waited for in step(), and outer_delay is how many inner steps "
              "a streamed one travels; set overlap='delayed' (or 'auto') to stream")
    if knobs.get("progress_scale_decay") is not None and knobs.get("progress_scale") not in (None, "batch"):
        check(False, "progress_scale_decay", knobs["progress_scale_decay"], "None (the default) with progress_scale="
              f"{knobs['progress_scale']!r}: it is the memory of the estimate progress_scale='batch' lengthens by; set "
              "progress_scale='batch' to use it")
    if knobs.get("progress_scale_estimate", "consecutive") != "consecutive" and knobs.get("progress_scale") not in (
            None, "batch"):
        check(False, "progress_scale_estimate", knobs["progress_scale_estimate"], "'consecutive' (the default) with "
              f"progress_scale={knobs['progress_scale']!r}: it is where the estimate progress_scale='batch' lengthens "
              "by comes from; set progress_scale='batch' to use it")
    if knobs.get("progress_scale_path", "own") != "own" and knobs.get("progress_scale") not in (None, "batch"):
        check(False, "progress_scale_path", knobs["progress_scale_path"], "'own' (the default) with progress_scale="
              f"{knobs['progress_scale']!r}: it is where a node walks the steps progress_scale='batch' lengthens; set "
              "progress_scale='batch' to use it")
    if "budget_bytes" in knobs and "budget_fraction" in knobs and knobs["budget_bytes"] is None \
            and knobs["budget_fraction"] is None:
        for name in ("budget_min_rate", "budget_max_rate"):
            if name in knobs and knobs[name] != DEFAULTS[name]:
                check(False, name, knobs[name], f"the default ({DEFAULTS[name]!r}) without a budget: it bounds the "
                      "rate a budget chooses; set budget_bytes or budget_fraction, or fix the rate with "
                      "compression_rate")
