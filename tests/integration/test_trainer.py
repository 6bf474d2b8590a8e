"""Single-process FlexDeMoTrainer: configuration errors, checkpoint bookkeeping, a one-process run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import TrainingArguments
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

from hf_flexdemo import FlexDeMo, FlexDeMoConfig, FlexDeMoTrainer, knobs
from hf_flexdemo.testing import reverse_task, tiny_t5
from hf_flexdemo.trainer import checkpoint
from hf_flexdemo.trainer.comm_metrics import CommMetricsCallback, dense_bf16_bytes
from hf_flexdemo.trainer.config import trained_parameters
from hf_flexdemo.trainer.model_card import flexdemo_section
from hf_flexdemo.trainer.topology import Topology
from hf_flexdemo.trainer.trainer import logger
from hf_flexdemo.wire.collectives import dense_allreduce_bytes


def _args(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True, **kwargs)


def test_fp16_is_refused_before_anything_is_built(tmp_path):
    with pytest.raises(ValueError, match="fp16=True is not supported.*Accepted: bf16=True"):
        FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, fp16=True))


def test_overlap_in_backward_refuses_gradient_clipping_it_would_skip(tmp_path):
    config = FlexDeMoConfig(overlap="backward", local_steps=1)
    with pytest.raises(ValueError, match=r"max_grad_norm=1.0 with overlap='backward'.*Accepted: max_grad_norm=0"):
        FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path), flexdemo_config=config)
    FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, max_grad_norm=0.0), flexdemo_config=config)


def test_the_micro_batch_estimate_needs_micro_batches_each_reduced(tmp_path):
    """``progress_scale_estimate="micro_batches"``: one micro-batch per step, or Accelerate told not to reduce each
    one, is refused with the fix; with two, the trainer turns on sync_each_batch."""
    config = FlexDeMoConfig(progress_scale="batch", progress_scale_estimate="micro_batches")
    with pytest.raises(ValueError, match=r"invalid gradient_accumulation_steps=1 with progress_scale_estimate="
                                         r"'micro_batches'; accepted: 2 or more \(--gradient_accumulation_steps 2"):
        FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path), flexdemo_config=config)
    unsynced = _args(tmp_path, gradient_accumulation_steps=2,
                     accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": False}})
    with pytest.raises(ValueError, match=r"sync_each_batch=False with progress_scale_estimate='micro_batches'; "
                                         r"accepted: True, or unset"):
        FlexDeMoTrainer(model=tiny_t5(), args=unsynced, flexdemo_config=config)
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, gradient_accumulation_steps=2),
                              flexdemo_config=config)
    assert trainer.accelerator.gradient_state.plugin_kwargs["sync_each_batch"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"method": "sgd"}, "method='sgd'; accepted: flexdemo | demo | adamw"),
     ({"shard_size": 0}, "shard_size=0; accepted: None or an integer >= 1"),
     ({"compression_topk": -1}, "compression_topk=-1; accepted: an integer >= 1"),
     ({"update": "lion"}, "update='lion'; accepted: sign | sgd | adamw"),
     ({"method": "adamw", "reduce_dtype": "float16"}, "reduce_dtype='float16'; accepted: float32 | bfloat16"),
     ({"reduce_dtype": "bfloat16"}, "reduce_dtype='bfloat16' with method='flexdemo'; accepted: reduce_dtype='float32' "
                                    "unless method='adamw'"),
     ({"method": "demo", "reduce_dtype": "bfloat16"}, "reduce_dtype='bfloat16' with method='demo'"),
     ({"resume_policy": "mean"}, "resume_policy='mean'; accepted: None | average | reset | keep"),
     ({"elastic": "yes"}, "elastic='yes'; accepted: True | False"),
     ({"elastic": True, "method": "adamw"}, "elastic=True with method='adamw'; accepted: method='flexdemo' | 'demo'"),
     ({"async_save": "yes"}, "async_save='yes'; accepted: None | True | False"),
     ({"async_save": True, "method": "adamw"}, "async_save=True with method='adamw'; accepted: None or False")],
)
def test_config_validates_every_knob(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlexDeMoConfig(**kwargs)


def test_an_elastic_run_reshards_by_averaging_unless_told_otherwise():
    assert FlexDeMoConfig(elastic=True).resume_policy == "average"
    assert FlexDeMoConfig(elastic=True, resume_policy="reset").resume_policy == "reset"
    assert FlexDeMoConfig().resume_policy is None


def test_reduce_dtype_is_the_adamw_baselines_and_not_an_optimizer_knob():
    assert FlexDeMoConfig().reduce_dtype == "float32"
    assert FlexDeMoConfig(method="adamw", reduce_dtype="bfloat16").reduce_dtype == "bfloat16"
    assert "reduce_dtype" not in FlexDeMoConfig().optimizer_kwargs()


def test_shard_size_must_divide_the_world():
    with pytest.raises(ValueError, match=r"shard_size=3 must divide the world size 4; accepted: \[1, 2, 4\]"):
        Topology.resolve(4, 3)
    assert Topology.resolve(8, 4).replicate_size == 2


def test_topology_defaults_to_the_launcher(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert Topology.resolve(8).shard_size == 4
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    assert Topology.resolve(8).shard_size == 2


def _fake_checkpoint(path, step, complete, record):
    path.mkdir(parents=True)
    checkpoint.write_topology(path, record)
    if complete:
        checkpoint.mark_complete(path, step)
        for name in record.get("files", ()):  # every rank's optimizer state landed
            (path / name).parent.mkdir(exist_ok=True)
            checkpoint.write_state(path / name, {})


def test_incomplete_checkpoints_are_never_resumed(tmp_path):
    record = {"world_size": 4, "shard_size": 2, "replicate_size": 2, "method": "flexdemo"}
    _fake_checkpoint(tmp_path / "checkpoint-10", 10, True, record)
    _fake_checkpoint(tmp_path / "checkpoint-20", 20, False, record)
    assert checkpoint.last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    with pytest.raises(ValueError, match="checkpoint-20 is incomplete"):
        checkpoint.check_resumable(tmp_path / "checkpoint-20", record)
    checkpoint.check_resumable(tmp_path / "checkpoint-10", record)


def test_resume_onto_another_topology_is_refused_without_a_policy(tmp_path):
    """Refused before any step, naming what differs (saved, now) and the policies that would allow it; ``keep``
    only when the number of nodes stays; a pending step-wise delayed exchange, another method or a checkpoint
    without the rank files are refused whatever the policy (a streamed exchange of local steps reshards)."""
    setup = {"world_size": 4, "shard_size": 2, "replicate_size": 2, "method": "flexdemo"}
    saved = {**setup, "files": [f"flexdemo_optimizer/rank{r:05d}.pt" for r in range(4)], "pending": False,
             "local_steps": 1, "params": [["w", [4, 4]]]}
    _fake_checkpoint(tmp_path / "checkpoint-5", 5, True, saved)
    path = tmp_path / "checkpoint-5"
    assert checkpoint.check_resumable(path, setup) is False  # the same topology: exact, nothing to reshard
    one_node = {**setup, "shard_size": 4, "replicate_size": 1}
    with pytest.raises(ValueError, match=r"another topology; \(saved, now\) = \{'shard_size': \(2, 4\), "
                                         r"'replicate_size': \(2, 1\)\}, and resume_policy=None.*resume_policy "
                                         r"\(--resume_policy\) to 'average' \| 'reset' to reshard"):
        checkpoint.check_resumable(path, one_node)
    with pytest.raises(ValueError, match=r"resume_policy='keep'.*to 'average' \| 'reset' to reshard"):
        checkpoint.check_resumable(path, one_node, "keep")
    assert checkpoint.check_resumable(path, one_node, "average") is True
    two_by_one = {**setup, "world_size": 2, "shard_size": 1}
    with pytest.raises(ValueError, match=r"'world_size': \(4, 2\), 'shard_size': \(2, 1\).*'average' \| 'reset' \| "
                                         r"'keep'"):
        checkpoint.check_resumable(path, two_by_one)
    assert checkpoint.check_resumable(path, two_by_one, "keep") is True
    with pytest.raises(ValueError, match=r"different setup; \(saved, now\) = \{'method': \('flexdemo', 'demo'\)\}"):
        checkpoint.check_resumable(path, {**setup, "method": "demo"}, "average")
    checkpoint.write_topology(path, {**saved, "pending": True})
    with pytest.raises(ValueError, match=r"pending delayed exchange \(overlap='delayed', local_steps=1\).*Accepted: "
                                         "resume it on its own topology"):
        checkpoint.check_resumable(path, one_node, "average")
    checkpoint.write_topology(path, {**saved, "pending": True, "local_steps": 4})  # held per parameter: reshards
    assert checkpoint.check_resumable(path, one_node, "average") is True
    checkpoint.write_topology(path, setup)  # written before elastic resume
    with pytest.raises(ValueError, match="written before elastic resume"):
        checkpoint.check_resumable(path, one_node, "average")


def test_one_process_trains_and_checkpoints(tmp_path):
    args = _args(tmp_path, max_steps=6, per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=3,
                 save_steps=3, save_total_limit=1, lr_scheduler_type="constant")
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=args, train_dataset=reverse_task(64))
    trainer.train()
    assert trainer.topology == Topology(1, 1)
    assert trainer.flexdemo_optimizer.comm_stats["bytes_sent"] == 0
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-6"]  # rotated after completion
    assert json.loads((tmp_path / "checkpoint-6" / "flexdemo_complete.json").read_text()) == {"global_step": 6}
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert "flexdemo/compression_ratio" not in logs[0]  # no inter-node traffic on one node
    assert "flexdemo/replica_drift" not in logs[0]  # the exact drift check (the default) measures no distance
    trainer.create_model_card(model_name="tiny")
    card = (tmp_path / "README.md").read_text()
    assert "## FlexDeMo training" in card and "1 node(s) x 1 process(es)" in card


@pytest.mark.parametrize(("length", "rounds"), [({"max_steps": 6}, 4), ({"num_train_epochs": 1}, 4),
                                               ({"max_steps": 1000}, 8)])
def test_the_rounds_follow_the_runs_length_in_the_config_the_optimizer_and_the_card(tmp_path, length, rounds):
    """``local_steps=None``: the Trainer resolves it from ``max_steps``, or from the steps its epochs take once
    ``train()`` knows them (8 batches of 8 here), before the optimizer is built; the config, the optimizer's options
    and the model card record the rounds that ran."""
    args = _args(tmp_path, per_device_train_batch_size=8, save_strategy="no", **length)
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=args, train_dataset=reverse_task(64))
    if "max_steps" in length:
        assert trainer.flexdemo_config.local_steps == rounds  # known up front
    trainer.create_optimizer_and_scheduler(trainer.args.max_steps if "max_steps" in length else 8)
    assert trainer.flexdemo_config.local_steps == trainer.flexdemo_optimizer.options["local_steps"] == rounds
    assert trainer.flexdemo_optimizer.options["outer_delay"] == min(rounds // 4, 2)
    trainer.create_model_card(model_name="tiny")
    assert f"  - local_steps: {rounds}\n" in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize(("frozen", "rounds"), [(False, 16), (True, 8)])
def test_a_long_run_on_a_large_model_takes_rounds_of_16(tmp_path, monkeypatch, frozen, rounds):
    """From 2,000 steps on ``knobs.LARGE_MODEL_PARAMETERS`` trained parameters or more, the Trainer resolves
    ``local_steps=None`` to 16: it counts what its model trains (the threshold lowered to this tiny model's count;
    the frozen shared embedding takes it under), and the config, the optimizer and the model card record it."""
    model = tiny_t5()
    monkeypatch.setattr(knobs, "LARGE_MODEL_PARAMETERS", trained_parameters(model))
    model.shared.weight.requires_grad_(not frozen)
    args = _args(tmp_path, max_steps=2000, per_device_train_batch_size=8, save_strategy="no")
    saved = hf_logging.get_verbosity()
    hf_logging.set_verbosity_info()  # the choice is logged at info, as Trainer's own summary
    try:
        with CaptureLogger(logger) as captured:
            trainer = FlexDeMoTrainer(model=model, args=args, train_dataset=reverse_task(64))
    finally:
        hf_logging.set_verbosity(saved)
    assert trainer.flexdemo_config.local_steps == rounds
    assert f"resolved to {rounds} for a run of 2000 steps on {trained_parameters(model):,} parameters" in captured.out
    trainer.create_optimizer_and_scheduler(2000)
    assert trainer.flexdemo_optimizer.options["local_steps"] == rounds
    assert trainer.flexdemo_optimizer.options["outer_delay"] == 2
    trainer.create_model_card(model_name="tiny")
    assert f"  - local_steps: {rounds}\n" in (tmp_path / "README.md").read_text()


def test_the_bounded_drift_check_reaches_the_logs(tmp_path):
    args = _args(tmp_path, max_steps=4, per_device_train_batch_size=4, logging_steps=2, save_strategy="no")
    config = FlexDeMoConfig(on_drift="tolerate", drift_check_every=2, replicator="none")  # the emulated wire
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=args, train_dataset=reverse_task(16), flexdemo_config=config)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 2  # one replica: nothing to part from
    assert all(e["flexdemo/replica_drift"] == e["flexdemo/replica_drift_of_bound"] == 0.0 for e in logs)


def test_compression_ratio_is_against_a_bf16_all_reduce_and_fp32_is_logged_too():
    """Per rank and step the bf16 figure is ``dense_allreduce_bytes(numel, R, 2)``: the fp32 ``dense_bytes`` halved
    and floored there (odd fp32 counts), before the sums over ranks and steps."""
    for numel in (1, 7, 1000, 12345):
        for replicas in (2, 3, 5, 7, 16):
            assert dense_bf16_bytes(dense_allreduce_bytes(numel, replicas)) == dense_allreduce_bytes(numel, replicas, 2)
    optimizer = FlexDeMo([torch.nn.Parameter(torch.zeros(4, 4))])
    callback = CommMetricsCallback()
    steps = [dense_allreduce_bytes(1001, 3), dense_allreduce_bytes(12345, 7)]  # 2668 and 84651: one odd
    for dense in steps:
        optimizer.comm_stats = {"bytes_sent": 100, "bytes_received": 100, "dense_bytes": dense}
        callback.on_optimizer_step(None, None, None, optimizer=optimizer)
    logs = callback.collect(torch.device("cpu"), optimizer)
    bf16 = dense_allreduce_bytes(1001, 3, 2) + dense_allreduce_bytes(12345, 7, 2)
    assert logs["flexdemo/compression_ratio"] == bf16 / 200 != sum(steps) / 2 / 200
    assert logs["flexdemo/compression_ratio_fp32"] == sum(steps) / 200
    card = flexdemo_section(FlexDeMoConfig(), Topology(4, 2), optimizer, total_bytes_sent=400, steps=2,
                            parameters=16, log_history=[logs])
    assert f"vs a dense bf16 all-reduce (AdamW-HSDP, reduce_dtype=bfloat16): 1/{bf16 / 200:.1f}" in card
    assert f"vs a dense fp32 all-reduce (AdamW-HSDP, FSDP2's default): 1/{sum(steps) / 200:.1f}" in card


def test_the_model_card_names_the_mode():
    from hf_flexdemo.trainer.trainer import training_mode

    assert training_mode(FlexDeMoConfig(local_steps=1), 2) == "compressed momentum exchange every step"
    assert training_mode(FlexDeMoConfig(method="adamw"), 2) == "adamw"
    assert training_mode(FlexDeMoConfig(overlap="none"), 2) == (
        "local steps: 8 AdamW steps per node, then a compressed pseudo-gradient exchange (top-k of its values, plain "
        "averaging with error feedback, outer lr 1)")
    assert training_mode(FlexDeMoConfig(), 2).endswith(
        "outer lr 1, streamed: it lands 2 inner step(s) after it starts, in 4 fragments whose rounds are staggered by "
        "2 step(s))")
    assert "(top-k of its DCT coefficients, " in training_mode(FlexDeMoConfig(compression_transform="dct"), 2)
    assert training_mode(FlexDeMoConfig(outer_fragments=1), 2).endswith(
        "outer lr 1, streamed: it lands 2 inner step(s) after it starts)")
    assert "Nesterov outer momentum 0.9" in training_mode(FlexDeMoConfig(local_steps=8, outer_momentum=0.9), 2)
    scaled = FlexDeMoConfig(overlap="none", progress_scale="batch")
    assert "(top-k of its values, each node's progress lengthened per element to the nodes' batch, plain" in (
        training_mode(scaled, 2))
    assert "nodes' batch by an estimate of decay 0.99, plain" in training_mode(
        dataclasses.replace(scaled, progress_scale_decay=0.99), 2)
    assert "nodes' batch by an estimate from each step's micro-batches, plain" in training_mode(
        dataclasses.replace(scaled, progress_scale_estimate="micro_batches"), 2)
    assert "nodes' batch, each node walking its lengthened steps, plain" in training_mode(
        dataclasses.replace(scaled, progress_scale_path="lengthened"), 2)
    assert "lands 1 inner step(s) after" in training_mode(FlexDeMoConfig(local_steps=8, overlap="delayed",
                                                                          outer_delay=1), 2)
    # the outer lr's default follows the nodes: sqrt(R / 2), at least 1
    assert [training_mode(FlexDeMoConfig(overlap="none"), nodes).endswith(f"outer lr {lr})")
            for nodes, lr in ((1, "1"), (2, "1"), (4, "1.41421"), (8, "2"))] == [True] * 4
    # ... unless the run says what ran (a checkpoint from 2 nodes resumed on 8 keeps its outer step)
    assert training_mode(FlexDeMoConfig(overlap="none"), 8, outer_lr=1.0).endswith("outer lr 1)")
    assert training_mode(FlexDeMoConfig(outer_fragments=2), 2).endswith(
        "it lands 2 inner step(s) after it starts, in 2 fragments whose rounds are staggered by 4 step(s))")
