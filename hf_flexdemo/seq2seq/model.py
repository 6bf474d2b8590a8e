"""The model side of a T5 sequence-to-sequence job: which model and tokenizer, and the trainer that trains them.

``ModelArguments`` (``HfArgumentParser`` fields) pick a pretrained checkpoint (``model_name_or_path``) or a
new model (``config_name``: ``tiny``, a published T5 size built offline, or any config on the Hub or disk);
without ``tokenizer_name`` the tokenizer is the model's, else one built from the training text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from datasets import DatasetDict
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
)

from ..trainer.config import FlexDeMoConfig
from ..trainer.trainer import FlexDeMoSeq2SeqTrainer
from .data import DataTrainingArguments, source_and_target_texts
from .tiny_t5 import T5_CONFIG_NAMES, build_tokenizer, named_t5_config


@dataclass
class ModelArguments:
    """Which model and tokenizer to train."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Pretrained checkpoint (Hub id or directory); default: a new model."}
    )
    config_name: str | None = field(
        default=None,
        metadata={
            "help": "Configuration of a new model: 'tiny' (default), a published T5 size built offline "
            f"({', '.join(T5_CONFIG_NAMES[1:6])}, ...), or a config's Hub id or directory."
        },
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Tokenizer (Hub id or directory); default: the model's, else built from the training text."},
    )
    tokenizer_vocab_size: int = field(
        default=8000, metadata={"help": "Vocabulary size of a tokenizer built from the training text."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloads from the Hub are stored."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of Hub downloads."})

    def __post_init__(self) -> None:
        if self.model_name_or_path and self.config_name:
            raise ValueError(
                "model_name_or_path loads a trained model and config_name builds a new one: pass one of them"
            )
        if self.tokenizer_vocab_size < 16:
            raise ValueError(f"tokenizer_vocab_size must be >= 16, got {self.tokenizer_vocab_size}")


def load_tokenizer(
    model_args: ModelArguments, splits: DatasetDict, task: str, data_args: DataTrainingArguments
) -> PreTrainedTokenizerBase:
    """The named tokenizer, else the model's, else one built from the training text (same on every rank)."""
    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name:
        return AutoTokenizer.from_pretrained(name, cache_dir=model_args.cache_dir, revision=model_args.model_revision)
    sources, targets = source_and_target_texts(next(iter(splits.values())), task, data_args)
    texts = [data_args.source_prefix + source for source in sources] + targets
    return build_tokenizer(texts, vocab_size=model_args.tokenizer_vocab_size)


def load_model(model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The pretrained model, or a new one from the named configuration, with embeddings for every token."""
    if model_args.model_name_or_path:
        model = AutoModelForSeq2SeqLM.from_pretrained(
            model_args.model_name_or_path, cache_dir=model_args.cache_dir, revision=model_args.model_revision
        )
    else:
        name = model_args.config_name or "tiny"
        if name in T5_CONFIG_NAMES:
            config = named_t5_config(name, vocab_size=len(tokenizer))
        else:
            config = AutoConfig.from_pretrained(
                name, cache_dir=model_args.cache_dir, revision=model_args.model_revision
            )
        model = AutoModelForSeq2SeqLM.from_config(config)
    if model.get_input_embeddings().weight.shape[0] < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    if model.config.decoder_start_token_id is None:
        raise ValueError("the model config has no decoder_start_token_id; it cannot generate")
    return model  # T5's loss ignores num_items_in_batch; FlexDeMoTrainer.compute_loss weighs it by tokens anyway


def build_trainer(
    model: PreTrainedModel,
    training_args: Seq2SeqTrainingArguments,
    flexdemo_config: FlexDeMoConfig,
    splits: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    data_args: DataTrainingArguments,
    compute_metrics: Callable[[EvalPrediction], dict[str, float]] | None,
) -> FlexDeMoSeq2SeqTrainer:
    """A ``FlexDeMoSeq2SeqTrainer`` on the tokenized splits, with the seq2seq collator and ``compute_metrics``."""
    collator = DataCollatorForSeq2Seq(
        tokenizer,
        model=model,
        label_pad_token_id=-100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id,
        pad_to_multiple_of=8 if training_args.bf16 else None,
    )
    return FlexDeMoSeq2SeqTrainer(
        model=model,
        args=training_args,
        flexdemo_config=flexdemo_config,
        train_dataset=splits.get("train"),
        eval_dataset=splits.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
    )
