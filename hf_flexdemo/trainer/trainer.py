"""``FlexDeMoTrainer``: ``transformers.Trainer`` with FSDP2 inside each node and FlexDeMo across nodes.

What it changes in ``Trainer``, and why:

* the Accelerate setup: an FSDP2 plugin and a parallelism config built from ``FlexDeMoConfig.method``
  and the launcher's topology (see :mod:`hf_flexdemo.trainer.topology`); on CPU, :mod:`hf_flexdemo.trainer.cpu_fsdp`;
* the optimizer: FlexDeMo on the replicate group (``create_optimizer``; ``optimizers=`` is refused
  by ``Trainer`` under FSDP), with DDP's gradient all-reduce switched off where DDP wraps the model;
* evaluation, prediction and saved weights see the replicas' consensus: with local steps, in the middle of a
  round, the anchor rather than one node's local values (:mod:`hf_flexdemo.trainer.consensus`);
* checkpoints (:mod:`hf_flexdemo.trainer.checkpoint_hooks`): per-rank optimizer state, the topology, a completion
  marker (:mod:`hf_flexdemo.trainer.checkpoint`); a resume on another topology under
  ``FlexDeMoConfig.resume_policy`` (:mod:`hf_flexdemo.optim.reshard`), the model's weights included across the FSDP2
  / plain-replica boundary (one process per node); with ``FlexDeMoConfig.elastic``, a restarted script's ``train()``
  resumes from the last complete checkpoint on the topology it now has (:mod:`hf_flexdemo.trainer.elastic`);
* logs: ``flexdemo/*`` traffic metrics (:mod:`hf_flexdemo.trainer.comm_metrics`), the replicas' measured drift
  (the bounded drift check); the model card (:mod:`hf_flexdemo.trainer.model_card`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import os
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.parallel import DistributedDataParallel
from transformers import Seq2SeqTrainer, Trainer, TrainingArguments
from transformers.training_args import OptimizerNames
from transformers.utils import logging as hf_logging

from .. import knobs
from ..optim.mesh import group_timeout, init_process_group, launcher_shard_size, shard_model
from ..optim.optimizer import FlexDeMo
from ..policies import from_knobs
from . import model_card
from .checkpoint_hooks import CheckpointHooks
from .comm_metrics import CommMetricsCallback, unwrap_optimizer
from .config import FlexDeMoConfig, trained_parameters
from .consensus import ConsensusModel
from .cpu_fsdp import enable_fsdp_on_cpu
from .elastic import ProgressCallback, TopologyChange
from .model_card import training_mode
from .topology import Topology, parallelism_config

# Trainer's own logger: the setup line obeys TrainingArguments.log_level / log_level_replica (and transformers'
# set_verbosity_*) exactly as Trainer's "***** Running training *****" summary does.
logger = hf_logging.get_logger("transformers.trainer")

# FSDP2 warns when a sharded module returns a view that requires grad (an in-place op on it would drop the
# pre-backward hook). T5's is block 0's relative position bias, which the later blocks only add out of place:
# gradients match the unsharded model's (tests/distributed/test_fsdp_t5_views_distributed.py).
T5_VIEW_WARNING = r"FSDP2-wrapped module \(FSDPT5Block\) returned a view tensor"
T5_VIEW_WARNING_MODULE = r"torch\.distributed\.fsdp\."

# Set by `accelerate launch` from a YAML; the trainer passes its own plugin and parallelism config.
_LAUNCHER_ENV = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_PARALLELISM_CONFIG")


@contextlib.contextmanager
def _without_env(names: tuple[str, ...]) -> Iterator[None]:
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def ignore_t5_view_warning() -> None:
    """Silence FSDP2's view-output warning for T5 blocks only (:data:`T5_VIEW_WARNING`: harmless there)."""
    warnings.filterwarnings("ignore", message=T5_VIEW_WARNING, category=UserWarning, module=T5_VIEW_WARNING_MODULE)


def _local_gradients(state, bucket):  # DDP rejects string annotations (postponed evaluation) on hooks
    """DDP communication hook that keeps each rank's own gradient: FlexDeMo does the exchange."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def reduce_each_micro_batch(args: TrainingArguments) -> None:
    """``progress_scale_estimate="micro_batches"`` reads each step's micro-batches, each reduced inside the node: refuse
    fewer than two, or Accelerate told not to reduce each one; then set its ``sync_each_batch``."""
    if args.gradient_accumulation_steps < 2:
        raise ValueError(f"FlexDeMo: invalid gradient_accumulation_steps={args.gradient_accumulation_steps} with "
                         "progress_scale_estimate='micro_batches'; accepted: 2 or more (--gradient_accumulation_steps "
                         "2, with half the per-device batch): its estimate is the product of a step's micro-batches; "
                         "or progress_scale_estimate='consecutive'.")
    kwargs = args.accelerator_config.gradient_accumulation_kwargs or {}
    if not kwargs.get("sync_each_batch", True):
        raise ValueError("FlexDeMo: invalid accelerator_config.gradient_accumulation_kwargs sync_each_batch=False with "
                         "progress_scale_estimate='micro_batches'; accepted: True, or unset (the trainer sets it): the "
                         "estimate reads each micro-batch's gradient reduced inside the node.")
    args.accelerator_config.gradient_accumulation_kwargs = {**kwargs, "sync_each_batch": True}
    logger.info("FlexDeMo: progress_scale_estimate='micro_batches': each micro-batch's gradient is reduced inside the "
                "node (Accelerate's sync_each_batch=True)")


def as_config(config: FlexDeMoConfig | Mapping[str, Any] | None) -> FlexDeMoConfig:
    """``flexdemo_config=`` as a ``FlexDeMoConfig``: ``None`` gives the defaults, a dict its fields; an unknown key
    is refused with the closest field name, any other type is refused."""
    if config is None or isinstance(config, FlexDeMoConfig):
        return config or FlexDeMoConfig()
    if not isinstance(config, Mapping):
        raise ValueError(f"FlexDeMo: invalid flexdemo_config={config!r} (a {type(config).__name__}); accepted: a "
                         "FlexDeMoConfig, a dict of its fields (e.g. {'local_steps': 4}), or None for the defaults.")
    names = [f.name for f in dataclasses.fields(FlexDeMoConfig)]
    for key in config:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "FlexDeMoConfig's fields are listed by --help"
            raise ValueError(f"FlexDeMo: invalid flexdemo_config key {key!r}; accepted: a FlexDeMoConfig field "
                             f"({hint})")
    return FlexDeMoConfig(**config)


def describe_setup(config: FlexDeMoConfig, topology: Topology, source: str) -> str:
    """The topology resolved (``source``: what said the processes per node) and what crosses nodes, in one line."""
    nodes, per_node = topology.replicate_size, topology.shard_size
    head = (f"FlexDeMo: {nodes} node(s) x {per_node} process(es) ({source}), method={config.method!r}: ")
    if nodes == 1:
        alone = "one process" if per_node == 1 else f"FSDP2 over the node's {per_node} processes"
        if config.method != "flexdemo" or per_node == 1:
            return head + f"{alone}; nothing crosses nodes."
        if config.elastic:
            return head + (f"{alone}; nothing crosses nodes until another node joins, at the elastic launcher's next "
                           "restart (elastic=True).")
        return head + (f"{alone}; nothing crosses nodes (flexdemo/bytes_sent stays 0): FlexDeMo has no other node "
                       "to exchange with. To train across nodes, launch on each of them (torchrun --nnodes N "
                       "--nproc_per_node P, or an accelerate YAML with parallelism_config_dp_replicate_size: N).")
    if config.method == "adamw":
        return head + (f"FSDP2 HSDP: sharded inside each node, a dense {config.reduce_dtype} gradient all-reduce "
                       "between nodes (torch AdamW).")
    if config.method == "demo":
        return head + f"no sharding; DeMo's compressed exchange across all {topology.world_size} ranks."
    return head + f"FSDP2 inside each node, FlexDeMo between nodes ({training_mode(config, nodes)})."


def _trainer_arguments(init: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``Trainer.__init__``'s arguments by name, positional ones included (``kwargs`` if they do not bind: Trainer
    then reports the call itself)."""
    try:
        return dict(inspect.signature(init).bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


def for_run_logged(config: FlexDeMoConfig, max_steps: int | None, model: torch.nn.Module | None) -> FlexDeMoConfig:
    """``config`` for a run of ``max_steps`` steps training ``model`` (each ``None``: not known), logging once per run
    (rank 0) the rounds ``local_steps=None`` resolved to."""
    parameters = trained_parameters(model)
    resolved = config.for_run(max_steps, parameters)
    if resolved is not config and int(os.environ.get("RANK", "0")) == 0:  # as Trainer's own summary
        length = f"a run of {max_steps} steps" if max_steps else "a run of unknown length"
        size = f"{parameters:,} parameters" if parameters is not None else "a model of unknown size"
        logger.info(f"FlexDeMo: local_steps=None resolved to {resolved.local_steps} for {length} on {size} "
                    f"(rounds of {knobs.SHORT_RUN_LOCAL_STEPS} under {knobs.SHORT_RUN_STEPS} steps, of "
                    f"{knobs.LARGE_MODEL_LOCAL_STEPS} from {knobs.LARGE_MODEL_STEPS} steps on "
                    f"{knobs.LARGE_MODEL_PARAMETERS:,} parameters or more, else {knobs.LONG_RUN_LOCAL_STEPS}).")
    return resolved


class FlexDeMoTrainer(ConsensusModel, CheckpointHooks, Trainer):
    """``Trainer`` that trains with FlexDeMo (or the DeMo / AdamW-HSDP baselines) across nodes.

    Args:
        flexdemo_config: the method and optimizer knobs; ``FlexDeMoConfig()`` if omitted.
        *args, **kwargs: as for ``transformers.Trainer`` (``args`` is required). The learning rate,
            weight decay, AdamW betas/epsilon, schedule, logging and saving come from ``args``.
    """

    def __init__(self, *args: Any, flexdemo_config: FlexDeMoConfig | dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.flexdemo_config = as_config(flexdemo_config)
        training_args: TrainingArguments | None = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is None:
            raise ValueError("FlexDeMoTrainer needs args=TrainingArguments(...).")
        if training_args.max_steps > 0:  # the run's length known now: local_steps=None resolves before the checks
            self._resolve_for_run(training_args.max_steps, kwargs.get("model", args[0] if args else None))
        self._init_distributed(training_args)
        self._check_arguments(training_args, _trainer_arguments(super().__init__, args, kwargs))
        shard_size = 1 if self.flexdemo_config.method == "demo" else self.flexdemo_config.shard_size
        self.topology = Topology.resolve(training_args.world_size, shard_size)
        self._parallelism = parallelism_config(self.flexdemo_config.method, self.topology)
        self._fsdp_on_cpu = self._parallelism is not None and training_args.device.type == "cpu"
        self._configure_accelerate(training_args)
        super().__init__(*args, **kwargs)
        if self.is_fsdp_enabled:
            self._shard_model()
        self.add_callback(CommMetricsCallback())  # read through the comm_metrics property
        if self.flexdemo_config.elastic:
            self.add_callback(ProgressCallback())
        self._log_setup()
        self._init_checkpoint_writer()
        self._reshard = False  # set by train(): the checkpoint resumed was written on another topology
        self.topology_changes: list[TopologyChange] = []  # the run's, set by train() from the checkpoint resumed
        # weights loaded into the model (the best checkpoint, a user's load_state_dict) become the consensus
        self.model.register_load_state_dict_post_hook(self._adopt_loaded_weights)

    def _init_distributed(self, args: TrainingArguments) -> None:
        """Give the world group ``args.ddp_timeout``: Transformers creates it without one on CPU (30 min)."""
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            return
        timeout = timedelta(seconds=args.ddp_timeout)
        if dist.is_initialized():
            c10d._set_pg_timeout(timeout)
        else:
            init_process_group("cpu" if args.use_cpu or not torch.cuda.is_available() else "cuda", timeout)

    def _check_arguments(self, args: TrainingArguments, kwargs: dict[str, Any]) -> None:
        if args.fp16:
            raise ValueError("fp16=True is not supported: the loss scaler can skip a step on one rank only, "
                             "which deadlocks the others. Accepted: bf16=True or full precision.")
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != args.world_size:
            raise ValueError(f"{launched} processes were launched but TrainingArguments sees {args.world_size}: "
                             "on a machine without GPUs pass use_cpu=True (--use_cpu) so they run on gloo.")
        if self.flexdemo_config.method != "adamw" and self.flexdemo_config.overlap == "backward" and args.max_grad_norm:
            raise ValueError(f"max_grad_norm={args.max_grad_norm} with overlap='backward': the exchange starts during "
                             "backward, before Trainer clips the gradients, so clipping would not reach it. Accepted: "
                             "max_grad_norm=0 (--max_grad_norm 0) with overlap='backward', or overlap='none' | "
                             "'delayed' with clipping.")
        if self.flexdemo_config.method != "adamw" and kwargs.get("optimizer_cls_and_kwargs") is not None:
            raise ValueError("optimizer_cls_and_kwargs is not accepted with method='flexdemo'/'demo': the "
                             "optimizer is FlexDeMo, configured by flexdemo_config.")
        if self.flexdemo_config.method == "adamw":
            return
        method = self.flexdemo_config.method
        optimizers = kwargs.get("optimizers") or (None, None)
        if any(part is not None for part in optimizers):
            given = ", ".join(type(part).__name__ if part is not None else "None" for part in optimizers)
            raise ValueError(f"FlexDeMo: invalid optimizers=({given}) with method={method!r}; accepted: (None, None), "
                             "the default: the optimizer is FlexDeMo, configured by flexdemo_config, and its schedule "
                             "comes from TrainingArguments (lr_scheduler_type, warmup_*); for another optimizer use "
                             "method='adamw' or transformers.Trainer.")
        default = OptimizerNames(TrainingArguments.__dataclass_fields__["optim"].default)
        if OptimizerNames(args.optim) != default:
            raise ValueError(f"FlexDeMo: invalid optim={OptimizerNames(args.optim).value!r} with method={method!r}; "
                             f"accepted: the default ({default.value!r}, which it replaces): the optimizer is "
                             "FlexDeMo, whose knobs are FlexDeMoConfig's fields; drop --optim, or use method='adamw' "
                             "for the AdamW baseline.")
        if args.optim_args:
            raise ValueError(f"FlexDeMo: invalid optim_args={args.optim_args!r} with method={method!r}; accepted: "
                             "None: FlexDeMo's knobs are FlexDeMoConfig's fields (flexdemo_config).")

    def _configure_accelerate(self, args: TrainingArguments) -> None:
        """Point ``args`` at the FSDP2 plugin and parallelism config of the chosen method; with
        ``progress_scale_estimate="micro_batches"``, reduce inside the node after every micro-batch."""
        if self.flexdemo_config.method != "adamw" and self.flexdemo_config.progress_scale_estimate == "micro_batches":
            reduce_each_micro_batch(args)
        if self._parallelism is None:
            args.fsdp_plugin_args = None
            args.parallelism_config = None
            return
        args.fsdp_plugin_args = {
            **(args.fsdp_plugin_args or {}),
            "fsdp_version": 2,
            "auto_wrap_policy": "no_wrap",  # the trainer shards the model itself (_shard_model)
            "state_dict_type": "FULL_STATE_DICT",  # checkpoints and final saves load with from_pretrained
            "cpu_ram_efficient_loading": False,
        }
        args.parallelism_config = None if self._fsdp_on_cpu else self._parallelism

    def create_accelerator_and_postprocess(self) -> None:
        with _without_env(_LAUNCHER_ENV), group_timeout(timedelta(seconds=self.args.ddp_timeout)):
            super().create_accelerator_and_postprocess()
            if self._fsdp_on_cpu:
                plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
                enable_fsdp_on_cpu(self.accelerator, plugin, self._parallelism)
                self.is_fsdp_enabled = True

    def _shard_model(self) -> None:
        """FSDP2-shard the model before the optimizer is built (Accelerate then leaves it as it is).

        Accelerate's own wrapping puts the input embedding and the LM head in different FSDP groups,
        which tied embeddings (T5) do not allow; :func:`shard_model` keeps them in the root group.
        """
        # method="adamw" may reduce its gradients in bfloat16 (FlexDeMoConfig.reduce_dtype; float32 by default);
        # FSDP2 casts them before the reduce-scatter and the cross-node all-reduce, and back to the parameters'.
        bf16_reduce = self.flexdemo_config.reduce_dtype == "bfloat16"
        policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if bf16_reduce else None)  # None: the grads' dtype
        if self.accelerator.mixed_precision == "bf16":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                          reduce_dtype=torch.bfloat16 if bf16_reduce else torch.float32)
        ignore_t5_view_warning()
        shard_model(self.model, self.accelerator.torch_device_mesh, hsdp=self.flexdemo_config.method == "adamw",
                    mp_policy=policy)
        self.model._is_fsdp_managed_module = True  # Transformers' FSDP2 flag: generate() keeps ranks in step
        self.model_wrapped = self.model

    @property
    def flexdemo_optimizer(self) -> FlexDeMo | None:
        """The FlexDeMo instance once created (``None`` for ``method="adamw"``)."""
        inner = unwrap_optimizer(self.optimizer)
        return inner if isinstance(inner, FlexDeMo) else None

    @property
    def comm_metrics(self) -> CommMetricsCallback:
        """The traffic counter: the callback handler's instance (Trainer swaps in a new one when it restores callback
        states from a checkpoint, ``restore_callback_states_from_checkpoint=True``)."""
        return next(cb for cb in self.callback_handler.callbacks if isinstance(cb, CommMetricsCallback))

    def _log_setup(self) -> None:
        """Once, on the main process: the topology resolved and what crosses nodes. A warning where FlexDeMo has
        no other node to exchange with although several processes were launched (every step then logs
        ``bytes_sent`` 0); otherwise at info level, as Trainer's own run summary (``log_level="info"`` shows it)."""
        if not self.is_world_process_zero():
            return
        config, topology = self.flexdemo_config, self.topology
        if config.method == "demo":
            source = "method='demo': every rank is its own replica"
        elif config.shard_size is not None:
            source = f"shard_size={config.shard_size}"
        elif (launcher := launcher_shard_size()) is not None:
            source = f"{launcher[0]}={launcher[1]}"
        else:
            source = "no launcher variable: one node"
        message = describe_setup(config, topology, source)
        alone = (config.method == "flexdemo" and topology.replicate_size == 1 and topology.world_size > 1
                 and not config.elastic)  # an elastic run on one node waits for another to join
        (logger.warning if alone else logger.info)(message)

    def replicate_group(self) -> dist.ProcessGroup | None:
        """The ranks holding the same shard on other nodes (``None`` on a single node)."""
        if self.topology.replicate_size == 1:
            return None
        mesh = self.accelerator.torch_device_mesh
        if mesh is not None and "dp_replicate" in (mesh.mesh_dim_names or ()):
            return mesh["dp_replicate"].get_group()
        return dist.group.WORLD  # no sharding: every rank is a replica

    def _resolve_for_run(self, max_steps: int | None, model: torch.nn.Module | None) -> None:
        """Resolve ``local_steps=None`` for a run of ``max_steps`` steps training ``model``, and log the choice."""
        self.flexdemo_config = for_run_logged(self.flexdemo_config, max_steps, model)

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self._resolve_for_run(num_training_steps, self.model)  # with epochs, the length is known from here on
        super().create_optimizer_and_scheduler(num_training_steps)

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        self._resolve_for_run(None, None)  # built outside train(): a length the Trainer does not know
        if self.optimizer is None and self.flexdemo_config.method != "adamw":
            self.optimizer_cls_and_kwargs = (FlexDeMo, {
                "lr": self.args.learning_rate,
                "replicate_group": self.replicate_group(),
                "betas": (self.args.adam_beta1, self.args.adam_beta2),
                "eps": self.args.adam_epsilon,
                **from_knobs(self.flexdemo_config.optimizer_kwargs()),
            })
            optimizer = super().create_optimizer(model)
            names = {p: n for n, p in (model or self.model).named_parameters()}
            for group in optimizer.param_groups:  # torch's named-parameter convention, used in error messages
                group["param_names"] = [names[p] for p in group["params"]]
            return optimizer
        return super().create_optimizer(model)

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch=None) -> torch.Tensor:
        if isinstance(model, DistributedDataParallel) and self.flexdemo_config.method != "adamw":
            if not getattr(model, "_flexdemo_local_gradients", False):
                model.register_comm_hook(None, _local_gradients)
                model._flexdemo_local_gradients = True
        loss = super().training_step(model, inputs, num_items_in_batch)
        if (optimizer := self.flexdemo_optimizer) is not None:  # before Trainer clips the step's gradient
            optimizer.observe_micro_batch(last=self.accelerator.sync_gradients)
        return loss

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None):
        """As ``Trainer``, with a token-weighted loss whether or not the model reads ``num_items_in_batch``.

        Trainer takes a model whose ``forward`` has ``**kwargs`` to divide its summed loss by
        ``num_items_in_batch`` (the tokens of the step's micro-batches, over all ranks with
        ``average_tokens_across_devices``), so it neither divides the loss by the accumulation steps nor
        leaves it unmultiplied by the number of processes. T5's (and other seq2seq models') loss is a token mean
        that ignores it: their loss and gradient came out ``processes x accumulation steps`` too large (4x on 2 x
        2), and ``max_grad_norm`` clipped another gradient. Here the model gets this micro-batch's own label count,
        so it returns the micro-batch's token mean either way, and the loss is rescaled by that count over
        ``num_items_in_batch``: every model's loss is then what a model that reads the count gets from Trainer.
        That one needs nothing FlexDeMo-specific: FSDP2's mean over a node's ``S`` ranks of ``W x`` (its ranks'
        summed token losses) ``/ N`` is the node's token sum over the mean node's tokens ``N / R``, and FlexDeMo's
        mean over the ``R`` nodes is the global token mean (measured: a tiny Llama logs the same loss and
        gradient norm either way)."""
        if (num_items_in_batch is None or not self.model_accepts_loss_kwargs or self.compute_loss_func is not None
                or self.label_smoother is not None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if "shift_labels" in inputs:
            labels = inputs["shift_labels"]
        else:
            labels = inputs["labels"][..., 1:] if getattr(self, "_loss_shifts_labels", False) else inputs["labels"]
        own = labels.ne(-100).sum()
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch=own.clamp(min=1))
        loss, outputs = result if return_outputs else (result, None)
        loss = loss * (own / num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.flexdemo_optimizer is not None:
            logs.update(self.comm_metrics.collect(self.accelerator.device, self.flexdemo_optimizer))
            logs["flexdemo/skipped_steps"] = self.flexdemo_optimizer.skipped_steps
            # the bounded check's last measurement (on_drift "tolerate", or "auto" on mixed hardware), on every rank
            logs.update({f"flexdemo/{key}": value for key, value in self.flexdemo_optimizer.replica_drift.items()})
            if (local := self.flexdemo_optimizer.options["local_steps"]) > 1:
                logs["flexdemo/outer_rounds"] = self.flexdemo_optimizer.steps // local
        super().log(logs, start_time)

    # ---- model card --------------------------------------------------------------------------

    def create_model_card(self, **card: Any) -> None:
        """As ``Trainer``'s (the same keywords: ``model_name``, ``dataset``, ``tags``, ...), corrected where Trainer
        misreads a FlexDeMo run, with a "FlexDeMo training" section: the mode, topology, knobs and traffic
        (:func:`hf_flexdemo.trainer.model_card.write_model_card`)."""
        model_card.write_model_card(self, **card)


class FlexDeMoSeq2SeqTrainer(FlexDeMoTrainer, Seq2SeqTrainer):
    """``FlexDeMoTrainer`` with ``Seq2SeqTrainer``'s generation in evaluation and prediction."""
