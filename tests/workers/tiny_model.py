"""The one tiny T5 the tests and workers train, built from the package's own config helper."""

from __future__ import annotations

import torch
from transformers import T5ForConditionalGeneration

from hf_flexdemo.seq2seq.tiny_t5 import tiny_t5_config

VOCAB_SIZE = 32


def tiny_t5() -> T5ForConditionalGeneration:
    """A 2 + 2-layer T5 of width 32 without dropout, initialised identically on every call and rank.

    Declared not to consume the Trainer's loss kwargs (T5's loss is a token mean that ignores
    ``num_items_in_batch``), the arithmetic the distributed tests' runs were written with;
    ``FlexDeMoTrainer.compute_loss`` gives the same loss without the declaration (tests/test_trainer_options.py).
    """
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(tiny_t5_config(VOCAB_SIZE, d_model=32, num_layers=2, num_heads=4, d_ff=64))
    model.accepts_loss_kwargs = False
    return model
