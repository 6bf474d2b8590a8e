"""The model card of a ``FlexDeMoTrainer`` run: Trainer's card, corrected, and a "FlexDeMo training" section.

``Trainer.create_model_card`` renders a ``transformers.modelcard.TrainingSummary`` that
``TrainingSummary.from_trainer`` fills from the trainer. Four of its statements are wrong for a FlexDeMo run, and no
argument of ``create_model_card`` sets them right:

* ``optimizer``: ``TrainingArguments.optim`` (``adamw_torch_fused`` by default), which FlexDeMo replaces;
* ``distributed_type``: "multi-GPU" for any run of several processes, CPU (gloo) ones too;
* "a fine-tuned version of [](https://huggingface.co/)": a model built from a config has an empty
  ``_name_or_path``, which Trainer takes for its base model; such a model was trained from scratch;
* "on the None dataset": a data set built in memory has no builder name, which Trainer takes for the data set's.

So :func:`write_model_card` builds the same summary, corrects those four (:func:`correct_summary`), renders it as
Trainer does and appends :func:`flexdemo_section`: what was in force (the mode, the topology, the knobs that shaped
the run) and the inter-node traffic it cost.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from huggingface_hub import ModelCard
from transformers.modelcard import TrainingSummary
from transformers.training_args import OptimizerNames, TrainingArguments

from .. import knobs
from ..optim.local_steps import LocalSteps
from .config import FlexDeMoConfig, trained_parameters
from .elastic import TopologyChange
from .topology import Topology

if TYPE_CHECKING:
    from ..optim.optimizer import FlexDeMo
    from .trainer import FlexDeMoTrainer

PACKAGE = "hf-flexdemo"
PYPI_URL = "https://pypi.org/project/hf-flexdemo/"
METHOD_URL = "https://arxiv.org/abs/2502.06728"  # the FlexDeMo paper
TAG = "flexdemo"
# The Project-URL labels (pyproject.toml [project.urls]) that name the package's repository, most specific first.
_URL_LABELS = ("repository", "source", "source code", "code", "homepage")


def package_url() -> str:
    """The package's repository as its metadata names it (``[project.urls]``), else its PyPI page."""
    try:
        entries = importlib.metadata.metadata(PACKAGE).get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:
        entries = []
    urls = {label.strip().lower(): url.strip() for label, _, url in (e.partition(",") for e in entries) if url}
    return next((urls[label] for label in _URL_LABELS if label in urls), PYPI_URL)


def training_mode(config: FlexDeMoConfig, replicas: int, fragments: int | None = None,
                  outer_lr: float | None = None) -> str:
    """How the nodes exchanged, in words, on ``replicas`` nodes; ``fragments``: the number a streamed round ran in
    (default: the config's ``outer_fragments``; fewer where the model has fewer trainable tensors,
    :func:`fragments_ran`); ``outer_lr``: the outer step that ran (default: the config's, its default resolved on
    ``replicas`` nodes; a run resumed on other nodes keeps its checkpoint's)."""
    if config.method != "flexdemo":
        return config.method
    config = config.for_run(None)  # local_steps=None not yet resolved for a run (no train() yet): a long run's
    if config.local_steps == 1:
        return "compressed momentum exchange every step"
    fragments = config.outer_fragments if fragments is None else fragments
    outer = (f"Nesterov outer momentum {config.outer_momentum:g}" if config.outer_momentum
             else "plain averaging with error feedback")
    staggered = (f", in {fragments} fragments whose rounds are staggered by "
                 f"{config.local_steps // fragments} step(s)" if fragments > 1 else "")
    streaming = (f", streamed: it lands {config.outer_delay} inner step(s) after it starts{staggered}"
                 if config.overlap == "delayed" else "")
    selected = "DCT coefficients" if config.compression_transform == "dct" else "values"
    memory = ("" if config.progress_scale_decay is None
              else f" by an estimate of decay {config.progress_scale_decay:g}")
    if config.progress_scale_estimate == "micro_batches":
        memory = f"{memory or ' by an estimate'} from each step's micro-batches"
    if config.progress_scale_path == "lengthened":
        memory = f"{memory}, each node walking its lengthened steps"
    scaled = (f", each node's progress lengthened per element to the nodes' batch{memory}"
              if config.progress_scale == "batch" else "")
    outer_lr = knobs.resolve_outer_lr(config.outer_lr if outer_lr is None else outer_lr, replicas, config.replicator)
    return (f"local steps: {config.local_steps} AdamW steps per node, then a compressed pseudo-gradient "
            f"exchange (top-k of its {selected}{scaled}, {outer}, outer lr {outer_lr:g}{streaming})")


def fragments_ran(optimizer: FlexDeMo | None) -> int | None:
    """The fragments the optimizer's streamed rounds run in, as its plan assigned them (``None``: no such rounds)."""
    mode = getattr(optimizer, "mode", None)
    return mode.fragments if isinstance(mode, LocalSteps) and mode.streaming else None


def _wire_ran(config: FlexDeMoConfig, topology: Topology) -> bool:
    """Whether a compressed exchange ran: between nodes, or emulated on one (``replicator="none"``)."""
    return config.method != "adamw" and (topology.replicate_size > 1 or config.replicator == "none")


def knobs_in_force(config: FlexDeMoConfig, topology: Topology, optimizer: FlexDeMo | None = None) -> dict[str, Any]:
    """The knobs that shaped the run: those that define its mode (and, where one ran, its wire), then every other
    one set away from the default it has in that mode; knobs that did not run (a budget's bounds without a budget,
    the wire on one node) are left out unless set."""
    config = config.for_run(None)  # local_steps=None not yet resolved for a run (no train() yet): a long run's
    shown: dict[str, Any] = {"method": config.method}
    if config.method == "adamw":
        shown["reduce_dtype"] = config.reduce_dtype
    else:
        if config.flexdemo_preset != "default":
            shown["flexdemo_preset"] = config.flexdemo_preset
        shown["local_steps"] = config.local_steps
        if config.local_steps == 1:
            shown |= {"momentum": config.momentum, "update": config.update}
        shown["overlap"] = config.overlap
        if config.local_steps > 1 and config.overlap == "delayed":
            ran = fragments_ran(optimizer)
            shown["outer_fragments"] = (config.outer_fragments if ran in (None, config.outer_fragments) else
                                        f"{config.outer_fragments} (ran in {ran}: a fragment holds whole tensors)")
        if _wire_ran(config, topology):
            shown["replicator"] = config.replicator
            if config.budget_bytes is not None or config.budget_fraction is not None:
                budget = "budget_bytes" if config.budget_bytes is not None else "budget_fraction"
                shown[budget] = getattr(config, budget)
                if optimizer is not None and optimizer.rate is not None:
                    shown["rate (the budget's last)"] = f"{optimizer.rate:g}"
            elif config.compression_topk is not None:
                shown["compression_topk"] = config.compression_topk
            else:
                shown["compression_rate"] = config.compression_rate or knobs.DEFAULT_RATE
            shown |= {"compression_transform": config.compression_transform, "value_dtype": config.value_dtype,
                      "compression_chunk": config.compression_chunk}
        mode = {"local_steps": config.local_steps, "replicator": config.replicator, "overlap": config.overlap,
                "outer_delay": config.outer_delay}
        default = knobs.resolve({**knobs.DEFAULTS, **mode})
        shown |= {key: value for key, value in config.optimizer_kwargs().items()
                  if key not in shown and value != default[key]}
    shown |= {key: getattr(config, key) for key in ("shard_size", "resume_policy") if getattr(config, key) is not None}
    if config.elastic:
        shown["elastic"] = True
    return shown


def _mode_line(config: FlexDeMoConfig, topology: Topology, optimizer: FlexDeMo | None) -> str:
    if config.method == "adamw":
        return (f"- mode: the AdamW-HSDP baseline: FSDP2 HSDP, sharded inside each node, a dense {config.reduce_dtype} "
                "gradient all-reduce between nodes (torch AdamW; FlexDeMo's knobs do not apply)")
    if topology.replicate_size == 1:
        if config.replicator == "none":
            mode = training_mode(config, 1, fragments_ran(optimizer))
            return f"- one node, the exchange emulated (replicator='none'): {mode}"
        if optimizer is None:
            return "- one node: nothing crosses nodes, so nothing is compressed"
        ran = "the optimizer ran as torch's AdamW" if optimizer.adamw_only else "the exchange ran as its dense limit"
        return f"- one node: nothing crossed nodes, so nothing was compressed: {ran}"
    if config.method == "demo":
        return ("- mode: the DeMo baseline: no sharding, every rank a replica, DeMo's compressed momentum exchange "
                "across all of them every step")
    ran = optimizer.options["outer_lr"] if optimizer is not None else None
    return f"- mode: {training_mode(config, topology.replicate_size, fragments_ran(optimizer), ran)}"


def _size(count: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def traffic_lines(config: FlexDeMoConfig, topology: Topology, total_bytes_sent: float, steps: int, parameters: int,
                  log_history: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The inter-node traffic, per node and optimizer step: ``total_bytes_sent`` (every rank's, the end-of-run round
    included: the trainer's ``flexdemo/total_bytes_sent``) over the nodes and ``steps``; in bits per parameter of
    the ``parameters`` trainable ones; and against a dense all-reduce, as last logged."""
    nodes = topology.replicate_size
    if nodes == 1:
        return ["- inter-node traffic: none (one node)"]
    if config.method == "adamw":
        return [f"- inter-node traffic: FSDP2's dense {config.reduce_dtype} gradient all-reduce (not counted)"]
    if steps == 0:
        return ["- inter-node traffic: none yet (no optimizer step)"]
    per_step = total_bytes_sent / nodes / steps
    bits = 8 * per_step / parameters if parameters else float("nan")
    lines = [f"- inter-node traffic: {_size(per_step)} sent per node and optimizer step, {bits:.3g} bits per parameter "
             f"per step (the mean over {steps} steps, the end-of-run round included; {_size(total_bytes_sent)} sent "
             f"in all by the {nodes} nodes)"]
    last = next((entry for entry in reversed(log_history) if "flexdemo/compression_ratio" in entry), None)
    if last is not None:
        lines.append(f"- traffic vs a dense bf16 all-reduce (AdamW-HSDP, reduce_dtype=bfloat16): "
                     f"1/{last['flexdemo/compression_ratio']:.1f}")
        lines.append(f"- traffic vs a dense fp32 all-reduce (AdamW-HSDP, FSDP2's default): "
                     f"1/{last['flexdemo/compression_ratio_fp32']:.1f}")
    return lines


def topology_lines(topology: Topology, changes: Sequence[TopologyChange] = ()) -> list[str]:
    """The topology the run ended on, and each change on the way (a resume on another topology)."""
    lines = [f"- topology: {topology.replicate_size} node(s) x {topology.shard_size} process(es) per node"
             + (f", after {len(changes)} change(s):" if changes else "")]
    return lines + [f"  - at {change.describe()}" for change in changes]


def flexdemo_section(config: FlexDeMoConfig, topology: Topology, optimizer: FlexDeMo | None = None, *,
                     total_bytes_sent: float = 0.0, steps: int = 0, parameters: int = 0,
                     log_history: Sequence[Mapping[str, Any]] = (), changes: Sequence[TopologyChange] = ()) -> str:
    """The card's "FlexDeMo training" section: the package, the topology (and its ``changes`` during the run), the
    mode, the knobs in force (:func:`knobs_in_force`) and the traffic (:func:`traffic_lines`); ``optimizer``: the
    run's, once created."""
    lines = ["", "## FlexDeMo training", "",
             f"Trained with [{PACKAGE}]({package_url()}), the FlexDeMo optimizer on FSDP2 for the Hugging Face "
             f"Trainer (method: [FlexDeMo]({METHOD_URL})).", "",
             *topology_lines(topology, changes),
             _mode_line(config, topology, optimizer),
             ("- knobs configured (on one node none of them ran: the optimizer was torch's AdamW):"
              if optimizer is not None and optimizer.adamw_only else
              "- knobs in force (those that define the mode and the wire, and any other set away from its default):"),
             *(f"  - {key}: {value}" for key, value in knobs_in_force(config, topology, optimizer).items()),
             *traffic_lines(config, topology, total_bytes_sent, steps, parameters, log_history)]
    return "\n".join(lines) + "\n"


def optimizer_entry(config: FlexDeMoConfig, args: TrainingArguments, optimizer: FlexDeMo | None = None) -> str:
    """The card's ``optimizer`` hyperparameter: what ran, not ``args.optim`` where FlexDeMo replaced it."""
    betas = f"betas=({args.adam_beta1},{args.adam_beta2}) and epsilon={args.adam_epsilon}"
    if config.method == "adamw":  # Trainer's optimizer, args.optim
        name = OptimizerNames(args.optim).value
        extra = f" and optimizer_args={args.optim_args}" if args.optim_args else ""
        return f"{name} with {betas}{extra}" if "adam" in name else f"{name}{extra}"
    if optimizer is not None and optimizer.adamw_only:
        return f"FlexDeMo, which on one node ran as torch's AdamW, with {betas}"
    return f"FlexDeMo with {betas}; its mode and knobs under \"FlexDeMo training\" below"


def distributed_entry(topology: Topology, device_type: str, backend: str | None = None) -> str:
    """The card's ``distributed_type``: the devices (and backend) and the topology."""
    kind = {"cpu": "CPU", "cuda": "GPU"}.get(device_type, device_type)
    return (f"multi-{kind}{f' ({backend})' if backend else ''}: {topology.replicate_size} node(s) x "
            f"{topology.shard_size} process(es) per node")


def _listify(value: Any) -> list[Any]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def correct_summary(summary: TrainingSummary, *, optimizer: str, distributed: str) -> TrainingSummary:
    """``summary`` (``TrainingSummary.from_trainer``'s) with what the module docstring lists made right:
    ``optimizer`` and (where Trainer records one) ``distributed_type`` replaced, an empty base model dropped (the
    card then says "trained from scratch"), data sets without a name dropped; and no empty "Training results"
    heading where nothing was evaluated during training."""
    if not summary.finetuned_from:
        summary.finetuned_from = None
    summary.dataset = [name for name in _listify(summary.dataset) if name] or None
    if not any(_listify(summary.dataset_tags)):
        summary.dataset_tags = summary.dataset_args = summary.dataset_metadata = None
    hyperparameters = dict(summary.hyperparameters or {})
    hyperparameters["optimizer"] = optimizer
    if "distributed_type" in hyperparameters:
        hyperparameters["distributed_type"] = distributed
    summary.hyperparameters = hyperparameters
    if not summary.eval_lines:
        summary.eval_lines = None
    return summary


def write_model_card(
    trainer: FlexDeMoTrainer,
    language: str | None = None,
    license: str | None = None,
    tags: str | list[str] | None = None,
    model_name: str | None = None,
    finetuned_from: str | None = None,
    tasks: str | list[str] | None = None,
    dataset_tags: str | list[str] | None = None,
    dataset: str | list[str] | None = None,
    dataset_args: str | list[str] | None = None,
) -> None:
    """``README.md`` in ``trainer.args.output_dir``, as ``Trainer.create_model_card`` writes it (same arguments; the
    tags of a card already there are kept, a PEFT adapter's card updated), corrected (:func:`correct_summary`), with
    the ``flexdemo`` tag and the "FlexDeMo training" section. Main process only; no collective."""
    if not trainer.is_world_process_zero():
        return
    path = Path(trainer.args.output_dir, "README.md")
    tags = list(dict.fromkeys([*_listify(tags), TAG]))
    peft = False
    if path.exists():
        existing = ModelCard.load(path).data
        peft = existing.get("library_name") == "peft"
        tags += [tag for tag in existing.tags or [] if tag not in tags]
    summary = TrainingSummary.from_trainer(
        trainer, language=language, license=license, tags=tags, model_name=model_name, finetuned_from=finetuned_from,
        tasks=tasks, dataset_tags=dataset_tags, dataset=dataset, dataset_args=dataset_args,
    )
    config, topology, optimizer = trainer.flexdemo_config, trainer.topology, trainer.flexdemo_optimizer
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
    correct_summary(summary, optimizer=optimizer_entry(config, trainer.args, optimizer),
                    distributed=distributed_entry(topology, trainer.args.device.type, backend))
    section = flexdemo_section(config, topology, optimizer, total_bytes_sent=trainer.comm_metrics.total_bytes_sent,
                               steps=trainer.state.global_step, parameters=trained_parameters(trainer.model),
                               log_history=trainer.state.log_history, changes=trainer.topology_changes)
    path.write_text(summary.to_model_card() + section, encoding="utf-8")
    if peft:
        trainer.accelerator.unwrap_model(trainer.model).create_or_update_model_card(trainer.args.output_dir)
