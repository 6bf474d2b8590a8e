"""One convergence run (one method, one learning rate) on every rank of a ``torchrun`` job; see ``convergence.py``.

Data, tokenizer, model and metrics come from the package modules the T5 recipe uses
(``hf_flexdemo.seq2seq.data``, ``seq2seq_model``, ``seq2seq_metrics``), so the benchmark trains exactly what a
user of the recipe trains. Evaluation loss is logged every ``--eval_steps``
(and at step 0); BLEU and chrF are computed once at the end by greedy generation on the first
``--bleu_samples`` validation pairs. Rank 0 writes the log history and the final scores to ``--out``.
``--stop_at_eval_loss`` and ``--max_train_seconds`` end training early on every rank at the same step
(``time_to_target.py``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import harness
import torch
import torch.distributed as dist
from transformers import (
    Seq2SeqTrainingArguments,
    T5ForConditionalGeneration,
    TrainerCallback,
    set_seed,
)

from hf_flexdemo.seq2seq.data import DataTrainingArguments, load_raw_datasets, tokenize_splits
from hf_flexdemo.seq2seq.metrics import Seq2SeqMetrics
from hf_flexdemo.seq2seq.model import ModelArguments, build_trainer, load_tokenizer
from hf_flexdemo.seq2seq.tiny_t5 import tiny_t5_config
from hf_flexdemo.trainer.comm_metrics import unwrap_optimizer
from hf_flexdemo.trainer.config import METHODS
from hf_flexdemo.wire.collectives import dense_allreduce_bytes

TASK = "translation"
REPORTED_ARGS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "adam_beta1",
                 "adam_beta2", "adam_epsilon", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "per_device_eval_batch_size", "seed", "data_seed", "generation_max_length", "generation_num_beams")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--train_file", required=True)
    parser.add_argument("--validation_file", required=True)
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="fr")
    parser.add_argument("--max_source_length", type=int, default=64)
    parser.add_argument("--max_target_length", type=int, default=64)
    parser.add_argument("--vocab_size", type=int, default=4000)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--d_ff", type=int, default=512)
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--max_steps", type=int, required=True)
    parser.add_argument("--batch_size", type=int, default=16, help="sequences per rank per micro-batch")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--warmup_steps", type=int, default=0)
    parser.add_argument("--eval_steps", type=int, required=True)
    parser.add_argument("--logging_steps", type=int, required=True)
    parser.add_argument("--bleu_samples", type=int, default=0, help="0: no generation, no BLEU")
    parser.add_argument("--shard_size", type=int, default=2)
    parser.add_argument("--adam_beta1", type=float, default=0.9, help="TrainingArguments.adam_beta1 (AdamW and "
                        "FlexDeMo's update='adamw')")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data_seed", type=int, default=42)
    parser.add_argument("--stop_at_eval_loss", type=float, help="stop at the first evaluation at or below this loss")
    parser.add_argument("--max_train_seconds", type=float, help="stop (with a last evaluation) once the slowest "
                        "rank's training seconds reach this; one 4-byte all-reduce per step decides it")
    parser.add_argument("--save_steps", type=int, default=0, help="checkpoint every N steps (0: none; "
                        "elastic_resume.py)")
    parser.add_argument("--resume_from_checkpoint", help="a checkpoint to resume (elastic_resume.py; on another "
                        "topology with --resume_policy=...)")
    parser.add_argument("--final_rounds", action="store_true", help="at the end, the validation loss of each way "
                        "to end the run, from the same state (FinalRounds)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args, flexdemo = parser.parse_known_args()
    # Every other flag is a FlexDeMoConfig field (--compression_rate=0.125 ...), parsed as the recipes parse it.
    fixed = {"method": args.method, **({} if args.method == "demo" else {"shard_size": args.shard_size})}
    args.flexdemo, _ = harness.parse_flexdemo(flexdemo, **fixed)  # demo shards nothing: its shard_size stays None
    return args


class TrainClock(TrainerCallback):
    """Training seconds (wall clock since the start, evaluations excluded) at every evaluation."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.eval_seconds = 0.0
        self.points: list[dict[str, float]] = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs) -> None:
        runtime = next((v for k, v in (metrics or {}).items() if k.endswith("_runtime")), 0.0)
        self.eval_seconds += runtime
        self.points.append({"step": state.global_step, "train_seconds": time.perf_counter() - self.start
                            - self.eval_seconds})


class StopRule(TrainerCallback):
    """Ends training early, on every rank at the same step (time_to_target.py).

    At the first evaluation whose loss is at or below ``target`` (the metric is gathered over all ranks, so
    every rank decides alike); or once the slowest rank's training seconds (``clock``'s, evaluations
    excluded) reach ``budget``: a MAX all-reduce of one int32 per step makes that decision job-wide, and
    a last evaluation is run at that step so the curve ends where training did.
    """

    def __init__(self, clock: TrainClock, target: float | None, budget: float | None) -> None:
        self.clock, self.target, self.budget = clock, target, budget
        self.stopped_by: str | None = None

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if self.budget is None or state.global_step >= state.max_steps:
            return
        over = torch.tensor([time.perf_counter() - self.clock.start - self.clock.eval_seconds >= self.budget],
                            dtype=torch.int32)
        dist.all_reduce(over, op=dist.ReduceOp.MAX)
        if over.item():
            control.should_training_stop = control.should_evaluate = True
            self.stopped_by = f"max_train_seconds {self.budget:g} at step {state.global_step}"

    def on_evaluate(self, args, state, control, metrics=None, **kwargs) -> None:
        loss = (metrics or {}).get("eval_loss")
        if self.target is not None and loss is not None and loss <= self.target and state.global_step > 0:
            control.should_training_stop = True
            self.stopped_by = f"eval_loss {loss:.4f} <= {self.target:.4f} at step {state.global_step}"


class FinalRounds(TrainerCallback):
    """``--final_rounds``: when the run ends, the validation loss of the model each end-of-run choice leaves, all from
    the same state: the anchors alone (no landing: what evaluate() saw before ``FlexDeMo.finish``), and the final
    round on the compressed wire and on a dense float32 one, with the bytes all ranks send for it. The run then goes
    on from that state with the package's choice."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.results: dict[str, dict[str, float]] = {}

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
        optimizer = unwrap_optimizer(optimizer)
        finish = optimizer.finish
        params = [p for group in optimizer.param_groups for p in group["params"]]

        def study(**kwargs: Any) -> dict[str, int]:
            saved = copy.deepcopy(optimizer.state_dict())
            values = [p.detach().clone() for p in params]

            def restore() -> None:
                with torch.no_grad():
                    for p, value in zip(params, values):
                        p.copy_(value)
                optimizer.load_state_dict(copy.deepcopy(saved))

            self.results["anchors"] = {"eval_loss": self._evaluate("anchors")}
            for wire in ("compressed", "dense"):
                restore()
                sent = torch.tensor([float(finish(final=wire)["bytes_sent"])], dtype=torch.float64)
                dist.all_reduce(sent)
                self.results[wire] = {"eval_loss": self._evaluate(wire), "bytes_sent": sent.item()}
            restore()
            return finish(**kwargs)

        optimizer.finish = study

    def _evaluate(self, name: str) -> float:
        return self.trainer.evaluate(metric_key_prefix=f"final_round_{name}")[f"final_round_{name}_loss"]


def ran_config(trainer: Any) -> dict[str, Any]:
    """The run's FlexDeMoConfig as it ran: local_steps resolved for the run's length (the trainer's config) and the
    outer step resolved on its nodes (the optimizer's)."""
    config = asdict(trainer.flexdemo_config)
    if trainer.flexdemo_optimizer is not None:
        config["outer_lr"] = trainer.flexdemo_optimizer.options["outer_lr"]
    return config


def main() -> None:
    args = parse_args()
    training_args = Seq2SeqTrainingArguments(
        output_dir=args.output_dir, use_cpu=True, max_steps=args.max_steps, learning_rate=args.lr,
        lr_scheduler_type="linear", warmup_steps=args.warmup_steps, weight_decay=0.0, adam_beta1=args.adam_beta1,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        eval_strategy="steps", eval_steps=args.eval_steps, eval_on_start=True, logging_steps=args.logging_steps,
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500, report_to="none",
        disable_tqdm=True, seed=args.seed, data_seed=args.data_seed,
        average_tokens_across_devices=False,  # each rank's token mean, as the committed runs were measured
        predict_with_generate=False, generation_max_length=args.max_target_length, generation_num_beams=1,
    )
    data_args = DataTrainingArguments(
        train_file=args.train_file, validation_file=args.validation_file, source_lang=args.source_lang,
        target_lang=args.target_lang, max_source_length=args.max_source_length,
        max_target_length=args.max_target_length,
    )
    with training_args.main_process_first(desc="loading data"):
        splits, origin = load_raw_datasets(TASK, data_args, None, args.data_seed)
    tokenizer = load_tokenizer(ModelArguments(tokenizer_vocab_size=args.vocab_size), splits, TASK, data_args)
    set_seed(args.seed)  # the same initial weights on every rank and for every method
    config = tiny_t5_config(len(tokenizer), d_model=args.d_model, num_layers=args.num_layers,
                            num_heads=args.num_heads, d_ff=args.d_ff)
    model = T5ForConditionalGeneration(config)
    parameters = sum(p.numel() for p in model.parameters())
    tokenized = tokenize_splits(splits, TASK, tokenizer, data_args, training_args)
    trainer = build_trainer(model, training_args, args.flexdemo, tokenized, tokenizer, data_args, None)

    clock = TrainClock()
    trainer.add_callback(clock)
    stop_rule = StopRule(clock, args.stop_at_eval_loss, args.max_train_seconds)
    trainer.add_callback(stop_rule)
    final_rounds = FinalRounds()
    if args.final_rounds:
        final_rounds.trainer = trainer
        trainer.add_callback(final_rounds)
    train_metrics = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint).metrics
    train_seconds = time.perf_counter() - clock.start
    scores: dict[str, float] = {}
    bleu_seconds = 0.0
    if args.bleu_samples:
        trainer.args.predict_with_generate = True
        trainer.compute_metrics = Seq2SeqMetrics(TASK, tokenizer)
        subset = tokenized["validation"].select(range(min(args.bleu_samples, len(tokenized["validation"]))))
        start = time.perf_counter()
        # synced_gpus: every rank of an FSDP group must run the same number of decoding steps.
        scores = trainer.evaluate(eval_dataset=subset, metric_key_prefix="final", synced_gpus=True)
        bleu_seconds = time.perf_counter() - start
    if dist.get_rank() == 0:
        topology = trainer.topology
        result = {
            "method": args.method,
            "lr": args.lr,
            "flexdemo_config": ran_config(trainer),
            "topology": topology.as_dict(),
            "parameters": parameters,
            "vocab_size": len(tokenizer),
            "examples": {name: len(split) for name, split in tokenized.items()},
            "data": origin,
            "training_args": {k: getattr(training_args, k) for k in REPORTED_ARGS},
            "train_metrics": train_metrics,
            "global_step": trainer.state.global_step,
            "train_seconds_with_evals": train_seconds,
            "bleu_seconds": bleu_seconds,
            "final_scores": scores,
            "log_history": trainer.state.log_history,
            "train_clock": clock.points,
            "stop_rule": {"stop_at_eval_loss": args.stop_at_eval_loss, "max_train_seconds": args.max_train_seconds,
                          "stopped_by": stop_rule.stopped_by},
            # What FSDP2 HSDP's fp32 gradient all-reduce across nodes puts on the wire per step, all ranks
            # together (ring all-reduce of each rank's shard; FSDP padding ignored): the AdamW reference.
            "dense_allreduce_bytes_per_step": topology.world_size * dense_allreduce_bytes(
                parameters // topology.shard_size, topology.replicate_size),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "final_rounds": final_rounds.results,
        }
        args.out.write_text(json.dumps(result, indent=1))
    dist.barrier()


if __name__ == "__main__":
    main()
