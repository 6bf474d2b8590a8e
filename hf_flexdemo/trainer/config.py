"""``FlexDeMoConfig``: the training setup in one dataclass that ``HfArgumentParser`` can fill.

Its knob fields are generated from the knob table (:data:`hf_flexdemo.knobs.KNOBS`), flat as command-line flags are:
the same names, types (``Literal`` choices, so ``--help`` lists them and argparse refuses anything else), defaults,
help texts and validation that ``FlexDeMo`` reads, so the config and the optimizer cannot disagree. ``lr``,
``weight_decay``, ``betas`` and ``eps`` come from ``TrainingArguments``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from .. import knobs
from ..optim.reshard import RESUME_POLICIES, ResumePolicy

if TYPE_CHECKING:
    import torch

Method = Literal["flexdemo", "demo", "adamw"]
METHODS: tuple[str, ...] = get_args(Method)
ReduceDtype = Literal["float32", "bfloat16"]
REDUCE_DTYPES: tuple[str, ...] = get_args(ReduceDtype)
RESUME_POLICY_HELP = (
    "Resuming a checkpoint written on another topology (nodes x processes per node): what each new node's per-node "
    "optimizer state (error feedback, the replica's gradient moments; with local steps the inner AdamW moments and "
    "a mid-round local shard) starts from. average: the mean over the old nodes; reset: zeros, as a fresh "
    "optimizer; keep: new node n takes old node n's (the number of nodes unchanged, e.g. a new number of processes "
    "per node). Replicated state (anchor, consensus-fed AdamW moments, step counts) reshards exactly under every "
    "policy. None (the default): refuse a topology change, since it cannot resume exactly (per-node momentum is "
    "merged or dropped, and the global batch changes with the world size); a wrong launch would otherwise continue "
    "as a different run without a word. The same topology always resumes exactly.")
ELASTIC_HELP = (
    "For an elastic launcher that restarts the script after a node fails or joins (torchrun --nnodes MIN:MAX "
    "--max-restarts K --rdzv-backend c10d; docs/multi-node.md): train() without resume_from_checkpoint resumes from "
    "the last complete checkpoint in output_dir (from scratch where there is none), on the topology it now has, "
    "under resume_policy ('average' unless set); each restart logs the steps it lost and the topology change, and "
    "the model card lists them. Save checkpoints often (save_steps): a restart resumes from the last one.")
ASYNC_SAVE_HELP = (
    "At each checkpoint, every rank copies its optimizer state to host memory and a background thread writes it "
    "while training goes on; the checkpoint counts as complete, and is resumed, only once every rank's file has "
    "landed. False: written before the next step. None (the default): True, except with method='adamw', whose "
    "optimizer state Trainer saves itself.")
# The knobs Trainer's own arguments set (--learning_rate, --weight_decay, --adam_beta1/2, --adam_epsilon).
FROM_TRAINING_ARGUMENTS = ("lr", "weight_decay", "betas", "eps")
KNOB_FIELDS: tuple[str, ...] = tuple(knob.name for knob in knobs.KNOBS if knob.name not in FROM_TRAINING_ARGUMENTS)

_SETUP_BEFORE = [
    ("method", Method, field(default="flexdemo", metadata={
        "help": "Training setup: flexdemo (FSDP2 inside each node, FlexDeMo between nodes), demo (every rank a "
                "replica, DeMo), adamw (FSDP2 HSDP with torch AdamW, the baseline)."})),
    # Named flexdemo_preset: the recipes' --data_preset names a data set.
    ("flexdemo_preset", knobs.Preset, field(default="default", metadata={"help": knobs.PRESET_HELP})),
]
_SETUP_AFTER = [
    ("shard_size", int | None, field(default=None, metadata={
        "help": "Processes per node (FSDP group size). Default: from the launcher (accelerate's "
                "parallelism_config_dp_shard_size, else LOCAL_WORLD_SIZE)."})),
    ("reduce_dtype", ReduceDtype, field(default="float32", metadata={
        "help": "method='adamw' only: dtype of FSDP2's gradient reduce-scatter and cross-node all-reduce "
                "(MixedPrecisionPolicy.reduce_dtype; float32 as torchtitan, bfloat16 halves the bytes)."})),
    ("resume_policy", ResumePolicy | None, field(default=None, metadata={"help": RESUME_POLICY_HELP})),
    ("elastic", bool, field(default=False, metadata={"help": ELASTIC_HELP})),
    ("async_save", bool | None, field(default=None, metadata={"help": ASYNC_SAVE_HELP})),
]


def _post_init(self: Any) -> None:
    if self.method not in METHODS:
        raise ValueError(f"FlexDeMoConfig: invalid method={self.method!r}; accepted: {' | '.join(METHODS)}.")
    if self.shard_size is not None and (not isinstance(self.shard_size, int) or self.shard_size < 1):
        raise ValueError(f"FlexDeMoConfig: invalid shard_size={self.shard_size!r}; accepted: None or an integer >= 1.")
    if self.reduce_dtype not in REDUCE_DTYPES:
        raise ValueError(f"FlexDeMoConfig: invalid reduce_dtype={self.reduce_dtype!r}; accepted: "
                         f"{' | '.join(REDUCE_DTYPES)}.")
    if self.resume_policy is not None and self.resume_policy not in RESUME_POLICIES:
        raise ValueError(f"FlexDeMoConfig: invalid resume_policy={self.resume_policy!r}; accepted: None | "
                         f"{' | '.join(RESUME_POLICIES)}.")
    if self.reduce_dtype != "float32" and self.method != "adamw":
        raise ValueError(f"FlexDeMoConfig: reduce_dtype={self.reduce_dtype!r} with method={self.method!r}; accepted: "
                         "reduce_dtype='float32' unless method='adamw' (it sets the AdamW-HSDP baseline's gradient "
                         "reduction; FlexDeMo's exchange has its own wire type, value_dtype).")
    if self.elastic not in (True, False):
        raise ValueError(f"FlexDeMoConfig: invalid elastic={self.elastic!r}; accepted: True | False.")
    if self.elastic and self.method == "adamw":
        raise ValueError("FlexDeMoConfig: elastic=True with method='adamw'; accepted: method='flexdemo' | 'demo' "
                         "(their checkpoints record the topology and reshard onto another), or elastic=False for the "
                         "AdamW-HSDP baseline, which resumes through Trainer on the topology it was saved on.")
    if self.async_save not in (None, True, False):
        raise ValueError(f"FlexDeMoConfig: invalid async_save={self.async_save!r}; accepted: None | True | False.")
    if self.async_save and self.method == "adamw":
        raise ValueError("FlexDeMoConfig: async_save=True with method='adamw'; accepted: None or False with "
                         "method='adamw' (Trainer saves the AdamW-HSDP baseline's optimizer state itself), or "
                         "method='flexdemo' | 'demo'.")
    if self.elastic and self.resume_policy is None:
        self.resume_policy = "average"  # a restart may come back on fewer or more nodes
    if self.method == "adamw":
        moved = {key: value for key, value in self.optimizer_kwargs().items() if value != knobs.DEFAULTS[key]}
        if self.flexdemo_preset != "default":
            moved = {"flexdemo_preset": self.flexdemo_preset, **moved}
        if moved:
            given = ", ".join(f"{key}={value!r}" for key, value in moved.items())
            raise ValueError(f"FlexDeMoConfig: {given} with method='adamw'; accepted: the defaults with "
                             "method='adamw' (the AdamW-HSDP baseline: torch's AdamW and FSDP's dense all-reduce "
                             "between nodes, which read no FlexDeMo knob), or method='flexdemo' | 'demo' to use them.")
        return  # nothing to resolve: the fields keep their defaults (replace() and a re-parse round-trip)
    if self.method == "demo" and self.shard_size not in (None, 1):
        raise ValueError(f"FlexDeMoConfig: shard_size={self.shard_size!r} with method='demo'; accepted: None or 1 "
                         "with method='demo' (every rank is its own replica: nothing is sharded), or "
                         "method='flexdemo' to shard inside nodes.")
    preset = knobs.apply_preset(self.flexdemo_preset, self.optimizer_kwargs(), field="flexdemo_preset")
    knobs.validate(preset)
    # the fields show the knobs in use (model card, results JSONs); with local_steps left to the run's length, once
    # the Trainer knows it (for_run): the knobs that follow from local_steps wait for it
    for key, value in (preset if preset["local_steps"] is None else knobs.resolve(preset)).items():
        setattr(self, key, value)


def trained_parameters(model: torch.nn.Module | None) -> int | None:
    """How many parameters ``model`` trains (each shared one once; a sharded one whole): the size
    ``local_steps=None`` follows and the model card's bits are per; ``None`` without a model."""
    if model is None:
        return None
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _for_run(self: Any, max_steps: int | None, parameters: int | None = None) -> Any:
    """This config for a run of ``max_steps`` steps on a model of ``parameters`` parameters (each ``None``: not
    known): ``local_steps=None`` and the knobs that follow from it resolved
    (:func:`hf_flexdemo.knobs.resolve_local_steps`); itself when nothing waits for it."""
    if self.method == "adamw" or self.local_steps is not None:
        return self
    return dataclasses.replace(self, local_steps=knobs.resolve_local_steps(None, max_steps, parameters))


def _optimizer_kwargs(self: Any) -> dict[str, Any]:
    """The knobs this config sets, flat (``FlexDeMo``'s keywords through :func:`hf_flexdemo.policies.from_knobs`)."""
    return {key: value for key, value in asdict(self).items() if key in KNOB_FIELDS}


FlexDeMoConfig = dataclasses.make_dataclass(
    "FlexDeMoConfig",
    [*_SETUP_BEFORE, *((knob.name, knob.type, field(default=knob.default, metadata={"help": knob.help}))
                       for knob in knobs.KNOBS if knob.name in KNOB_FIELDS), *_SETUP_AFTER],
    namespace={"__post_init__": _post_init, "optimizer_kwargs": _optimizer_kwargs, "for_run": _for_run,
               "__module__": __name__,
               "_argument_group_name": "FlexDeMo",  # HfArgumentParser's --help heading for these flags
               "__doc__": """How to train across nodes. ``method`` picks the whole setup; the rest tunes FlexDeMo.

    * ``flexdemo``: FSDP2 inside each node, FlexDeMo (compressed momentum) across nodes.
    * ``demo``: no sharding; every rank is its own replica and DeMo runs across all of them.
    * ``adamw``: the stock baseline: FSDP2 HSDP (dense all-reduce across nodes) with torch AdamW.

    The learning rate, weight decay and AdamW constants come from ``TrainingArguments``; every other FlexDeMo knob
    is a field (:data:`hf_flexdemo.knobs.KNOBS`).

    What does not apply is refused rather than ignored: with ``method="adamw"`` the FlexDeMo knobs and
    ``flexdemo_preset`` must stay at their defaults, since the baseline runs torch's AdamW and FSDP's dense
    all-reduce and reads none of them; ``reduce_dtype`` is the baseline's alone; ``method="demo"`` shards nothing,
    so ``shard_size`` is ``None`` or 1; a knob the mode does not read, or that only acts with another one (the
    budget's rate bounds with a budget), is refused (:func:`hf_flexdemo.knobs.validate`).
    """},
)
