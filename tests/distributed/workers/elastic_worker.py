"""Several FlexDeMoTrainer runs in one launch, each on its own topology of the launched ranks (``shard_size`` per
run), training from scratch or resuming a checkpoint written on another topology; each rank saves, per run, what
the test asserts on to OUT/rank{r}.pt: the losses, the parameters and optimizer state right after the resume was
loaded and at the end, or the refusal's message.

``--runs`` is a JSON list of runs: ``{"name", "shard_size", "steps", "save_steps"?, "resume"?, "policy"?}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate.state import AcceleratorState
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback, TrainingArguments

from hf_flexdemo import FlexDeMoConfig, FlexDeMoTrainer
from hf_flexdemo.testing import reverse_task, tiny_t5


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


class AtStart(TrainerCallback):
    """The parameters (full) and this rank's optimizer state once a resume is loaded, before the first step."""

    def __init__(self, trainer: FlexDeMoTrainer) -> None:
        self.trainer, self.params, self.state = trainer, None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.params = {n: _full(p) for n, p in self.trainer.model.named_parameters()}
        self.state = {i: {k: v.clone() for k, v in s.items()}
                      for i, s in self.trainer.flexdemo_optimizer.state_dict()["state"].items()}


def run(spec: dict, output_dir: Path) -> dict:
    AcceleratorState._reset_state(reset_partial_state=True)  # each run builds its own mesh and FSDP2 state
    args = TrainingArguments(
        output_dir=str(output_dir / spec["name"]), use_cpu=True, max_steps=spec["steps"],
        per_device_train_batch_size=4, learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1,
        save_strategy="steps" if spec.get("save_steps") else "no", save_steps=spec.get("save_steps") or 500,
        report_to=[], seed=0, data_seed=0, max_grad_norm=0.0, dataloader_drop_last=True, disable_tqdm=True)
    local = spec.get("local_steps", 1)
    # step-wise, update="adamw": replicated moments beside per-node ones; local steps read no step-wise rule
    config = FlexDeMoConfig(compression_chunk=8, update="adamw" if local == 1 else "sgd", shard_size=spec["shard_size"],
                            resume_policy=spec.get("policy"), local_steps=local,
                            value_dtype="int2" if local > 1 else "auto")
    trainer = FlexDeMoTrainer(model=tiny_t5(), args=args, train_dataset=reverse_task(512), flexdemo_config=config)
    at_start = AtStart(trainer)
    trainer.add_callback(at_start)
    try:
        trainer.train(resume_from_checkpoint=spec.get("resume"))
    except ValueError as error:
        # refused before any step: no optimizer was built, no step was taken
        return {"error": str(error), "global_step": trainer.state.global_step,
                "optimizer": trainer.flexdemo_optimizer is not None}
    return {"log_history": trainer.state.log_history, "params_at_start": at_start.params,
            "state_at_start": at_start.state, "topology": trainer.topology.as_dict(),
            "params": {n: _full(p) for n, p in trainer.model.named_parameters()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--runs", required=True)
    args = parser.parse_args()
    results = {spec["name"]: run(spec, args.output_dir) for spec in json.loads(args.runs)}
    torch.save(results, args.out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()  # exiting with it alive can abort a rank


if __name__ == "__main__":
    main()
