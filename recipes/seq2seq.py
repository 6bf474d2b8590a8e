"""The T5 sequence-to-sequence recipe shared by ``t5_translation.py`` and ``t5_summarization.py``.

Hugging Face's ``run_translation.py`` / ``run_summarization.py``, trained by ``FlexDeMoSeq2SeqTrainer``.
Arguments: ``ModelArguments`` (``hf_flexdemo.seq2seq.model``), ``DataTrainingArguments``
(``hf_flexdemo.seq2seq.data``, which also lists the data sources), ``Seq2SeqTrainingArguments`` and
``FlexDeMoConfig``, from ``--config run.yaml`` (or ``.json``) and the command line, which overrides the
file (``hf_flexdemo.seq2seq.arguments``); under both, the recipe's defaults (``recipe_defaults``). With no data
argument (translation only), English -> French number words and a whole quick job on which a tiny T5
visibly learns in minutes on a CPU.

``--do_predict`` needs a test split (``--test_file``, or the Hub data set's ``test``) and writes
``predict_results.json`` and ``generated_predictions.txt``. Every run ends with a model card
(``README.md`` in ``--output_dir``) that records the FlexDeMo setup, and a summary of the run.

Run as a script (``cli``), bad input (a flag, a file, a data set the checks refuse) ends the job with one
``error: <message>`` line; ``HF_FLEXDEMO_TRACEBACK=1`` shows the traceback instead.
"""

import itertools
import logging
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from datasets import Dataset, DatasetDict
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
    TrainerState,
    set_seed,
)

from hf_flexdemo import FlexDeMoConfig, FlexDeMoSeq2SeqTrainer, knobs
from hf_flexdemo.knobs import DEFAULT_RATE
from hf_flexdemo.seq2seq.arguments import ConfigArgumentParser, bad_input_exits, from_values
from hf_flexdemo.seq2seq.data import (
    PRESETS,
    TASKS,
    DataTrainingArguments,
    check_data_preset,
    load_raw_datasets,
    prepare_splits,
    source_and_target_texts,
    tokenize_splits,
)
from hf_flexdemo.seq2seq.metrics import Seq2SeqMetrics, decode_texts
from hf_flexdemo.seq2seq.model import ModelArguments, build_trainer, load_model, load_tokenizer

logger = logging.getLogger(__name__)

# The built-in number-words job: learning rates by rule (docs/recipes.md gives the runs they come from).
NUMBER_WORDS_LR = {"sign": 3e-3, "sgd": 1.0, "adamw": 1e-3, "rmsprop": 1e-3}  # momentum "lr" / "ema", by update
NUMBER_WORDS_ADAM_LR = 1e-3  # momentum "adam" / "avg": the step is in AdamW's units
NUMBER_WORDS_ADAMW_LR = 3e-3  # method "adamw"
NUMBER_WORDS_JOB = {
    "max_steps": 600,
    "warmup_steps": 50,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 64,
    "logging_steps": 25,
    "save_strategy": "no",
}
PHASES = ("do_train", "do_eval", "do_predict")
ARGUMENT_TYPES = (ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments, FlexDeMoConfig)
GROUP_TITLES = {  # the headings of --help
    ModelArguments: "Model (ModelArguments)",
    DataTrainingArguments: "Data (DataTrainingArguments)",
    Seq2SeqTrainingArguments: "Training (transformers' Seq2SeqTrainingArguments)",
    FlexDeMoConfig: "FlexDeMo (FlexDeMoConfig: the method and the optimizer's knobs, docs/configuration.md)",
}


def recipe_defaults(task: str, given: dict[str, Any]) -> dict[str, Any]:
    """Arguments the recipe sets unless the user does (``given``: what the file and flags set).

    The built-in data gets a whole quick job; with no phase chosen, the run trains and evaluates.
    """
    data_args = from_values(DataTrainingArguments, given)
    flexdemo_config = from_values(FlexDeMoConfig, given)
    defaults: dict[str, Any] = {
        "output_dir": f"outputs/t5_{task}",
        "predict_with_generate": True,
        # With no accelerator, several launched processes must run on CPU (gloo) rather than as one.
        "use_cpu": not torch.accelerator.is_available(),
    }
    if not set(PHASES) & set(given):
        defaults |= {"do_train": True, "do_eval": True}
    if data_args.uses_number_words:
        if flexdemo_config.method == "adamw" or knobs.mode_of(flexdemo_config.local_steps) == "local":  # AdamW inside
            lr = NUMBER_WORDS_ADAMW_LR
        elif flexdemo_config.momentum in ("avg", "adam"):
            lr = NUMBER_WORDS_ADAM_LR
        else:
            lr = NUMBER_WORDS_LR[flexdemo_config.update]
        defaults |= {"learning_rate": lr, **NUMBER_WORDS_JOB}
    return defaults


def parse_arguments(
    task: str, argv: list[str]
) -> tuple[ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments, FlexDeMoConfig]:
    """The four argument dataclasses: the recipe's defaults, overridden by ``--config``, overridden by flags.

    A bad flag or value raises (``argparse.ArgumentError``, ``ValueError``) rather than exiting: ``cli`` reports it.
    """
    _refuse_preset_flag(argv)
    parser = ConfigArgumentParser(ARGUMENT_TYPES, group_titles=GROUP_TITLES, exit_on_error=False)
    model_args, data_args, training_args, flexdemo_config = parser.parse_args_and_config(
        argv, defaults=lambda given: recipe_defaults(task, given)
    )
    if data_args.num_beams is not None:
        training_args.generation_num_beams = data_args.num_beams
    if training_args.generation_max_length is None:
        training_args.generation_max_length = data_args.max_target_length
    return model_args, data_args, training_args, flexdemo_config


def _refuse_preset_flag(argv: list[str]) -> None:
    """``--preset`` could mean either of two flags: say which is which."""
    if any(arg == "--preset" or arg.startswith("--preset=") for arg in argv):
        raise ValueError("unrecognized argument --preset; accepted: --data_preset for a data set of the FlexDeMo "
                         f"paper ({' | '.join(PRESETS)}), or --flexdemo_preset for a set of FlexDeMo knob values "
                         f"({' | '.join(knobs.PRESETS)})")


def setup_logging(training_args: Seq2SeqTrainingArguments) -> None:
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    level = training_args.get_process_log_level()
    logger.setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def load_data(
    task: str, data_args: DataTrainingArguments, cache_dir: str | None, training_args: Seq2SeqTrainingArguments
) -> tuple[DatasetDict, str]:
    """The splits the run's phases need (checked before any model is built) and a one-line description."""
    if data_args.data_preset is not None:
        check_data_preset(data_args.data_preset, task)
    seed = training_args.data_seed if training_args.data_seed is not None else training_args.seed
    with training_args.main_process_first(desc="loading data"):
        raw, description = load_raw_datasets(task, data_args, cache_dir, seed, training_args.do_predict)
        splits = prepare_splits(raw, data_args, seed)
    if training_args.do_train and "train" not in splits:
        raise ValueError("do_train needs training data: pass --train_file, --dataset_name or --data_preset")
    if training_args.do_eval and "validation" not in splits:
        raise ValueError("do_eval needs validation data: pass --validation_file, --dataset_name or --data_preset")
    if training_args.do_predict and "test" not in splits:
        raise ValueError("do_predict needs test data: pass --test_file, or a --dataset_name with a 'test' split "
                         "(the built-in number-words data and the presets have none)")
    return splits, description


def train(trainer: FlexDeMoSeq2SeqTrainer, training_args: Seq2SeqTrainingArguments) -> dict[str, float]:
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    return result.metrics


def evaluate(trainer: FlexDeMoSeq2SeqTrainer) -> dict[str, float]:
    metrics = trainer.evaluate(metric_key_prefix="eval")
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


def write_predictions(
    trainer: FlexDeMoSeq2SeqTrainer,
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    training_args: Seq2SeqTrainingArguments,
) -> dict[str, float]:
    """``--do_predict`` as ``run_translation.py`` does it: metrics to ``predict_results.json`` and, with
    ``predict_with_generate``, one generated text a line to ``generated_predictions.txt``."""
    result = trainer.predict(dataset, metric_key_prefix="predict")
    metrics = {**result.metrics, "predict_samples": len(dataset)}
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    if trainer.is_world_process_zero() and training_args.predict_with_generate:
        texts = decode_texts(tokenizer, result.predictions)
        Path(training_args.output_dir, "generated_predictions.txt").write_text("\n".join(texts), encoding="utf-8")
    return metrics


def model_card_kwargs(
    task: str, model_args: ModelArguments, data_args: DataTrainingArguments, data_description: str | None = None
) -> dict[str, Any]:
    """What the model card records about the run, as the Hugging Face examples fill it; the data set is named by
    ``data_description`` (``load_data``'s) where it is not on the Hub."""
    kwargs: dict[str, Any] = {"finetuned_from": model_args.model_name_or_path, "tasks": task}
    if data_description and not data_args.dataset_name:
        kwargs["dataset"] = data_description
    if data_args.dataset_name:
        kwargs["dataset_tags"] = data_args.dataset_name
        kwargs["dataset"] = data_args.dataset_name
        if data_args.dataset_config_name:
            kwargs["dataset_args"] = data_args.dataset_config_name
            kwargs["dataset"] += f" {data_args.dataset_config_name}"
    if task == "translation":
        kwargs["language"] = [data_args.source_lang, data_args.target_lang]
    return kwargs


def _format_metric(key: str, value: float) -> str:
    if "bytes" in key:
        return f"{key.removeprefix('flexdemo/')} {value / 2**20:.3f} MiB"
    return f"{key.removeprefix('flexdemo/')} {value:.4g}"


def _method_description(config: FlexDeMoConfig) -> str:
    if config.method == "adamw":
        return "adamw (torch AdamW, dense gradient all-reduce)"
    config = config.for_run(None)  # the trainer's is resolved for the run's length; a long run's otherwise
    kept = (f"top-{config.compression_topk}" if config.compression_topk is not None
            else f"rate {config.compression_rate or DEFAULT_RATE:g}")
    fragments = f" in {config.outer_fragments} fragments" if config.outer_fragments > 1 else ""
    rule = (f"{config.local_steps} local AdamW steps per round{fragments}" if config.local_steps > 1
            else f"update {config.update}")  # local steps: the inner AdamW takes no update rule
    blocks = "DCT blocks" if config.compression_transform == "dct" else "blocks"
    return (f"{config.method} ({rule}, replicator {config.replicator}, {kept} of {config.compression_chunk}-sided "
            f"{blocks} in {config.value_dtype})")


def run_summary(
    task: str,
    data_description: str,
    splits: DatasetDict,
    model_description: str,
    training_args: Seq2SeqTrainingArguments,
    flexdemo_config: FlexDeMoConfig,
    train_metrics: dict[str, float],
    eval_metrics: dict[str, float],
    state: TrainerState,
    vocab_size: int,
    predict_metrics: dict[str, float] | None = None,
) -> str:
    """The block printed at the end of a run: data, model, losses, scores, FlexDeMo traffic, output."""
    sizes = " / ".join(f"{len(split)} {name}" for name, split in splits.items())
    lines = [
        f"data        {data_description}: {sizes} examples",
        f"model       {model_description}",
        f"method      {_method_description(flexdemo_config)}, lr {training_args.learning_rate:g}",
    ]
    losses = [entry["loss"] for entry in state.log_history if "loss" in entry]
    if train_metrics:
        logged = f"first logged {losses[0]:.4f}, last logged {losses[-1]:.4f}, " if losses else ""
        lines.append(
            f"train loss  {logged}mean {train_metrics['train_loss']:.4f} "
            f"({state.global_step} steps in {train_metrics['train_runtime']:.0f} s)"
        )
    if eval_metrics:
        lines.append(
            f"eval loss   {eval_metrics['eval_loss']:.4f} "
            f"(a uniform guess over the {vocab_size} tokens scores {math.log(vocab_size):.2f})"
        )
        if "eval_bleu" in eval_metrics:
            lines.append(f"BLEU / chrF {eval_metrics['eval_bleu']:.2f} / {eval_metrics['eval_chrf']:.2f}")
        rouge = [kind for kind in ("rouge1", "rouge2", "rougeL", "rougeLsum") if f"eval_{kind}" in eval_metrics]
        if rouge:
            lines.append("ROUGE       " + ", ".join(f"{kind} {eval_metrics['eval_' + kind]:.2f}" for kind in rouge))
    comm = {k: v for entry in state.log_history for k, v in entry.items() if k.startswith("flexdemo/")}
    if comm:
        traffic = ", ".join(_format_metric(key, value) for key, value in sorted(comm.items())) + " (last logged)"
        lines += textwrap.wrap(traffic, width=100, initial_indent="flexdemo    ", subsequent_indent=" " * 12)
    if predict_metrics:
        lines.append(f"predict     {predict_metrics['predict_samples']} test examples, loss "
                     f"{predict_metrics['predict_loss']:.4f}: predict_results.json, generated_predictions.txt")
    if train_metrics:
        lines.append(f"saved to    {training_args.output_dir}")
    width = max(len(line) for line in lines)
    return "\n".join([f" t5_{task} summary ".center(width, "="), *lines, "=" * width])


def describe_model(model_args: ModelArguments, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> str:
    return (
        f"{model_args.model_name_or_path or model_args.config_name or 'tiny'} "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters), "
        f"tokenizer {model_args.tokenizer_name or model_args.model_name_or_path or 'built from the training text'} "
        f"({len(tokenizer)} tokens)"
    )


def save_model_card(
    trainer: FlexDeMoSeq2SeqTrainer,
    task: str,
    model_args: ModelArguments,
    data_args: DataTrainingArguments,
    data_description: str | None = None,
) -> None:
    """Write the model card (with ``--push_to_hub``, push it with the model)."""
    card = model_card_kwargs(task, model_args, data_args, data_description)
    if trainer.args.push_to_hub:
        trainer.push_to_hub(**card)
    else:
        trainer.create_model_card(**card)


def print_examples(
    validation: Dataset, task: str, data_args: DataTrainingArguments, examples: list[tuple[str, str]]
) -> None:
    """The first ``--print_examples`` validation sources with their references and generations."""
    sources, _ = source_and_target_texts(validation, task, data_args)
    print("\nExample generations (validation):")
    for source, (reference, prediction) in itertools.islice(zip(sources, examples), data_args.print_examples):
        print(f"  source     {textwrap.shorten(source, 300)}")
        print(f"  reference  {reference}\n  generated  {prediction}\n")


def main(task: str) -> None:
    """Parse arguments, load data and model, train, evaluate and predict with FlexDeMo, print a summary."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {' | '.join(TASKS)}, got {task!r}")
    model_args, data_args, training_args, flexdemo_config = parse_arguments(task, sys.argv[1:])
    setup_logging(training_args)
    splits, data_description = load_data(task, data_args, model_args.cache_dir, training_args)

    tokenizer = load_tokenizer(model_args, splits, task, data_args)
    set_seed(training_args.seed)  # every rank builds the same initial weights
    model = load_model(model_args, tokenizer)
    tokenized = tokenize_splits(splits, task, tokenizer, data_args, training_args)
    metrics = Seq2SeqMetrics(task, tokenizer) if training_args.predict_with_generate else None
    trainer = build_trainer(model, training_args, flexdemo_config, tokenized, tokenizer, data_args, metrics)

    train_metrics = train(trainer, training_args) if training_args.do_train else {}
    eval_metrics = evaluate(trainer) if training_args.do_eval else {}
    examples = list(zip(metrics.references, metrics.predictions)) if metrics else []  # before predict replaces them
    predict_metrics: dict[str, float] = {}
    if training_args.do_predict:
        predict_metrics = write_predictions(trainer, tokenized["test"], tokenizer, training_args)
    save_model_card(trainer, task, model_args, data_args, data_description)

    main_process = trainer.is_world_process_zero()
    trainer.accelerator.end_training()  # destroys the process group: exiting with it alive can abort a rank
    if not main_process:
        return
    if examples and data_args.print_examples:
        print_examples(splits["validation"], task, data_args, examples)
    print(
        run_summary(
            task, data_description, splits, describe_model(model_args, model, tokenizer), training_args,
            trainer.flexdemo_config, train_metrics, eval_metrics, trainer.state, len(tokenizer), predict_metrics,
        )
    )


def cli(task: str) -> None:
    """``main`` as a command: bad input ends the job with one ``error: <message>`` line (rank 0's) and a non-zero exit
    on every rank (``bad_input_exits``; ``HF_FLEXDEMO_TRACEBACK=1``: the traceback)."""
    with bad_input_exits():
        main(task)
