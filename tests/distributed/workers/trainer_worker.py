"""Multi-rank FlexDeMoTrainer runs on a tiny T5; each rank saves what the test asserts on to OUT/rank{r}.pt.

One run from the command line's flags, or several in one launch (``--runs``: a JSON list of ``[name, *flags]``,
run in order, so a resume may follow the run that wrote its checkpoint): the ranks then save ``{name: result}``.
Each run starts from a fresh Accelerate state, as a new launch would; what a launch costs on CPU is mostly the
ranks' imports.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate.state import AcceleratorState
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from transformers import TrainingArguments

from hf_flexdemo import FlexDeMoConfig, FlexDeMoTrainer
from hf_flexdemo.testing import fixed_batch, reverse_task, tiny_t5


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def parse(argv: list[str]) -> argparse.Namespace:
    """One run's flags."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--method", default="flexdemo")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--ga", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--save_steps", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--shard_size", type=int, default=2, help="0: from the launcher")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--final_save", action="store_true")
    parser.add_argument("--topk", type=int, default=4, help="0: the package default rate")
    parser.add_argument("--update", default="sign", help="the step-wise rule's (local steps read none)")
    parser.add_argument("--logging_steps", type=int, default=5)
    parser.add_argument("--overlap", default="none")
    parser.add_argument("--bucket_cap_mb", type=float, default=25.0)
    parser.add_argument("--reduce_dtype", default="float32")
    parser.add_argument("--local_steps", type=int, default=1)
    parser.add_argument("--value_dtype", default="auto")
    parser.add_argument("--outer_fragments", type=int, default=None, help="default: the package's choice")
    parser.add_argument("--replicator", default="demo", help="none: one node's emulated wire")
    parser.add_argument("--progress_scale", default="none")
    parser.add_argument("--progress_scale_estimate", default="consecutive")
    parser.add_argument("--undeclared_loss_kwargs", action="store_true", help="T5 as from_pretrained gives it: "
                        "its forward's **kwargs make Trainer take it to read num_items_in_batch")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train one run; what the tests assert on."""
    AcceleratorState._reset_state(reset_partial_state=True)  # each run builds its own mesh and FSDP2 state

    training_args = TrainingArguments(
        output_dir=args.output_dir, use_cpu=True, max_steps=args.steps, per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.ga, learning_rate=args.lr, lr_scheduler_type="constant",
        logging_steps=args.logging_steps, save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=[], seed=0, data_seed=0, max_grad_norm=0.0, bf16=args.bf16, fp16=args.fp16,
        dataloader_drop_last=True, disable_tqdm=True,
    )
    knobs = {} if args.method == "adamw" else dict(  # the AdamW baseline refuses FlexDeMo knobs
        compression_topk=args.topk or None, compression_chunk=8, overlap=args.overlap,
        bucket_cap_mb=args.bucket_cap_mb, local_steps=args.local_steps, value_dtype=args.value_dtype,
        outer_fragments=args.outer_fragments, replicator=args.replicator, progress_scale=args.progress_scale,
        progress_scale_estimate=args.progress_scale_estimate,
        **({"update": args.update} if args.local_steps == 1 else {}))
    shard_size = None if args.method == "demo" else args.shard_size or None  # demo shards nothing
    config = FlexDeMoConfig(method=args.method, shard_size=shard_size, reduce_dtype=args.reduce_dtype, **knobs)
    model = tiny_t5()
    if args.undeclared_loss_kwargs:
        del model.accepts_loss_kwargs
    # Per optimizer step: whether every reduced gradient (this rank's shard) is exactly a bfloat16 value.
    bf16_exact_grads = []
    hooks = [register_optimizer_step_pre_hook(lambda opt, *_: bf16_exact_grads.append(all(
        bool((_local(p.grad).view(torch.int32) & 0xFFFF).eq(0).all())
        for group in opt.param_groups for p in group["params"] if p.grad is not None)))]
    last_step = {}  # the last optimizer step's traffic (after train(), comm_stats is the end-of-run landing's)
    hooks.append(register_optimizer_step_post_hook(lambda opt, *_: last_step.update(getattr(opt, "comm_stats", {}))))
    trainer = FlexDeMoTrainer(model=model, args=training_args, train_dataset=reverse_task(512),
                              flexdemo_config=config)
    resume = {"true": True, None: None}.get(args.resume, args.resume)
    trainer.train(resume_from_checkpoint=resume)
    if args.final_save:
        trainer.save_model(args.output_dir)
    opt = trainer.flexdemo_optimizer
    params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
              for n, p in trainer.model.named_parameters()}
    with torch.no_grad():
        logits = trainer.model(**fixed_batch()).logits.detach().clone()
        with trainer._consensus():
            consensus_logits = trainer.model(**fixed_batch()).logits.detach().clone()
    for hook in hooks:  # the hooks are global: the next run's optimizer must not feed this run's lists
        hook.remove()
    return {
        "log_history": trainer.state.log_history,
        "params": params,
        "logits": logits,
        "consensus_logits": consensus_logits,
        "comm_stats": None if opt is None else dict(last_step),
        "final_stats": None if opt is None else opt.comm_stats,
        "topology": trainer.topology.as_dict(),
        "fsdp": trainer.is_fsdp_enabled,
        "mp_policy": trainer.model._get_fsdp_state()._mp_policy if trainer.is_fsdp_enabled else None,
        "reduce_dtypes": sorted({str(m._get_fsdp_state()._fsdp_param_group._reduce_dtype)
                                 for m in trainer.model.modules() if hasattr(m, "_get_fsdp_state")
                                 and m._get_fsdp_state()._fsdp_param_group is not None}),
        "bf16_exact_grads": bf16_exact_grads,
        "sync_each_batch": trainer.accelerator.gradient_state.plugin_kwargs.get("sync_each_batch", False),
        "estimated": None if opt is None else {n: bool(opt.state[p]["lag_product"].any())
                                               for n, p in trainer.model.named_parameters()
                                               if "lag_product" in opt.state.get(p, {})},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", help="a JSON list of [name, *flags]; without it, one run from the other flags")
    args, flags = parser.parse_known_args()
    if args.runs is None:
        result = run(parse(flags))
    else:
        result = {name: run(parse(run_flags)) for name, *run_flags in json.loads(args.runs)}
    torch.save(result, args.out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()  # exiting with it alive can abort a rank


if __name__ == "__main__":
    main()
