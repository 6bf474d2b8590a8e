"""Options that cannot work are refused, the setup is logged, the loss is Trainer's token mean for every model, and
the traffic total survives a resume (single process; the multi-process sides in test_trainer_distributed.py)."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

from hf_flexdemo import FlexDeMo, FlexDeMoConfig, FlexDeMoTrainer
from hf_flexdemo.optim.mesh import REPLICATE_SIZE_ENV, SHARD_SIZE_ENV, UNSUPPORTED_SIZE_ENV
from hf_flexdemo.policies import from_knobs
from hf_flexdemo.testing import VOCAB_SIZE, reverse_task, tiny_t5
from hf_flexdemo.trainer.comm_metrics import CommMetricsCallback
from hf_flexdemo.trainer.topology import Topology
from hf_flexdemo.trainer.trainer import as_config, describe_setup, logger


def _args(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True, **kwargs)


@pytest.fixture
def no_launcher(monkeypatch):
    for name in (*SHARD_SIZE_ENV, REPLICATE_SIZE_ENV, *UNSUPPORTED_SIZE_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def verbosity():
    """Trainer sets transformers' verbosity from log_level, for the whole process: put it back."""
    saved = hf_logging.get_verbosity()
    yield
    hf_logging.set_verbosity(saved)


# --- item 6: accepted and then ignored --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["flexdemo", "demo"])
def test_an_optimizer_passed_in_is_refused(tmp_path, method):
    model = tiny_t5()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=rf"invalid optimizers=\(SGD, None\) with method='{method}'; accepted: "
                                         r"\(None, None\).*the optimizer is FlexDeMo"):
        FlexDeMoTrainer(model=model, args=_args(tmp_path), flexdemo_config=FlexDeMoConfig(method=method),
                        optimizers=(sgd, None))
    with pytest.raises(ValueError, match=r"invalid optimizers=\(SGD, None\)"):  # positionally too
        FlexDeMoTrainer(model, _args(tmp_path), None, None, None, None, None, None, None, None, (sgd, None))


def test_a_non_default_optim_is_refused_and_adamw_keeps_it(tmp_path):
    assert TrainingArguments(output_dir=str(tmp_path)).optim == "adamw_torch_fused"  # this transformers' default
    with pytest.raises(ValueError, match=r"invalid optim='adafactor' with method='flexdemo'; accepted: the default "
                                         r"\('adamw_torch_fused', which it replaces\).*FlexDeMoConfig's fields"):
        FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, optim="adafactor"))
    with pytest.raises(ValueError, match=r"invalid optim_args='beta1=0.5' with method='demo'; accepted: None"):
        FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, optim_args="beta1=0.5"),
                        flexdemo_config=FlexDeMoConfig(method="demo"))
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, optim="adamw_torch"),
                              flexdemo_config=FlexDeMoConfig(method="adamw"))
    assert isinstance(trainer.create_optimizer(), torch.optim.AdamW)


def test_flexdemo_knobs_are_refused_with_the_adamw_baseline():
    with pytest.raises(ValueError, match=r"FlexDeMoConfig: value_dtype='int2', local_steps=4 with method='adamw'; "
                                         r"accepted: the defaults with method='adamw'"):
        FlexDeMoConfig(method="adamw", value_dtype="int2", local_steps=4)
    with pytest.raises(ValueError, match=r"flexdemo_preset='step-wise' with method='adamw'"):
        FlexDeMoConfig(method="adamw", flexdemo_preset="step-wise")
    config = FlexDeMoConfig(method="adamw", reduce_dtype="bfloat16", shard_size=2)  # the baseline's own fields
    assert config.value_dtype == "auto"  # nothing resolved for a knob nobody reads: replace() round-trips
    assert dataclasses.replace(config, shard_size=4).shard_size == 4
    with pytest.raises(ValueError, match=r"shard_size=2 with method='demo'; accepted: None or 1"):
        FlexDeMoConfig(method="demo", shard_size=2)
    FlexDeMoConfig(method="demo", shard_size=1)


@pytest.mark.parametrize(("knobs", "field", "accepted"), [
    ({"local_steps": 1, "outer_lr": 0.7}, "outer_lr", r"None \(the default\) with local_steps=1"),
    ({"local_steps": 1, "outer_momentum": 0.9}, "outer_momentum", r"0.0 \(the default\) with local_steps=1"),
    ({"local_steps": 1, "outer_delay": 2}, "outer_delay", r"None \(the default\) with local_steps=1"),
    ({"local_steps": 4, "overlap": "none", "outer_delay": 2}, "outer_delay",
     r"None \(the default\) or 1 with overlap='none'"),
    ({"budget_min_rate": 0.1}, "budget_min_rate", r"the default \(0.015625\) without a budget"),
    ({"budget_max_rate": 0.5}, "budget_max_rate", r"the default \(0.25\) without a budget"),
    ({"progress_scale_decay": 0.99}, "progress_scale_decay", r"None \(the default\) with progress_scale='none'"),
    ({"progress_scale_estimate": "micro_batches"}, "progress_scale_estimate",
     r"'consecutive' \(the default\) with progress_scale='none'"),
    ({"progress_scale_path": "lengthened"}, "progress_scale_path", r"'own' \(the default\) with progress_scale='none'"),
])
def test_a_knob_that_would_do_nothing_is_refused_as_outer_fragments_is(knobs, field, accepted):
    message = rf"FlexDeMo: invalid {field}=.*; accepted: {accepted}"
    with pytest.raises(ValueError, match=message):
        FlexDeMoConfig(**knobs)
    with pytest.raises(ValueError, match=message):
        FlexDeMo([torch.nn.Parameter(torch.zeros(4, 4))], **from_knobs(knobs))


def test_the_knobs_those_refusals_need_still_take_them():
    FlexDeMoConfig(local_steps=4, outer_lr=0.7, outer_momentum=0.9, outer_delay=2)
    FlexDeMoConfig(budget_bytes=10**6, budget_min_rate=0.1, budget_max_rate=0.5)
    FlexDeMoConfig(local_steps=1, budget_fraction=0.1, budget_min_rate=0.1)


def test_a_preset_refuses_a_knob_that_contradicts_what_it_is():
    with pytest.raises(ValueError, match=r"invalid local_steps=4 with flexdemo_preset='step-wise'; accepted: 1 "
                                         r"\(the preset's.*drop the preset"):
        FlexDeMoConfig(flexdemo_preset="step-wise", local_steps=4)
    with pytest.raises(ValueError, match=r"invalid local_steps=2 with preset='demo-paper'"):
        FlexDeMo([torch.nn.Parameter(torch.zeros(4, 4))], preset="demo-paper", local_steps=2)
    assert FlexDeMoConfig(flexdemo_preset="step-wise", local_steps=1).local_steps == 1


def test_flexdemo_config_takes_a_dict_and_names_a_misspelt_key(tmp_path):
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path), flexdemo_config={"local_steps": 4})
    assert trainer.flexdemo_config == FlexDeMoConfig(local_steps=4)
    with pytest.raises(ValueError, match=r"invalid flexdemo_config key 'local_step'; accepted: a FlexDeMoConfig "
                                         r"field \(did you mean 'local_steps'\?\)"):
        as_config({"local_step": 4})
    with pytest.raises(ValueError, match=r"invalid flexdemo_config=\['local_steps'\] \(a list\); accepted: a "
                                         r"FlexDeMoConfig, a dict of its fields"):
        as_config(["local_steps"])


def test_an_accelerate_yaml_whose_mesh_is_not_the_world_is_refused(no_launcher):
    no_launcher.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    no_launcher.setenv(REPLICATE_SIZE_ENV, "1")
    with pytest.raises(ValueError, match=r"invalid parallelism_config_dp_replicate_size x "
                                         r"parallelism_config_dp_shard_size = 1 x 2 = 2 .*accepted: a product equal "
                                         r"to the 4 processes launched.*parallelism_config_dp_replicate_size: 2"):
        Topology.resolve(4)
    assert Topology.resolve(4, 4).shard_size == 4  # an explicit shard_size overrides the YAML
    no_launcher.setenv(REPLICATE_SIZE_ENV, "2")
    assert Topology.resolve(4) == Topology(4, 2)
    no_launcher.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    with pytest.raises(ValueError, match=r"invalid parallelism_config_tp_size=2 .*accepted: 1"):
        Topology.resolve(4)


def test_the_setup_is_logged_once_and_one_node_of_several_processes_is_a_warning(tmp_path, no_launcher, verbosity):
    """Info, as Trainer's run summary (shown with log_level='info'); a warning, shown at the default level,
    where FlexDeMo has no other node although several processes run (bytes_sent 0 at every step)."""
    with CaptureLogger(logger) as captured:
        FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, log_level="info"))
    assert captured.out.count("FlexDeMo: 1 node(s) x 1 process(es) (no launcher variable: one node), "
                              "method='flexdemo': one process; nothing crosses nodes.") == 1
    hf_logging.set_verbosity_warning()  # what log_level='passive' leaves
    no_launcher.setenv("LOCAL_WORLD_SIZE", "4")
    for topology, shown in ((Topology(4, 4), True), (Topology(4, 2), False)):
        fake = types.SimpleNamespace(flexdemo_config=FlexDeMoConfig(), topology=topology,
                                     is_world_process_zero=lambda: True)
        with CaptureLogger(logger) as captured:
            FlexDeMoTrainer._log_setup(fake)
        assert ("FlexDeMo: 1 node(s) x 4 process(es) (LOCAL_WORLD_SIZE=4)" in captured.out) == shown
    assert "nothing crosses nodes (flexdemo/bytes_sent stays 0)" in describe_setup(
        FlexDeMoConfig(), Topology(4, 4), "LOCAL_WORLD_SIZE=4")
    assert describe_setup(FlexDeMoConfig(elastic=True), Topology(2, 2), "LOCAL_WORLD_SIZE=2").endswith(
        "nothing crosses nodes until another node joins, at the elastic launcher's next restart (elastic=True).")
    assert describe_setup(FlexDeMoConfig(), Topology(4, 2), "shard_size=2").startswith(
        "FlexDeMo: 2 node(s) x 2 process(es) (shard_size=2), method='flexdemo': FSDP2 inside each node, FlexDeMo "
        "between nodes (local steps: 8 AdamW steps per node")


def test_the_model_card_names_the_optimizer_and_the_baselines_wire(tmp_path):
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path / "flexdemo"))
    trainer.create_model_card(model_name="tiny")
    card = (tmp_path / "flexdemo" / "README.md").read_text()
    assert "- optimizer: FlexDeMo with betas=(0.9,0.999)" in card and "ADAMW_TORCH_FUSED" not in card
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path / "adamw"),
                              flexdemo_config=FlexDeMoConfig(method="adamw"))
    trainer.create_model_card(model_name="tiny")
    card = (tmp_path / "adamw" / "README.md").read_text()
    assert "a dense float32 gradient all-reduce between nodes" in card and "compressed" not in card
    assert "- value_dtype" not in card and "  - reduce_dtype: float32" in card
    assert "- optimizer: adamw_torch_fused with betas=(0.9,0.999) and epsilon=1e-08\n" in card  # Trainer's, which ran


# --- item 7: the loss every model gets ------------------------------------------------------------------------


def _ragged(n: int):
    """The reversal task with a data-dependent number of masked labels (0 to 6 of 8)."""
    return reverse_task(n).map(lambda e, i: {"labels": [-100 if j < i % 7 else t for j, t in enumerate(e["labels"])]},
                               with_indices=True)


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                        max_position_embeddings=32))


def _first_step(tmp_path, model, data, **kwargs) -> dict:
    """One step of 2 micro-batches of 4 over all of ``data`` (8 samples): its logged loss and gradient norm."""
    args = _args(tmp_path, max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                 logging_steps=1, save_strategy="no", **kwargs)
    trainer = FlexDeMoTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return next(e for e in trainer.state.log_history if "loss" in e)


@pytest.mark.parametrize("build", ["t5", "llama"])
def test_the_logged_loss_and_grad_norm_are_the_token_mean_of_the_step_for_every_model(tmp_path, build):
    """T5's loss ignores num_items_in_batch (stock Trainer logged it 2x here, x processes more across ranks),
    Llama's reads it: both log the step's token-mean loss and its gradient's norm, labels ragged."""
    data = _ragged(8)
    if build == "llama":
        data = data.map(lambda e: {"input_ids": e["input_ids"] + e["labels"], "labels": e["input_ids"] + e["labels"]})
        data = data.map(lambda e: {"input_ids": [t if t >= 0 else 0 for t in e["input_ids"]]})
    model = _llama() if build == "llama" else tiny_t5()
    if build == "t5":
        del model.accepts_loss_kwargs  # as from_pretrained gives it
    reference = _llama() if build == "llama" else tiny_t5()
    batch = {key: torch.tensor(data[key]) for key in ("input_ids", "labels")}
    loss = reference(**batch).loss  # one batch: the token mean over every label
    loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()
                                                 if p.grad is not None]))
    logged = _first_step(tmp_path, model, data)
    assert logged["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert logged["grad_norm"] == pytest.approx(norm.item(), rel=1e-4)


def test_t5_at_the_defaults_logs_what_the_recipes_two_settings_gave(tmp_path):
    """The recipes used to set ``model.accepts_loss_kwargs = False`` and ``average_tokens_across_devices=False``;
    the class at its defaults logs the same loss and gradient norm (labels of one length: the same weighting)."""
    undeclared = tiny_t5()
    del undeclared.accepts_loss_kwargs
    default = _first_step(tmp_path / "a", undeclared, reverse_task(8))
    recipe = _first_step(tmp_path / "b", tiny_t5(), reverse_task(8), average_tokens_across_devices=False)
    assert default["loss"] == pytest.approx(recipe["loss"], rel=1e-6)
    assert default["grad_norm"] == pytest.approx(recipe["grad_norm"], rel=1e-6)


# --- item 8: the traffic total across a resume ---------------------------------------------------------------


def test_the_traffic_total_of_a_checkpoint_includes_the_steps_since_the_last_log():
    optimizer = FlexDeMo([torch.nn.Parameter(torch.zeros(4, 4))])
    straight = CommMetricsCallback()
    optimizer.comm_stats = {"bytes_sent": 100, "bytes_received": 100, "dense_bytes": 1000}
    for step in range(5):
        straight.on_optimizer_step(None, None, None, optimizer=optimizer)
        if step == 2:
            straight.collect(torch.device("cpu"), optimizer)  # a log at step 3
    straight.checkpoint_total(torch.device("cpu"))  # a checkpoint at step 5
    saved = straight.state()
    straight.checkpoint_saved()
    assert saved["args"]["total_bytes_sent"] == 500 and straight.total_bytes_sent == 300
    resumed = CommMetricsCallback()
    resumed.on_train_begin(None, types.SimpleNamespace(stateful_callbacks={"CommMetricsCallback": saved}), None)
    for callback in (straight, resumed):
        callback.on_optimizer_step(None, None, None, optimizer=optimizer)
    assert straight.collect(torch.device("cpu"), optimizer)["flexdemo/total_bytes_sent"] == 600
    assert resumed.collect(torch.device("cpu"), optimizer)["flexdemo/total_bytes_sent"] == 600


@pytest.mark.parametrize("restore", [False, True])
def test_a_resume_continues_the_checkpoints_traffic_total(tmp_path, restore):
    """Trainer restores callback states only with restore_callback_states_from_checkpoint=True (default False),
    and then replaces the callback: the total continues either way, in the logs and the model card."""
    common = dict(max_steps=4, per_device_train_batch_size=4, logging_steps=1, save_steps=2,
                  lr_scheduler_type="constant", restore_callback_states_from_checkpoint=restore)
    FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path, **common), train_dataset=reverse_task(32)).train()
    state_file = tmp_path / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["stateful_callbacks"]["CommMetricsCallback"]["args"] == {"total_bytes_sent": 0.0}
    state["stateful_callbacks"]["CommMetricsCallback"]["args"]["total_bytes_sent"] = 21778.0  # one node sends none
    state_file.write_text(json.dumps(state))
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path / "resumed", **common),
                              train_dataset=reverse_task(32))
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    logged = [e["flexdemo/total_bytes_sent"] for e in trainer.state.log_history if "flexdemo/total_bytes_sent" in e
              and e["step"] > 2]
    assert logged and set(logged) == {21778.0}
    assert trainer.comm_metrics.total_bytes_sent == 21778.0
