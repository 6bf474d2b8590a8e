"""Every FlexDeMo knob in one torch-free place: its accepted values, its default and its validation.

``FlexDeMo`` (the ``torch.optim`` optimizer) and ``FlexDeMoConfig`` (the ``HfArgumentParser`` dataclass)
both take their defaults from :data:`DEFAULTS` and their checks from :func:`validate`, so the two can
never disagree; a test pins it. The defaults are measured choices: docs/results.md "Local steps, the default" (and "The
step-wise mode" for the knobs of ``local_steps=1``).

Knobs are of two kinds, as in torch's optimizers:

* :data:`PER_GROUP` knobs may differ between parameter groups (``lr``, the momentum rule, the block size);
* :data:`OPTIMIZER_WIDE` knobs hold for the whole optimizer, because every group's payload shares one
  exchange (the replicator, the wire, the schedule of the exchange, the guards). They live once on the
  optimizer (``FlexDeMo.options``), not in the param groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

Update = Literal["sign", "sgd", "adamw", "rmsprop"]
Replicator = Literal["demo", "random", "full", "none"]
Momentum = Literal["lr", "ema", "avg", "adam"]
# "auto": "delayed" (streamed) with local_steps > 1, else "none"
Overlap = Literal["auto", "none", "backward", "delayed"]
Consensus = Literal["choosers", "replicas"]
# "auto": for replicator="demo" int2 with local_steps > 1, else float8; bfloat16 for the all-reduces
ValueDtype = Literal["auto", "bfloat16", "float32", "float8", "int4", "int2"]
NonfiniteAction = Literal["skip", "raise"]
DriftAction = Literal["auto", "raise", "resync", "tolerate"]
Preset = Literal["default", "step-wise", "flexdemo-paper", "demo-paper"]
# "auto": "none" (top-k of the values themselves) with local_steps > 1, else "dct"
Transform = Literal["auto", "dct", "none"]

UPDATES: tuple[str, ...] = get_args(Update)
REPLICATORS: tuple[str, ...] = get_args(Replicator)
MOMENTUMS: tuple[str, ...] = get_args(Momentum)
OVERLAPS: tuple[str, ...] = get_args(Overlap)
CONSENSUSES: tuple[str, ...] = get_args(Consensus)
VALUE_DTYPE_CHOICES: tuple[str, ...] = get_args(ValueDtype)
NONFINITE_ACTIONS: tuple[str, ...] = get_args(NonfiniteAction)
DRIFT_ACTIONS: tuple[str, ...] = get_args(DriftAction)
PRESET_NAMES: tuple[str, ...] = get_args(Preset)
TRANSFORMS: tuple[str, ...] = get_args(Transform)

DEFAULT_RATE = 1 / 4  # the rate used when neither compression_rate, compression_topk nor a budget is set
DEFAULT_CHUNK = 32
SCALED_VALUE_DTYPES = ("float8", "int4", "int2")  # a scale per block: demo's all-gather only, not random's sum

DEFAULTS: dict[str, Any] = {
    # per parameter group
    "lr": 1e-3,
    "weight_decay": 0.0,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "compression_rate": None,  # None: DEFAULT_RATE, unless compression_topk or a budget is set
    "compression_topk": None,
    "compression_chunk": DEFAULT_CHUNK,
    "compression_transform": "auto",
    "compression_decay": 0.999,
    "compression_feedback": 1.0,
    "momentum": "adam",
    "update": "sgd",
    # optimizer-wide
    "replicator": "demo",
    "consensus": "replicas",
    "value_dtype": "auto",
    "replicator_seed": 0,
    "overlap": "auto",
    "bucket_cap_mb": 25.0,  # DDP's bucket_cap_mb
    "budget_bytes": None,
    "budget_fraction": None,
    "budget_min_rate": 1 / 64,
    "budget_max_rate": 1 / 4,
    "on_nonfinite": "skip",
    "drift_check_every": 100,
    "on_drift": "auto",
    "drift_tolerance": 2.0,
    "local_steps": 8,
    "outer_lr": 1.0,
    "outer_momentum": 0.0,
    "outer_delay": 1,
    "outer_fragments": None,  # None: resolve_outer_fragments's choice (4 with the defaults)
}
PER_GROUP: tuple[str, ...] = ("lr", "weight_decay", "betas", "eps", "compression_rate", "compression_topk",
                              "compression_chunk", "compression_transform", "compression_decay",
                              "compression_feedback", "momentum", "update")
OPTIMIZER_WIDE: tuple[str, ...] = tuple(key for key in DEFAULTS if key not in PER_GROUP)


# Named sets of knob values. The package default takes 8 local AdamW steps per node, then streams the
# pseudo-gradient's top 1/4 of each 32 x 32 block in 2-bit values, a quarter of the model every 2 steps (docs/results.md
# "Local steps": the sweep's choice, at 84x fewer bytes than bf16 HSDP and 1.45x AdamW's step). "step-wise"
# exchanges every step, as FlexDeMo does, with the rule that departs from the papers (AdamW's direction enters the
# momentum, the consensus is the plain mean, the step is SGD on it, values travel in float8: docs/results.md "The
# step-wise mode: choosing its rule"). The paper presets reproduce the published rules.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # the default until local steps won the sweep: a compressed momentum exchange every step (float8, in step())
    "step-wise": {"local_steps": 1},
    # FlexDeMo (arXiv 2502.06728) as its authors run it: DeMo's rule on FSDP shards at their effective density,
    # 4 of every 64 coefficients (their FSDP1 shards are flat, so chunk 64 / top-k 4 keeps 1/16); float32 values.
    "flexdemo-paper": {"local_steps": 1, "momentum": "lr", "update": "sign", "consensus": "choosers",
                       "compression_topk": 4, "compression_chunk": 8, "value_dtype": "float32",
                       "compression_decay": 0.999},
    # DeMo (arXiv 2411.19870)'s defaults: top-k 32 of each 64 x 64 block (1/128), sign-SGD, float32 values.
    "demo-paper": {"local_steps": 1, "momentum": "lr", "update": "sign", "consensus": "choosers",
                   "compression_topk": 32, "compression_chunk": 64, "value_dtype": "float32",
                   "compression_decay": 0.999},
}


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
    """``value_dtype="auto"``'s choice: for ``demo``'s all-gather int2 with local steps (the local-steps sweep's
    choice: error feedback sends what the 2-bit rounding loses in the next round) and float8 step-wise;
    bfloat16 for the all-reduces, which add values (per-block scales do not add up); any other value as given."""
    if value_dtype != "auto":
        return value_dtype
    if replicator not in ("demo", "none"):  # "none" emulates demo's wire on one node
        return "bfloat16"
    return "int2" if local_steps > 1 else "float8"


def resolve_transform(transform: str, local_steps: int) -> str:
    """``compression_transform="auto"``'s choice: ``"none"`` with local steps (top-k of the pseudo-gradient's values,
    as SparseLoCo; docs/results.md "Local steps": in rounds of 8 the same loss as the DCT at 300 steps, 0.6 points
    more at 1,000, and 1.32x AdamW's step instead of 1.63x, side by side), ``"dct"`` step-wise (DeMo's transform of
    the momentum); any other value as given."""
    if transform != "auto":
        return transform
    return "none" if local_steps > 1 else "dct"


def resolve_outer_fragments(fragments: int | None, local_steps: int, overlap: str, outer_delay: int) -> int:
    """``outer_fragments=None``'s choice: with streamed local steps (``overlap`` resolved), the most fragments up to
    4 that fit: the largest divisor F <= 4 of ``local_steps`` with ``outer_delay <= local_steps / F`` (at the
    defaults, 4: the same loss as the whole model at once and the slow link hidden, docs/results.md "Local steps"); 1
    otherwise (step-wise, or waiting for each exchange); any other value as given."""
    if fragments is not None:
        return fragments
    if local_steps == 1 or overlap != "delayed":
        return 1
    return max(f for f in range(1, 5) if local_steps % f == 0 and outer_delay <= local_steps // f)


def resolve(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every knob left to the package's choice (``"auto"``, or ``None`` for ``outer_fragments``)
    replaced by that choice, so that a state_dict, a model card or a results JSON records what actually ran."""
    local = values["local_steps"]
    overlap = ("delayed" if local > 1 else "none") if values["overlap"] == "auto" else values["overlap"]
    return {**values, "value_dtype": resolve_value_dtype(values["value_dtype"], values["replicator"], local),
            "compression_transform": resolve_transform(values["compression_transform"], local),
            "overlap": overlap,
            "outer_fragments": resolve_outer_fragments(values["outer_fragments"], local, overlap,
                                                       values["outer_delay"])}


def check(ok: bool, name: str, value: Any, accepted: str) -> None:
    if not ok:
        raise ValueError(f"FlexDeMo: invalid {name}={value!r}; accepted: {accepted}.")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _choice(knobs: Mapping[str, Any], name: str, accepted: tuple[str, ...]) -> None:
    if name in knobs:
        check(knobs[name] in accepted, name, knobs[name], " | ".join(accepted))


def validate(knobs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the field, its value and the accepted values for any invalid knob.

    Checks the knobs present in ``knobs`` (a relation between two knobs when both are present); it has no
    defaults of its own: callers pass what they will use.
    """
    get = knobs.get
    for name, accepted in (("momentum", MOMENTUMS), ("update", UPDATES), ("replicator", REPLICATORS),
                           ("consensus", CONSENSUSES), ("value_dtype", VALUE_DTYPE_CHOICES), ("overlap", OVERLAPS),
                           ("on_nonfinite", NONFINITE_ACTIONS), ("on_drift", DRIFT_ACTIONS),
                           ("compression_transform", TRANSFORMS)):
        _choice(knobs, name, accepted)
    ranges = {
        "lr": (lambda v: _number(v) and v >= 0, "a float >= 0"),
        "weight_decay": (lambda v: _number(v) and v >= 0, "a float >= 0"),
        "betas": (lambda v: len(v) == 2 and all(_number(b) and 0.0 <= b < 1.0 for b in v), "two floats in [0, 1)"),
        "eps": (lambda v: _number(v) and v > 0, "a float > 0"),
        "compression_rate": (lambda v: v is None or (_number(v) and 0 < v <= 1),
                             "a float in (0, 1], e.g. 0.125 (None: the default rate)"),
        "compression_topk": (lambda v: v is None or (isinstance(v, int) and v >= 1),
                             "an integer >= 1 (None: use compression_rate)"),
        "compression_chunk": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
        "compression_decay": (lambda v: _number(v) and 0.0 <= v < 1.0, "a float in [0, 1)"),
        "compression_feedback": (lambda v: _number(v) and 0.0 < v <= 1.0, "a float in (0, 1]"),
        "replicator_seed": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0"),
        "drift_check_every": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0 disables the check)"),
        "drift_tolerance": (lambda v: _number(v) and v > 0, "a float > 0 (learning-rate steps, see HELP)"),
        "bucket_cap_mb": (lambda v: _number(v) and v > 0, "a number of MB > 0"),
        "budget_bytes": (lambda v: v is None or (isinstance(v, int) and v > 0),
                         "None or an integer > 0 (inter-node bytes per step and rank)"),
        "budget_fraction": (lambda v: v is None or (_number(v) and 0 < v < 1),
                            "None or a float in (0, 1) (of the step time)"),
        "local_steps": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                        "an integer >= 1 (1: exchange every step)"),
        "outer_lr": (lambda v: _number(v) and v > 0, "a float > 0 (1.0: the anchor moves by the mean)"),
        "outer_momentum": (lambda v: _number(v) and 0.0 <= v < 1.0, "a float in [0, 1) (0: no outer momentum)"),
        "outer_delay": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
        "outer_fragments": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
                            "None (the package's choice) or an integer >= 1 (1: the whole model in one round)"),
    }
    for name, (ok, accepted) in ranges.items():
        if name in knobs:
            check(ok(knobs[name]), name, knobs[name], accepted)
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
    if get("local_steps", 1) > 1:
        check(get("overlap") in ("auto", "none", "delayed", None), "overlap", get("overlap"),
              f"'auto' | 'none' | 'delayed' with local_steps={get('local_steps')} (the exchange runs once a round, "
              "from step(): waited for there, or travelling during the next round); overlap='backward' needs "
              "local_steps=1 (preset='step-wise')")
        check(get("budget_fraction") is None, "budget_fraction", get("budget_fraction"),
              f"None with local_steps={get('local_steps')} (a time budget measures every step's exchange); a time "
              "budget needs local_steps=1 (preset='step-wise')")
        check(get("overlap") not in ("delayed", "auto") or get("outer_delay", 1) <= get("local_steps"), "outer_delay",
              get("outer_delay"), f"1 <= outer_delay <= local_steps={get('local_steps')} (the exchange lands within "
              "the next round)")
    _check_fragments(knobs)
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


def _check_no_effect(knobs: Mapping[str, Any]) -> None:
    """Knobs set away from their default where nothing reads them (those present, with the knob they depend on):
    refused, as ``outer_fragments`` with ``local_steps=1`` is, rather than accepted and ignored."""
    local, overlap = knobs.get("local_steps"), knobs.get("overlap")
    moved = [name for name in ("outer_lr", "outer_momentum", "outer_delay")
             if name in knobs and knobs[name] != DEFAULTS[name]]
    if local == 1 and moved:
        name = moved[0]
        check(False, name, knobs[name], f"{DEFAULTS[name]!r} (the default) with local_steps=1: the outer step moves "
              "the anchor once a round of local steps, and step-wise there are none; set local_steps=H > 1 to use "
              f"{name}, or leave it at its default")
    if local is not None and local > 1 and overlap == "none" and knobs.get("outer_delay", 1) != DEFAULTS["outer_delay"]:
        check(False, "outer_delay", knobs["outer_delay"], f"{DEFAULTS['outer_delay']!r} (the default) with "
              "overlap='none': each round's exchange is waited for in step(), and outer_delay is how many inner steps "
              "a streamed one travels; set overlap='delayed' (or 'auto') to stream")
    if "budget_bytes" in knobs and "budget_fraction" in knobs and knobs["budget_bytes"] is None \
            and knobs["budget_fraction"] is None:
        for name in ("budget_min_rate", "budget_max_rate"):
            if name in knobs and knobs[name] != DEFAULTS[name]:
                check(False, name, knobs[name], f"the default ({DEFAULTS[name]!r}) without a budget: it bounds the "
                      "rate a budget chooses; set budget_bytes or budget_fraction, or fix the rate with "
                      "compression_rate")


# What each knob means: FlexDeMoConfig's --help and FlexDeMo's argument reference.
HELP: dict[str, str] = {
    "lr": "Learning rate.",
    "weight_decay": "Decoupled weight decay.",
    "betas": "AdamW constants (update='adamw'/'rmsprop', momentum='avg'/'adam').",
    "eps": "AdamW's epsilon (as betas).",
    "compression_rate": f"Fraction of each block that travels between nodes: of its values (local steps' "
                        f"default) or of its DCT coefficients (compression_transform); default {DEFAULT_RATE:g} "
                        "unless compression_topk or a budget is set; kept per block: round(rate * block size).",
    "compression_topk": "DeMo's convention instead of a rate: coefficients kept per block.",
    "compression_chunk": "Largest block side (top-k and the scales run per block); each side is the largest "
                         "divisor of the shard dimension not above it.",
    "compression_transform": "What top-k selects from in each block: 'dct' (DeMo's DCT coefficients), 'none' "
                             "(the values themselves, as SparseLoCo), or auto: none with local_steps > 1, dct with "
                             "local_steps=1.",
    "compression_decay": "Momentum decay beta in [0, 1).",
    "compression_feedback": "Fraction in (0, 1] of the sent signal that error feedback removes from the momentum.",
    "momentum": "A gradient enters the momentum as lr * g (lr, DeMo), (1 - decay) * g (ema), or AdamW's "
                "bias-corrected first moment (avg) or direction m / (sqrt(v) + eps) (adam) of this replica's "
                "gradient.",
    "update": "Update from the consensus Q: sign (DeMo), sgd, adamw (AdamW fed Q), or rmsprop (AdamW with "
              "beta1 = 0).",
    "replicator": "Cross-node exchange: demo (top-k per block with a bitmask or indices, all-gather), random "
                  "(shared random positions, all-reduce of the values), full (dense average), none (one node: "
                  "emulates demo's wire; any other replicator on one node trains as its dense limit, torch's "
                  "AdamW at the defaults).",
    "consensus": "replicator='demo': a coefficient is the mean over the replicas that chose it (choosers, DeMo) "
                 "or over all replicas (replicas: the mean momentum).",
    "value_dtype": "Wire type of coefficients (float8: e4m3 with a bfloat16 scale per block; int4/int2: 4 or 2 "
                   "bits with a bfloat16 scale per block; these three demo only; auto: for replicator='demo' int2 "
                   "with local_steps > 1, float8 with local_steps=1; else bfloat16).",
    "replicator_seed": "Seed of replicator='random''s shared positions (the same on every replica).",
    "overlap": "When the exchange runs: in step() (none), started per bucket during backward (backward, "
               "local_steps=1 only: the same update; gradients are read when FSDP2 finalises them, so clipping does "
               "not reach the exchange), or travelling during the next step (delayed: step-wise one step stale; with "
               "local steps streamed, see outer_delay). auto (the default): delayed with local_steps > 1, else none.",
    "bucket_cap_mb": "Exchange bucket size in MB of float32 local shards (DDP's bucket_cap_mb).",
    "budget_bytes": "Instead of a rate: the largest rate whose payload fits this many inter-node bytes per step "
                    "and rank (with local_steps > 1: a round's bytes over its local_steps steps).",
    "budget_fraction": "Instead of a rate: the fraction of the step time the step may wait on the exchange (the "
                       "rate follows measured times, agreed by every rank).",
    "budget_min_rate": "Lowest rate a budget may choose (refused without a budget).",
    "budget_max_rate": "Highest rate a budget may choose (refused without a budget).",
    "on_nonfinite": "A NaN/Inf gradient on any rank: every rank skips the step (skip), or raises (raise).",
    "drift_check_every": "Compare the replicas' parameters across nodes every N steps (0: never).",
    "on_drift": "How replicas are compared and what a difference does. auto (the default): raise where every "
                "replica runs the same device model and torch/CUDA/NCCL versions, tolerate where they differ "
                "(decided at the first check, the same on every rank), so a mixed cluster trains on. raise: nodes of "
                "one hardware model round alike, so replicas are bit-identical; an 8-byte fingerprint per parameter "
                "travels and any difference stops the run naming the parameters. resync: copy replica 0's values "
                "instead. tolerate, for nodes of unlike hardware, whose kernels round differently in the last bit: "
                "replica 0's shards are broadcast (one dense copy per check, counted in the bytes), a difference past "
                "drift_tolerance stops the run naming the parameters, a smaller one is logged "
                "(flexdemo/replica_drift) and replica 0's values are copied.",
    "drift_tolerance": "on_drift='tolerate': the largest difference between replicas, per parameter, in steps: "
                       "drift_tolerance * (lr + eps * max|p|), lr the group's peak learning rate and eps that of the "
                       "parameter's dtype. 2 lets a sign update flip where the consensus is within rounding of 0; "
                       "last-bit rounding measured ~1e-4 of it.",
    "local_steps": "Local steps H: each node takes H AdamW steps on its own (no traffic), then the pseudo-gradient "
                   "(anchor - local) enters error feedback, is compressed by the replicator and exchanged once, "
                   "and every node restarts from the updated anchor (DiLoCo / SparseLoCo). 1: exchange every step "
                   "(FlexDeMo's step-wise mode, preset='step-wise').",
    "outer_lr": "local_steps > 1: the anchor moves by outer_lr times the replicas' mean pseudo-gradient (another "
                "value with local_steps=1 is refused: it would do nothing).",
    "outer_momentum": "local_steps > 1: Nesterov momentum of that outer step (DiLoCo: outer_lr 0.7, 0.9); 0: plain "
                      "averaging with error feedback (SparseLoCo); refused with local_steps=1.",
    "outer_delay": "local_steps > 1 with overlap='delayed' (streaming): the inner steps a round's exchange travels "
                   "during before it moves the anchor (Streaming DiLoCo's tau); the progress of those steps enters "
                   "error feedback, so replicas restart from one anchor and nothing is lost. Refused with "
                   "local_steps=1 or overlap='none', where nothing streams.",
    "outer_fragments": "local_steps > 1, streamed: split the parameters into this many fragments (balanced by size) "
                       "whose rounds are staggered by local_steps / outer_fragments steps (Streaming DiLoCo), so "
                       "each exchange carries about 1/outer_fragments of the payload and the link is busy evenly; "
                       "each fragment still syncs every local_steps steps. Must divide local_steps, with "
                       "outer_delay <= local_steps / outer_fragments. 1: the whole model in one round. None (default): "
                       "the largest divisor of local_steps up to 4 that leaves outer_delay <= local_steps / "
                       "outer_fragments when streamed (4 at the defaults), else 1.",
}
PRESET_HELP = ("A named set of knob values applied to the knobs left at their default: default (the package's "
               "measured defaults: local_steps=8, top-k of the values, int2, streamed in 4 fragments), step-wise "
               "(local_steps=1: a compressed momentum exchange every step, DCT, float8 values, the default before "
               "local steps), flexdemo-paper (the "
               "FlexDeMo authors' rule: momentum=lr, update=sign, consensus=choosers, 4 of each 8 x 8 block, float32 "
               "values), demo-paper (DeMo's defaults: 32 of each 64 x 64 block, sign, float32 values); the paper "
               "presets are step-wise. A knob set to anything but its default overrides the preset, except a "
               "local_steps that contradicts a step-wise preset, which is refused.")
