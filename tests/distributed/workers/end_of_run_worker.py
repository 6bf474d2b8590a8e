"""How a FlexDeMoTrainer run ends, on several ranks: the model after ``train()``, saved and evaluated; the best model
loaded at the end; a second ``train()``. Each rank saves what the tests assert on to OUT/rank{r}.pt."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForSeq2SeqLM, TrainingArguments

from hf_flexdemo import FlexDeMoConfig, FlexDeMoTrainer
from hf_flexdemo.testing import fixed_batch, reverse_task, tiny_t5

# The uncompressed wire: every value travels in float32, so the final consensus is the nodes' mean.
# every value in float32, in rounds of 8 (a long run's), whose fragments land two steps after their launch: the
# error feedback then holds the steps between (a short run's rounds of 4 land after one step and hold none)
EXACT = {"compression_rate": 1.0, "compression_transform": "none", "value_dtype": "float32", "local_steps": 8}


def full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter in full, as this node holds it (a collective inside the node under FSDP2)."""
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}


def held_back(model: torch.nn.Module, optimizer) -> dict[str, torch.Tensor]:
    """Every parameter's error feedback in full, as this node holds it: what the node trained that has not crossed
    yet (with a streamed exchange landing after more than one step, the steps between a launch and its landing);
    zero on one node, where nothing crosses."""
    state = optimizer.optimizer.state
    out = {}
    for n, p in model.named_parameters():
        delta = state[p].get("delta", torch.zeros_like(p.to_local() if isinstance(p, DTensor) else p))
        out[n] = (DTensor.from_local(delta, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()).full_tensor()
                  if isinstance(p, DTensor) else delta).detach().clone()
    return out


class Recording(FlexDeMoTrainer):
    """Keeps the parameters as the node trained them, and its error feedback, right before the end-of-run landing."""

    def _finalize_training(self, trial, num_train_samples, start_time):
        self.trained = full(self.model)
        self.held_back = held_back(self.model, self.optimizer)
        return super()._finalize_training(trial, num_train_samples, start_time)


def run(out_dir: Path, shard_size: int, steps: int, knobs: dict, **extra) -> Recording:
    args = TrainingArguments(
        output_dir=str(out_dir), use_cpu=True, max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3,
        lr_scheduler_type="constant", logging_steps=1, report_to=[], seed=0, data_seed=0, max_grad_norm=0.0,
        dataloader_drop_last=True, disable_tqdm=True, **{"save_strategy": "no", **extra})
    config = FlexDeMoConfig(shard_size=shard_size, **knobs)
    return Recording(model=tiny_t5(), args=args, train_dataset=reverse_task(256), eval_dataset=reverse_task(32),
                     flexdemo_config=config)


def loss_of(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return model(**fixed_batch()).loss.item()


def ended(trainer: Recording, save_to: Path) -> dict:
    """What a user sees after ``train()``: the model in memory, its loss, the saved model reloaded, evaluate()."""
    in_memory = full(trainer.model)
    trainer.save_model(str(save_to))
    dist.barrier()
    saved = AutoModelForSeq2SeqLM.from_pretrained(save_to)
    return {"trained": trainer.trained, "held_back": trainer.held_back, "model": in_memory,
            "saved": {n: p.detach() for n, p in saved.named_parameters()}, "loss": loss_of(trainer.model),
            "saved_loss": loss_of(saved), "eval_loss": trainer.evaluate()["eval_loss"],
            "log_history": trainer.state.log_history}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard_size", type=int, required=True)
    parser.add_argument("--best", action="store_true", help="also a run with load_best_model_at_end")
    args = parser.parse_args()
    work = args.out / "work"
    result = {"initial": full(tiny_t5()), "defaults": {}}
    for steps in (2, 8, 16):
        trainer = run(work / f"defaults_{steps}", args.shard_size, steps, {})
        trainer.train()
        result["defaults"][steps] = ended(trainer, work / f"defaults_{steps}" / "final")
        if steps == 8:  # a second train() goes on from the consensus the first one ended with
            trainer.train()
            result["again"] = {"trained": trainer.trained, "model": full(trainer.model)}
    trainer = run(work / "exact", args.shard_size, 8, EXACT)
    trainer.train()
    result["exact"] = ended(trainer, work / "exact" / "final")
    if args.best:
        # greater_is_better=True makes the worst evaluation "best": an early checkpoint, never the last
        trainer = run(work / "best", args.shard_size, 12, {}, eval_strategy="steps", eval_steps=4,
                      save_strategy="steps", save_steps=4, load_best_model_at_end=True,
                      metric_for_best_model="eval_loss", greater_is_better=True)
        trainer.train()
        best = trainer.state.best_model_checkpoint
        result["best"] = {**ended(trainer, work / "best" / "final"), "checkpoint": best,
                          "checkpoint_model": {n: p.detach() for n, p in
                                               AutoModelForSeq2SeqLM.from_pretrained(best).named_parameters()}}
    torch.save(result, args.out / f"rank{dist.get_rank()}.pt")
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
