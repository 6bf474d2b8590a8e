"""The data of a T5 sequence-to-sequence job: where it comes from, its columns, splits and model inputs.

``DataTrainingArguments`` (``HfArgumentParser`` fields) name the source, the first that applies:

* ``data_preset``: a data set of the FlexDeMo paper on the Hub (``PRESETS``; fields the user sets win). Not to be
  confused with ``FlexDeMoConfig.flexdemo_preset``, a set of optimizer knob values (``hf_flexdemo.knobs.PRESETS``);
* ``dataset_name`` [``dataset_config_name``]: any Hub data set;
* ``train_file`` / ``validation_file`` / ``test_file``: local files -- JSON lines in the HF convention
  (``{"translation": {"en": ..., "fr": ...}}``, or flat columns named by the language codes), ``.json``,
  ``.csv``, ``.parquet`` (each optionally ``.gz``), or, for translation, aligned plain-text files, one
  sentence a line: ``data/train`` reads ``data/train.<source_lang>`` and ``data/train.<target_lang>`` (each
  optionally ``.gz``), and ``data/train.en.gz`` names one side of such a pair;
* nothing (translation only): English -> French number words (``hf_flexdemo.seq2seq.number_words``).

``load_raw_datasets`` reads and checks the splits, ``prepare_splits`` holds a validation split out of the
training data when there is none, ``tokenize_splits`` makes model inputs and labels, as the Hugging Face
examples (``run_translation.py`` / ``run_summarization.py``) do.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset
from datasets.exceptions import DatasetGenerationError
from transformers import PreTrainedTokenizerBase, Seq2SeqTrainingArguments

from .. import knobs
from .number_words import number_words_dataset

logger = logging.getLogger(__name__)

TASKS = ("translation", "summarization")
_COMPRESSIONS = ("", ".gz", ".bz2", ".xz")
_TABLE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Preset:
    """A data set of the FlexDeMo paper, read as its reference benchmark does (Hub id, columns, 20% held out).

    The T5 task prefixes are the recipe's addition: they help pretrained checkpoints and cost nothing else.
    """

    task: str
    dataset_name: str
    dataset_config_name: str | None
    source_prefix: str
    max_source_length: int
    max_target_length: int
    source_lang: str | None = None
    target_lang: str | None = None
    text_column: str | None = None
    summary_column: str | None = None
    validation_split_percentage: int = 20


PRESETS = {
    "opus_books_en_fr": Preset(
        "translation", "Helsinki-NLP/opus_books", "en-fr", "translate English to French: ", 512, 512,
        source_lang="en", target_lang="fr",
    ),
    "wikihow": Preset(
        "summarization", "gursi26/wikihow-cleaned", None, "summarize: ", 512, 150,
        text_column="text", summary_column="title",
    ),
}


def check_data_preset(name: str, task: str | None = None) -> None:
    """Refuse a ``data_preset`` that is not one of ``PRESETS`` (of ``task``'s, when given), naming the fix; a knob
    preset's name (``flexdemo-paper``) points to ``--flexdemo_preset``, where it belongs."""
    accepted = [key for key, preset in PRESETS.items() if task is None or preset.task == task]
    if name in accepted:
        return
    what = f"{' | '.join(accepted)} (the FlexDeMo paper's {task + ' ' if task else ''}data sets)"
    if name in knobs.PRESETS:
        raise ValueError(f"invalid data_preset={name!r}; accepted: {what}. {name!r} is a set of FlexDeMo knob values, "
                         f"not a data set: pass --flexdemo_preset {name}")
    if name in PRESETS:  # another task's
        raise ValueError(f"invalid data_preset={name!r}: it is a {PRESETS[name].task} data set and this recipe does "
                         f"{task}; accepted: {what}, or recipes/t5_{PRESETS[name].task}.py for {name!r}")
    raise ValueError(f"invalid data_preset={name!r}; accepted: {what} (a set of FlexDeMo knob values is "
                     "--flexdemo_preset)")


# Values of the fields a preset may set when the preset leaves them open (or there is no preset).
_DATA_DEFAULTS = {
    "source_lang": "en",
    "target_lang": "fr",
    "text_column": "text",
    "summary_column": "summary",
    "source_prefix": "",
    "max_source_length": 1024,
    "max_target_length": 128,
    "validation_split_percentage": 5,
}


@dataclass
class DataTrainingArguments:
    """Which data to train and evaluate on, and how it becomes model inputs."""

    data_preset: str | None = field(
        default=None,
        metadata={"help": f"A data set of the FlexDeMo paper: {' | '.join(PRESETS)} (a set of FlexDeMo knob values "
                          "is --flexdemo_preset)."},
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Data set on the Hub."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of the Hub data set."})
    train_file: str | None = field(
        default=None,
        metadata={"help": "Local training data: .json/.jsonl/.csv/.parquet[.gz], or a parallel pair prefix."},
    )
    validation_file: str | None = field(default=None, metadata={"help": "Local validation data, as train_file."})
    test_file: str | None = field(default=None, metadata={"help": "Local test data for --do_predict, as train_file."})
    source_lang: str | None = field(default=None, metadata={"help": "Source language code (default: en)."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language code (default: fr)."})
    text_column: str | None = field(
        default=None, metadata={"help": "Summarization: column of the full texts (default: text)."}
    )
    summary_column: str | None = field(
        default=None, metadata={"help": "Summarization: column of the summaries (default: summary)."}
    )
    source_prefix: str | None = field(
        default=None, metadata={"help": "Text put before every source, e.g. 'summarize: ' (default: none)."}
    )
    max_source_length: int | None = field(
        default=None, metadata={"help": "Sources are truncated to this many tokens (default: 1024)."}
    )
    max_target_length: int | None = field(
        default=None,
        metadata={"help": "Targets are truncated to this many tokens; also the generation length (default: 128)."},
    )
    validation_split_percentage: int | None = field(
        default=None,
        metadata={"help": "Percent of the training data held out when there is no validation split (default: 5)."},
    )
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "Pad every example to the maximum length instead of per batch."}
    )
    ignore_pad_token_for_loss: bool = field(
        default=True, metadata={"help": "Leave padded label positions out of the loss."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only the first N test examples."})
    num_beams: int | None = field(
        default=None, metadata={"help": "Beams for generation at evaluation (sets generation_num_beams)."}
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Redo cached preprocessing."})
    number_words_train_size: int = field(default=9000, metadata={"help": "Built-in data: training examples."})
    number_words_eval_size: int = field(default=500, metadata={"help": "Built-in data: validation examples."})
    number_words_max_number: int = field(default=9999, metadata={"help": "Built-in data: largest number."})
    print_examples: int = field(default=3, metadata={"help": "Generations printed at the end of the run."})

    def __post_init__(self) -> None:
        if self.data_preset is not None:
            check_data_preset(self.data_preset)
            preset = PRESETS[self.data_preset]
            for name in ("dataset_name", "dataset_config_name", *_DATA_DEFAULTS):
                if getattr(self, name) is None:
                    setattr(self, name, getattr(preset, name))
        for name, value in _DATA_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.dataset_name and (self.train_file or self.validation_file or self.test_file):
            raise ValueError("pass either dataset_name (or data_preset) or train_file/validation_file/test_file, "
                             "not both")
        if self.source_lang == self.target_lang:
            raise ValueError(f"source_lang and target_lang must differ, both are {self.source_lang!r}")
        if not 1 <= self.validation_split_percentage <= 99:
            raise ValueError(f"validation_split_percentage must be in [1, 99], got {self.validation_split_percentage}")
        for name in ("max_source_length", "max_target_length", "num_beams", "max_train_samples", "max_eval_samples",
                     "max_predict_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.print_examples < 0:
            raise ValueError(f"print_examples must be >= 0, got {self.print_examples}")

    @property
    def uses_number_words(self) -> bool:
        """No data source was given: the built-in number-words task."""
        return not (self.dataset_name or self.train_file or self.validation_file or self.test_file)


def _parallel_pair(path: str, source_lang: str, target_lang: str) -> tuple[str, str] | None:
    """The two files of an aligned plain-text pair named by ``path`` (one side, or their common prefix)."""
    for compression in _COMPRESSIONS:
        for lang, other in ((source_lang, target_lang), (target_lang, source_lang)):
            suffix = f".{lang}{compression}"
            if path.endswith(suffix) and os.path.isfile(path):
                partner = f"{path[: -len(suffix)]}.{other}{compression}"
                if not os.path.isfile(partner):
                    raise ValueError(f"{path} is one side of a parallel pair, but its partner {partner} is missing")
                return (path, partner) if lang == source_lang else (partner, path)

    def side(lang: str) -> str | None:
        found = [f"{path}.{lang}{c}" for c in _COMPRESSIONS if os.path.isfile(f"{path}.{lang}{c}")]
        return found[0] if found else None

    source, target = side(source_lang), side(target_lang)
    if source and target:
        return source, target
    if source or target:
        raise ValueError(
            f"parallel pair {path}: found {source or target} but no {target_lang if source else source_lang} side"
        )
    return None


def _load_file(builder: str, path: str, origin: str, cache_dir: str | None, **kwargs: Any) -> Dataset:
    try:
        return load_dataset(builder, data_files=path, split="train", cache_dir=cache_dir, **kwargs)
    except (StopIteration, ValueError, DatasetGenerationError) as err:  # how the builders report a file without rows
        raise ValueError(f"{origin} {path}: the data set is empty or not readable as {builder} ({err!r})") from err


def _read_parallel(
    origin: str, source: str, target: str, source_lang: str, target_lang: str, cache_dir: str | None
) -> Dataset:
    sides = [_load_file("text", file, origin, cache_dir, keep_linebreaks=False) for file in (source, target)]
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"parallel pair is not aligned: {source} has {len(sides[0])} lines, {target} {len(sides[1])}")
    pairs = sides[0].add_column("target", sides[1]["text"])
    return pairs.map(
        lambda batch: {
            "translation": [{source_lang: s, target_lang: t} for s, t in zip(batch["text"], batch["target"])]
        },
        batched=True,
        remove_columns=["text", "target"],
    )


def read_local_file(
    option: str, path: str, task: str, data_args: DataTrainingArguments, cache_dir: str | None
) -> tuple[Dataset, str]:
    """One local data file (or parallel pair) as a data set, and how to name it in messages."""
    stem = path
    for compression in _COMPRESSIONS[1:]:
        stem = stem.removesuffix(compression)
    builder = _TABLE_BUILDERS.get(Path(stem).suffix)
    if builder and os.path.isfile(path):
        return _load_file(builder, path, option, cache_dir), path
    if task == "translation":
        pair = _parallel_pair(path, data_args.source_lang, data_args.target_lang)
        if pair:
            dataset = _read_parallel(option, *pair, data_args.source_lang, data_args.target_lang, cache_dir)
            return dataset, " + ".join(pair)
    accepted = "a .json, .jsonl, .csv or .parquet file (optionally .gz)"
    if task == "translation":
        accepted += (
            f", or an aligned pair PREFIX.{data_args.source_lang}[.gz] + PREFIX.{data_args.target_lang}[.gz]"
            " given as PREFIX or as one of its files"
        )
    reason = "unsupported file type" if os.path.isfile(path) else "no such file"
    raise ValueError(f"{option} {path}: {reason}; expected {accepted}")


def load_raw_datasets(
    task: str, data_args: DataTrainingArguments, cache_dir: str | None, seed: int, predict: bool = False
) -> tuple[DatasetDict, str]:
    """The "train" / "validation" / "test" splits given (whichever exist), checked, and a one-line description.

    A Hub data set's "test" split is read only for ``predict``; a ``--test_file`` whenever it is given.
    """
    if data_args.uses_number_words:
        if task != "translation":
            raise ValueError(
                "summarization needs data: pass --data_preset wikihow, --dataset_name or --train_file "
                "(the built-in number-words data is a translation task)"
            )
        try:
            raw = number_words_dataset(
                train_size=data_args.number_words_train_size,
                eval_size=data_args.number_words_eval_size,
                seed=seed,
                max_number=data_args.number_words_max_number,
            )
        except ValueError as err:
            raise ValueError(f"number_words_train_size/eval_size/max_number: {err}") from err
        if (data_args.source_lang, data_args.target_lang) != ("en", "fr"):
            raise ValueError("the built-in number-words data is en -> fr: leave source_lang/target_lang unset")
        return raw, "English -> French number words (built in)"
    if data_args.dataset_name:
        raw = load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir)
        name = data_args.dataset_name + (f" ({data_args.dataset_config_name})" if data_args.dataset_config_name else "")
        splits = {
            split: to_task_columns(raw[split], task, data_args, f"dataset_name {name} [{split}]")
            for split in ("train", "validation", "test")
            if split in raw and (split != "test" or predict)
        }
        if not splits:
            raise ValueError(f"dataset_name {name} has no 'train' or 'validation' split, only {list(raw)}")
        return DatasetDict(splits), name
    splits, names = {}, []
    for split, option, path in (
        ("train", "--train_file", data_args.train_file),
        ("validation", "--validation_file", data_args.validation_file),
        ("test", "--test_file", data_args.test_file),
    ):
        if path:
            dataset, name = read_local_file(option, path, task, data_args, cache_dir)
            splits[split] = to_task_columns(dataset, task, data_args, f"{option} {name}")
            names.append(name)
    return DatasetDict(splits), ", ".join(names)


def _has_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _translation_languages(dataset: Dataset) -> list[str]:
    """The language keys of a ``translation`` column: from its feature, or the rows when it is free-form JSON."""
    feature = dataset.features["translation"]
    if hasattr(feature, "languages"):
        return list(feature.languages)
    if isinstance(feature, dict):
        return list(feature)
    keys = dict.fromkeys(key for row in dataset["translation"] if isinstance(row, dict) for key in row)
    return list(keys)


def to_task_columns(dataset: Dataset, task: str, data_args: DataTrainingArguments, origin: str) -> Dataset:
    """Check that ``dataset`` holds the task's columns and keep the rows that have both texts.

    Translation: a ``translation`` column of ``{source_lang: ..., target_lang: ...}``, or flat
    columns named by the two language codes (turned into the former).
    """
    source, target = data_args.source_lang, data_args.target_lang
    columns = dataset.column_names
    if task == "translation":
        if "translation" in columns:
            languages = _translation_languages(dataset)
            if source not in languages or target not in languages:
                raise ValueError(
                    f"{origin}: language pair {source} -> {target} is not in the data, which has "
                    f"{languages or 'no language keys'}; set --source_lang/--target_lang"
                )
        elif source in columns and target in columns:
            dataset = dataset.map(
                lambda batch: {
                    "translation": [{source: s, target: t} for s, t in zip(batch[source], batch[target])]
                },
                batched=True,
                remove_columns=columns,
            )
        else:
            raise ValueError(
                f"{origin}: expected a 'translation' column of {{'{source}': ..., '{target}': ...}} "
                f"(the Hugging Face translation convention) or columns '{source}' and '{target}'; "
                f"found columns {columns}"
            )

        def keep(row: dict[str, Any]) -> bool:
            pair = row["translation"] or {}
            return _has_text(pair.get(source)) and _has_text(pair.get(target))
    else:
        missing = [c for c in (data_args.text_column, data_args.summary_column) if c not in columns]
        if missing:
            raise ValueError(
                f"{origin}: no column {missing}; found columns {columns}; set --text_column/--summary_column"
            )

        def keep(row: dict[str, Any]) -> bool:
            return _has_text(row[data_args.text_column]) and _has_text(row[data_args.summary_column])

    if len(dataset) == 0:
        raise ValueError(f"{origin}: the data set is empty")
    kept = dataset.filter(keep)
    if len(kept) == 0:
        raise ValueError(f"{origin}: no example has both a source and a target text")
    if len(kept) < len(dataset):
        logger.warning("%s: dropped %d examples without source or target text", origin, len(dataset) - len(kept))
    return kept


def prepare_splits(raw: DatasetDict, data_args: DataTrainingArguments, seed: int) -> DatasetDict:
    """A validation split (held out from train when absent), then the sample limits."""
    splits = dict(raw)
    if "validation" not in splits and "train" in splits:
        held_out = splits["train"].train_test_split(test_size=data_args.validation_split_percentage / 100, seed=seed)
        splits |= {"train": held_out["train"], "validation": held_out["test"]}
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
              "test": data_args.max_predict_samples}
    for name, limit in limits.items():
        if limit is not None and name in splits:
            splits[name] = splits[name].select(range(min(limit, len(splits[name]))))
    return DatasetDict(splits)


def source_and_target_texts(
    columns: Dataset | dict[str, list], task: str, data_args: DataTrainingArguments
) -> tuple[list[str], list[str]]:
    """The source texts (prefix not included) and target texts of a split or a batch of one."""
    if task == "translation":
        pairs = columns["translation"]
        return [p[data_args.source_lang] for p in pairs], [p[data_args.target_lang] for p in pairs]
    return list(columns[data_args.text_column]), list(columns[data_args.summary_column])


def tokenize_splits(
    splits: DatasetDict,
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    data_args: DataTrainingArguments,
    training_args: Seq2SeqTrainingArguments,
) -> DatasetDict:
    """Model inputs and labels for every split, as in the Hugging Face examples."""
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        sources, targets = source_and_target_texts(batch, task, data_args)
        inputs = tokenizer(
            [data_args.source_prefix + s for s in sources],
            max_length=data_args.max_source_length,
            padding=padding,
            truncation=True,
        )
        labels = tokenizer(
            text_target=targets, max_length=data_args.max_target_length, padding=padding, truncation=True
        )
        label_ids = labels["input_ids"]
        if padding and data_args.ignore_pad_token_for_loss:
            label_ids = [[t if t != tokenizer.pad_token_id else -100 for t in ids] for ids in label_ids]
        inputs["labels"] = label_ids
        return inputs

    tokenized = {}
    for name, split in splits.items():
        with training_args.main_process_first(desc=f"tokenizing {name}"):
            tokenized[name] = split.map(
                tokenize,
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=split.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Tokenizing {name}",
            )
    return DatasetDict(tokenized)
