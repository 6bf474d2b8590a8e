"""The model card (``hf_flexdemo.trainer.model_card``): Trainer's card with its four misreadings of a FlexDeMo run
corrected, and a "FlexDeMo training" section that states the mode, the topology, the knobs that shaped the run and the
traffic per node, step and parameter (single process; the recipe's 2 x 2 card in
tests/integration/test_recipe_data.py's runs)."""

from __future__ import annotations

import importlib.metadata
import warnings

import pytest
import torch
from transformers import TrainingArguments
from transformers.modelcard import TrainingSummary

from hf_flexdemo import FlexDeMo, FlexDeMoConfig, FlexDeMoTrainer
from hf_flexdemo.policies import CompressionPolicy
from hf_flexdemo.testing import reverse_task, tiny_t5
from hf_flexdemo.trainer import model_card
from hf_flexdemo.trainer.model_card import (
    PYPI_URL,
    correct_summary,
    distributed_entry,
    flexdemo_section,
    knobs_in_force,
    package_url,
    traffic_lines,
)
from hf_flexdemo.trainer.topology import Topology

TWO_BY_TWO = Topology(4, 2)


def _args(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True, **kwargs)


def _trainer_summary(**kwargs) -> TrainingSummary:
    """A summary as ``TrainingSummary.from_trainer`` fills it for a model built from a config, trained on a data set
    built in memory, on 4 processes."""
    hyperparameters = {"learning_rate": 0.003, "distributed_type": "multi-GPU", "num_devices": 4,
                       "optimizer": "Use OptimizerNames.ADAMW_TORCH_FUSED"}
    fields = dict(model_name="run", finetuned_from="", tags=["generated_from_trainer"], dataset=[None],
                  dataset_tags=[None], dataset_args=[None], dataset_metadata=[{"config": None, "split": "train"}],
                  eval_lines=[], hyperparameters=hyperparameters)
    return TrainingSummary(**{**fields, **kwargs})


def test_the_summary_says_what_ran_not_what_training_arguments_default_to() -> None:
    summary = correct_summary(_trainer_summary(), optimizer="FlexDeMo with betas=(0.9,0.999)",
                              distributed=distributed_entry(TWO_BY_TWO, "cpu", "gloo"))
    card = summary.to_model_card()
    assert "This model was trained from scratch on an unknown dataset." in card
    assert "[](https://huggingface.co/)" not in card and "None dataset" not in card
    assert "- optimizer: FlexDeMo with betas=(0.9,0.999)\n" in card and "ADAMW_TORCH_FUSED" not in card
    assert "- distributed_type: multi-CPU (gloo): 2 node(s) x 2 process(es) per node\n" in card
    assert "multi-GPU" not in card and "### Training results" not in card  # nothing evaluated during training
    named = correct_summary(_trainer_summary(dataset="number words", finetuned_from="google-t5/t5-small"),
                            optimizer="FlexDeMo", distributed="multi-CPU").to_model_card()
    assert ("a fine-tuned version of [google-t5/t5-small](https://huggingface.co/google-t5/t5-small) on the number "
            "words dataset.") in named
    one_process = correct_summary(_trainer_summary(hyperparameters={"optimizer": "x"}), optimizer="FlexDeMo",
                                  distributed="multi-CPU")
    assert "distributed_type" not in one_process.hyperparameters  # Trainer records none for one process


def test_the_knobs_are_those_of_the_mode_and_the_wire_and_those_set() -> None:
    local = knobs_in_force(FlexDeMoConfig(), TWO_BY_TWO)
    assert local == {"method": "flexdemo", "local_steps": 8, "overlap": "delayed", "outer_fragments": 4,
                     "replicator": "demo", "compression_rate": 0.25, "compression_transform": "none",
                     "value_dtype": "int2", "compression_chunk": 32}
    stepwise = knobs_in_force(FlexDeMoConfig(local_steps=1, momentum="lr", update="sign", compression_topk=8,
                                             drift_check_every=50, budget_max_rate=0.25), TWO_BY_TWO)
    assert stepwise == {"method": "flexdemo", "local_steps": 1, "momentum": "lr", "update": "sign", "overlap": "none",
                        "replicator": "demo", "compression_topk": 8, "compression_transform": "dct",
                        "value_dtype": "float8", "compression_chunk": 32, "drift_check_every": 50}
    preset = knobs_in_force(FlexDeMoConfig(flexdemo_preset="demo-paper"), TWO_BY_TWO)
    assert preset["flexdemo_preset"] == "demo-paper" and preset["consensus"] == "choosers"  # what the preset set
    assert knobs_in_force(FlexDeMoConfig(method="adamw", reduce_dtype="bfloat16", shard_size=2), TWO_BY_TWO) == {
        "method": "adamw", "reduce_dtype": "bfloat16", "shard_size": 2}
    one_node = knobs_in_force(FlexDeMoConfig(outer_lr=0.7), Topology(1, 1))
    assert one_node == {"method": "flexdemo", "local_steps": 8, "overlap": "delayed", "outer_fragments": 4,
                        "outer_lr": 0.7}  # no wire ran


def test_the_fragments_are_those_that_ran() -> None:
    params = [torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8))]
    # one node, the wire emulated: the rounds run
    optimizer = FlexDeMo(params, compression=CompressionPolicy(replicator="none"))
    for p in params:
        p.grad = torch.randn_like(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimizer's own note that 2 tensors make 2 fragments
        optimizer.step()
    config = FlexDeMoConfig(replicator="none")
    assert knobs_in_force(config, Topology(1, 1), optimizer)["outer_fragments"] == (
        "4 (ran in 2: a fragment holds whole tensors)")
    section = flexdemo_section(config, Topology(1, 1), optimizer)
    assert "- one node, the exchange emulated (replicator='none'): local steps: 8 AdamW steps per node" in section
    assert "in 2 fragments whose rounds are staggered by 4 step(s))" in section


def test_the_traffic_is_per_node_step_and_parameter() -> None:
    config = FlexDeMoConfig()
    lines = traffic_lines(config, TWO_BY_TWO, total_bytes_sent=8e6, steps=10, parameters=1_000_000)
    assert lines == ["- inter-node traffic: 391 KiB sent per node and optimizer step, 3.2 bits per parameter per step "
                     "(the mean over 10 steps, the end-of-run round included; 7.63 MiB sent in all by the 2 nodes)"]
    ratios = traffic_lines(config, TWO_BY_TWO, 8e6, 10, 1_000_000, [
        {"flexdemo/compression_ratio": 90.0, "flexdemo/compression_ratio_fp32": 180.0}, {"loss": 1.0}])
    assert ratios[1:] == ["- traffic vs a dense bf16 all-reduce (AdamW-HSDP, reduce_dtype=bfloat16): 1/90.0",
                          "- traffic vs a dense fp32 all-reduce (AdamW-HSDP, FSDP2's default): 1/180.0"]
    assert traffic_lines(config, Topology(2, 2), 0.0, 10, 100) == ["- inter-node traffic: none (one node)"]
    assert traffic_lines(FlexDeMoConfig(method="adamw"), TWO_BY_TWO, 0.0, 10, 100) == [
        "- inter-node traffic: FSDP2's dense float32 gradient all-reduce (not counted)"]


def test_the_package_link_is_its_repository_when_the_metadata_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.metadata

    def with_urls(*urls: str):
        def metadata(name: str):
            found = real(name)
            for url in urls:
                found["Project-URL"] = url
            return found
        return metadata

    monkeypatch.setattr(importlib.metadata, "metadata", with_urls())
    assert package_url() == PYPI_URL == "https://pypi.org/project/hf-flexdemo/"  # no [project.urls]
    monkeypatch.setattr(importlib.metadata, "metadata", with_urls("Documentation, https://docs.example",
                                                                  "Repository, https://github.com/org/hf-flexdemo"))
    assert package_url() == "https://github.com/org/hf-flexdemo"


def test_a_trained_run_writes_a_card_that_states_what_was_in_force(tmp_path) -> None:
    args = _args(tmp_path, max_steps=4, per_device_train_batch_size=4, logging_steps=2, save_strategy="no")
    config = FlexDeMoConfig(replicator="none", compression_topk=4)  # one node, the wire emulated
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=args, train_dataset=reverse_task(16), flexdemo_config=config)
    trainer.train()
    trainer.create_model_card(model_name="tiny", dataset="reversed tokens")
    trainer.create_model_card(model_name="tiny", dataset="reversed tokens")  # again: the tags are kept, not doubled
    card = (tmp_path / "README.md").read_text()
    assert "This model was trained from scratch on the reversed tokens dataset." in card
    assert card.count("- flexdemo\n") == 1 and card.count("## FlexDeMo training") == 1
    assert "ADAMW_TORCH_FUSED" not in card and "- optimizer: FlexDeMo with betas=(0.9,0.999)" in card
    assert f"Trained with [hf-flexdemo]({PYPI_URL})" in card and "arxiv.org/abs/2502.06728" in card
    assert "- topology: 1 node(s) x 1 process(es) per node" in card
    # 4 steps: the defaults' rounds of a short run
    assert "- one node, the exchange emulated (replicator='none'): local steps: 4 AdamW steps per node" in card
    assert "  - compression_topk: 4\n" in card and "  - replicator: none\n" in card
    assert ": None\n" not in card and "budget_" not in card and "drift_" not in card  # only the knobs that mattered
    assert "- inter-node traffic: none (one node)" in card


def test_the_trainers_card_method_is_the_modules(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen = []
    monkeypatch.setattr(model_card, "write_model_card", lambda trainer, **kwargs: seen.append(kwargs))
    FlexDeMoTrainer(model=tiny_t5(), args=_args(tmp_path)).create_model_card(dataset="x", tags="t5")
    assert seen[0]["dataset"] == "x" and seen[0]["tags"] == "t5"
