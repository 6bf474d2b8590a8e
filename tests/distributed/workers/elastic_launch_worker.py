"""One elastic FlexDeMoTrainer run, as an elastic torchrun agent starts and restarts it (``FlexDeMoConfig(elastic=
True)``: ``train()`` with no argument resumes from the last complete checkpoint in ``--output_dir``).

Each attempt's ranks save ``OUT/start{step}_rank{r}.pt`` once training begins (``step``: the checkpoint resumed, 0 from
scratch): the topology and the full parameters after the resume was loaded, before the first step; the attempt that
finishes saves ``OUT/final_rank{r}.pt`` (the parameters, the topology changes) and the model with ``save_model``.
``--pace`` sleeps after every step, so the test can act in the middle of the run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback, TrainingArguments

from hf_flexdemo import FlexDeMoConfig, FlexDeMoTrainer
from hf_flexdemo.testing import reverse_task, tiny_t5


def _full(trainer: FlexDeMoTrainer) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in trainer.model.named_parameters()}


class Probe(TrainerCallback):
    def __init__(self, trainer: FlexDeMoTrainer, out: Path, pace: float) -> None:
        self.trainer, self.out, self.pace = trainer, out, pace

    def on_train_begin(self, args, state, control, **kwargs):
        record = {"topology": self.trainer.topology.as_dict(), "params": _full(self.trainer)}
        path = self.out / f"start{state.global_step}_rank{dist.get_rank()}.pt"
        torch.save(record, path.with_suffix(".tmp"))  # the test polls for these files: never a partial one
        os.replace(path.with_suffix(".tmp"), path)

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.pace)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--max_steps", type=int, required=True)
    parser.add_argument("--save_steps", type=int, required=True)
    parser.add_argument("--pace", type=float, default=0.0)
    args = parser.parse_args()
    training = TrainingArguments(
        output_dir=str(args.output_dir), use_cpu=True, max_steps=args.max_steps, per_device_train_batch_size=4,
        learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="steps",
        save_steps=args.save_steps, report_to=[], seed=0, data_seed=0, dataloader_drop_last=True, disable_tqdm=True,
        ddp_timeout=120)
    config = FlexDeMoConfig(elastic=True, local_steps=4, compression_chunk=8, value_dtype="int2")
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=training, train_dataset=reverse_task(512), flexdemo_config=config)
    trainer.add_callback(Probe(trainer, args.out, args.pace))
    trainer.train()
    trainer.save_model()
    trainer.create_model_card()
    torch.save({"params": _full(trainer), "changes": trainer.topology_changes, "topology": trainer.topology.as_dict()},
               args.out / f"final_rank{dist.get_rank()}.pt")
    dist.destroy_process_group()  # exiting with it alive can abort a rank


if __name__ == "__main__":
    main()
