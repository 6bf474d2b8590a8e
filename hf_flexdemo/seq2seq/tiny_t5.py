"""Offline T5 defaults: a tokenizer trained on the user's own text, and T5 configurations by name.

Nothing here downloads anything: a user without the Hugging Face Hub (or a test) still gets a
T5 tokenizer with T5's special tokens and sentinels, the shapes of the published T5 checkpoints,
and a tiny T5 that trains on a CPU in minutes.
"""

import math
import re
from collections import Counter
from collections.abc import Iterable

from tokenizers import pre_tokenizers
from transformers import T5Config, T5Tokenizer

_SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2, as in every T5 checkpoint
_PIECE = re.compile(r"\w+|[^\w\s]")
_CHAR_PENALTY = 10.0

# d_model, d_ff, d_kv, num_heads, num_layers, feed_forward_proj, tie_word_embeddings: from the
# published config.json of each checkpoint (google-t5/t5-*, google/t5-v1_1-*).
_PUBLISHED_SHAPES = {
    "t5-small": (512, 2048, 64, 8, 6, "relu", True),
    "t5-base": (768, 3072, 64, 12, 12, "relu", True),
    "t5-large": (1024, 4096, 64, 16, 24, "relu", True),
    "t5-3b": (1024, 16384, 128, 32, 24, "relu", True),
    "t5-11b": (1024, 65536, 128, 128, 24, "relu", True),
    "t5-v1_1-small": (512, 1024, 64, 6, 8, "gated-gelu", False),
    "t5-v1_1-base": (768, 2048, 64, 12, 12, "gated-gelu", False),
    "t5-v1_1-large": (1024, 2816, 64, 16, 24, "gated-gelu", False),
    "t5-v1_1-xl": (2048, 5120, 64, 32, 24, "gated-gelu", False),
    "t5-v1_1-xxl": (4096, 10240, 64, 64, 24, "gated-gelu", False),
}
T5_VOCAB_SIZE = 32128  # embedding rows of every published T5 checkpoint (its SentencePiece vocabulary + padding)
T5_CONFIG_NAMES: tuple[str, ...] = (
    "tiny",
    *_PUBLISHED_SHAPES,
    *(f"google-t5/{name}" for name in _PUBLISHED_SHAPES if "v1_1" not in name),
    *(f"google/{name}" for name in _PUBLISHED_SHAPES if "v1_1" in name),
)


def build_tokenizer(texts: Iterable[str], vocab_size: int = 8000, extra_ids: int = 100) -> T5Tokenizer:
    """A T5 tokenizer (Unigram model, ``<pad>``/``</s>``/``<unk>``, ``<extra_id_N>`` sentinels) for ``texts``.

    The vocabulary is the most frequent pieces of the text -- a word's first run of letters or
    digits marked with T5's "▁", every later run, every punctuation mark -- scored by their
    log frequency, plus every character of the text at a much lower score so that unseen
    words still tokenize. Pure counting, with ties broken by the piece itself: the same text
    always gives the same tokenizer on every rank and every node, which a trained Unigram
    vocabulary (``tokenizers``' trainer iterates over a randomly seeded hash map) does not.
    ``vocab_size`` counts the special tokens and the characters, not the ``extra_ids`` sentinels.
    """
    split = pre_tokenizers.WhitespaceSplit()
    pieces: Counter[str] = Counter()
    characters: set[str] = set()
    for text in texts:
        for word, _ in split.pre_tokenize_str(text):
            characters.update(word)
            runs = _PIECE.findall(word)
            pieces["▁" + runs[0]] += 1
            pieces.update(runs[1:])
    if not pieces:
        raise ValueError("build_tokenizer: the texts hold no word to build a vocabulary from")
    characters.add("▁")
    if vocab_size <= len(_SPECIAL_TOKENS) + len(characters):
        raise ValueError(
            f"vocab_size must exceed {len(_SPECIAL_TOKENS) + len(characters)} (3 special tokens and the "
            f"{len(characters)} distinct characters of the text), got {vocab_size}"
        )
    if extra_ids < 0:
        raise ValueError(f"extra_ids must be >= 0, got {extra_ids}")
    total = sum(pieces.values())
    kept: list[tuple[str, float]] = []
    uncovered = set(characters)  # characters that are not pieces of their own yet
    for piece, count in sorted(pieces.items(), key=lambda item: (-item[1], item[0])):
        if len(_SPECIAL_TOKENS) + len(kept) + 1 + len(uncovered) - (piece in uncovered) > vocab_size:
            break
        kept.append((piece, math.log(count / total)))
        uncovered.discard(piece)
    character_score = kept[-1][1] - _CHAR_PENALTY if kept else -_CHAR_PENALTY
    vocab = [(token, 0.0) for token in _SPECIAL_TOKENS] + kept
    vocab += [(char, character_score) for char in sorted(uncovered)]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in reversed(range(extra_ids))]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids)


def tiny_t5_config(
    vocab_size: int,
    d_model: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    d_ff: int = 512,
    dropout_rate: float = 0.0,
) -> T5Config:
    """A T5 small enough to train on a CPU in minutes (about 1M parameters plus the embeddings)."""
    if d_model % num_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    return T5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=d_model // num_heads,
        d_ff=d_ff,
        num_layers=num_layers,
        num_heads=num_heads,
        dropout_rate=dropout_rate,
        decoder_start_token_id=0,
    )


def named_t5_config(name: str, vocab_size: int) -> T5Config:
    """The T5 configuration called ``name`` (see ``T5_CONFIG_NAMES``), sized for ``vocab_size`` tokens.

    ``"tiny"`` is ``tiny_t5_config``; the others carry the published checkpoints' shapes, so
    ``--config_name t5-small`` builds an untrained t5-small with no download.
    """
    if name not in T5_CONFIG_NAMES:
        raise ValueError(f"config name {name!r} is not one of {', '.join(T5_CONFIG_NAMES)}")
    if name == "tiny":
        return tiny_t5_config(vocab_size)
    d_model, d_ff, d_kv, num_heads, num_layers, feed_forward_proj, tied = _PUBLISHED_SHAPES[name.split("/")[-1]]
    return T5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_ff=d_ff,
        d_kv=d_kv,
        num_heads=num_heads,
        num_layers=num_layers,
        feed_forward_proj=feed_forward_proj,
        tie_word_embeddings=tied,
        decoder_start_token_id=0,
    )
