"""A run ends with the model it trained, in one process: FlexDeMoTrainer at its defaults trains as Trainer with
torch's AdamW and saves the model in memory (on several ranks: tests/distributed/test_end_of_run_distributed.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, Trainer, TrainingArguments

from hf_flexdemo import FlexDeMoTrainer
from hf_flexdemo.testing import reverse_task, tiny_t5


@pytest.mark.parametrize("steps", [2, 8, 16])
def test_one_process_trains_and_saves_what_torch_adamw_trains(tmp_path, steps):
    """One process is one replica: FlexDeMoTrainer at its defaults trains as Trainer with torch's AdamW, bit for bit,
    and the model it saves is the model in memory."""
    def args(name: str, **extra) -> TrainingArguments:
        return TrainingArguments(output_dir=str(tmp_path / name), use_cpu=True, max_steps=steps, learning_rate=3e-3,
                                 per_device_train_batch_size=4, weight_decay=0.0, logging_steps=1, report_to=[],
                                 save_strategy="no", seed=0, data_seed=0, disable_tqdm=True, **extra)

    ours = FlexDeMoTrainer(model=tiny_t5(), args=args("flexdemo"), train_dataset=reverse_task(64))
    theirs = Trainer(model=tiny_t5(), args=args("adamw", optim="adamw_torch"), train_dataset=reverse_task(64))
    ours.train()
    theirs.train()
    ours.save_model(str(tmp_path / "saved"))
    saved = dict(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "saved").named_parameters())
    for (name, a), b in zip(ours.model.named_parameters(), theirs.model.parameters()):
        assert torch.equal(a, b), name
        assert name not in saved or torch.equal(a, saved[name]), name
    final = [e for e in ours.state.log_history if "flexdemo/final_round_bytes_sent" in e]
    assert final and final[0]["flexdemo/final_round_bytes_sent"] == 0
    if steps == 2:  # the model card says so
        ours.create_model_card()
        card = (tmp_path / "flexdemo" / "README.md").read_text()
        assert "- one node: nothing crossed nodes, so nothing was compressed: the optimizer ran as torch's AdamW" \
            in card
