"""Offline tokenizer and T5 configurations."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer, T5ForConditionalGeneration

from hf_flexdemo.seq2seq.number_words import number_words_dataset
from hf_flexdemo.seq2seq.tiny_t5 import T5_CONFIG_NAMES, build_tokenizer, named_t5_config, tiny_t5_config


@pytest.fixture(scope="module")
def texts() -> list[str]:
    data = number_words_dataset(train_size=2000, eval_size=10, max_number=99_999)
    return [row[lang] for row in data["train"]["translation"] for lang in ("en", "fr")]


def test_tokenizer_has_t5_special_tokens_and_sentinels(texts: list[str]) -> None:
    tokenizer = build_tokenizer(texts, extra_ids=100)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == len(tokenizer) - 1  # T5: sentinels at the top
    assert tokenizer.convert_tokens_to_ids("<extra_id_99>") == len(tokenizer) - 100
    ids = tokenizer("trois cent quarante-deux").input_ids
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.convert_ids_to_tokens(ids[:-1]) == ["▁trois", "▁cent", "▁quarante", "-", "deux"]


def test_tokenizer_round_trips_text(texts: list[str]) -> None:
    tokenizer = build_tokenizer(texts)
    for text in texts[:300] + ["sept mille-deux", "zéro zéro"]:
        ids = tokenizer(text).input_ids
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_unseen_words_fall_back_to_characters(texts: list[str]) -> None:
    tokenizer = build_tokenizer(texts)
    ids = tokenizer("trente-vingtaine").input_ids  # "vingtaine" is not a word of the data
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "trente-vingtaine"
    assert tokenizer.unk_token_id in tokenizer("Ω").input_ids  # a character never seen


def test_vocab_size_caps_the_pieces(texts: list[str]) -> None:
    tokenizer = build_tokenizer(texts, vocab_size=60, extra_ids=10)
    assert len(tokenizer) == 60 + 10
    assert tokenizer.decode(tokenizer("quatre-vingt-dix").input_ids, skip_special_tokens=True) == "quatre-vingt-dix"


def test_tokenizer_saves_and_reloads_with_auto_tokenizer(texts: list[str], tmp_path) -> None:
    tokenizer = build_tokenizer(texts)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "T5Tokenizer"
    assert len(reloaded) == len(tokenizer)
    for text in texts[:200]:
        assert reloaded(text).input_ids == tokenizer(text).input_ids
    assert reloaded(text_target=["vingt et un"]).input_ids == tokenizer(text_target=["vingt et un"]).input_ids


def test_tokenizer_is_identical_in_every_process(texts: list[str], tmp_path) -> None:
    """Ranks build their tokenizer independently, and string hashing differs between processes."""
    texts = texts[:600] + ["a b c a b", "x y z z", "b a"]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    script = (
        "import json, sys\n"
        "from hf_flexdemo.seq2seq.tiny_t5 import build_tokenizer\n"
        "texts = json.load(open(sys.argv[1]))\n"
        "build_tokenizer(texts, vocab_size=120).save_pretrained(sys.argv[2])\n"
    )
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "texts.json"), str(tmp_path / "child")],
        check=True,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
    )
    build_tokenizer(texts, vocab_size=120).save_pretrained(tmp_path / "parent")
    child, parent = (json.loads((tmp_path / d / "tokenizer.json").read_text()) for d in ("child", "parent"))
    assert child["model"]["vocab"] == parent["model"]["vocab"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"texts": ["abc def"], "vocab_size": 8}, "vocab_size must exceed"),
        ({"texts": ["", "   "]}, "no word"),
        ({"texts": ["abc"], "extra_ids": -1}, "extra_ids must be >= 0"),
    ],
)
def test_tokenizer_refuses_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_tokenizer(**kwargs)


def test_tiny_t5_trains_a_step(texts: list[str]) -> None:
    tokenizer = build_tokenizer(texts)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(tiny_t5_config(len(tokenizer)))
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    batch = tokenizer(texts[:8:2], padding=True, return_tensors="pt")
    labels = tokenizer(text_target=texts[1:8:2], padding=True, return_tensors="pt").input_ids
    labels[labels == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    generated = model.generate(**batch, max_length=8)
    assert generated[0, 0].item() == model.config.decoder_start_token_id == tokenizer.pad_token_id


def test_tiny_t5_config_refuses_uneven_heads() -> None:
    with pytest.raises(ValueError, match="divisible by num_heads"):
        tiny_t5_config(100, d_model=100, num_heads=3)


# Parameter counts of the published checkpoints (32128-token vocabulary, tied embeddings).
@pytest.mark.parametrize(
    ("name", "parameters"),
    [("t5-small", 60_506_624), ("google-t5/t5-base", 222_903_552), ("t5-large", 737_668_096)],
)
def test_named_configs_have_the_published_shapes(name: str, parameters: int) -> None:
    config = named_t5_config(name, vocab_size=32128)
    with torch.device("meta"):
        model = T5ForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert config.decoder_start_token_id == 0


def test_named_configs_cover_v1_1_and_tiny() -> None:
    v1_1 = named_t5_config("google/t5-v1_1-small", vocab_size=1000)
    assert (v1_1.d_ff, v1_1.num_heads, v1_1.num_layers, v1_1.is_gated_act) == (1024, 6, 8, True)
    assert named_t5_config("tiny", vocab_size=300).to_dict() == tiny_t5_config(300).to_dict()
    assert set(T5_CONFIG_NAMES) >= {"tiny", "t5-small", "google-t5/t5-small", "t5-3b", "google/t5-v1_1-xxl"}


def test_unknown_config_name_is_refused() -> None:
    with pytest.raises(ValueError, match="is not one of tiny, t5-small"):
        named_t5_config("t5-medium", vocab_size=100)
