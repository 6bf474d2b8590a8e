"""A long FlexDeMoTrainer run on a tiny T5 for fault injection: the test kills, stops or crashes a rank.

Writes ``OUT/pid{rank}`` at start. ``--crash_rank R --crash_step N``: rank R exits abruptly while
saving checkpoint N, once its optimizer state is submitted (the other ranks are mid-save too).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch.distributed as dist
from transformers import TrainingArguments

from hf_flexdemo import FlexDeMoConfig, FlexDeMoTrainer
from hf_flexdemo.testing import reverse_task, tiny_t5


class CrashingTrainer(FlexDeMoTrainer):
    crash_rank: int = -1
    crash_step: int = -1

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if dist.get_rank() == self.crash_rank and self.state.global_step == self.crash_step:
            os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--save_steps", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=15)
    parser.add_argument("--crash_rank", type=int, default=-1)
    parser.add_argument("--crash_step", type=int, default=-1)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    (args.out / f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
    training_args = TrainingArguments(
        output_dir=str(args.out / "run"), use_cpu=True, max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_steps=args.save_steps,
        report_to=[], seed=0, data_seed=0, max_grad_norm=0.0, dataloader_drop_last=True, disable_tqdm=True,
        ddp_timeout=args.timeout,
    )
    CrashingTrainer.crash_rank, CrashingTrainer.crash_step = args.crash_rank, args.crash_step
    trainer = CrashingTrainer(model=tiny_t5(), args=training_args, train_dataset=reverse_task(4096),
                              flexdemo_config=FlexDeMoConfig(shard_size=2))
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    trainer.accelerator.end_training()  # destroys the process group: exiting with it alive can abort a rank


if __name__ == "__main__":
    main()
