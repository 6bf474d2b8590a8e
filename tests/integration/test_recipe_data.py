"""The seq2seq recipe's arguments, data sources, preprocessing, offline metrics and summary (one process).

The data, model and metrics code is the package's (``hf_flexdemo.seq2seq``); the arguments, ``main`` and
the summary are the recipe script's, loaded from ``recipes/seq2seq.py``.
"""

import argparse
import csv
import gzip
import importlib.util
import json
import re
import socket
import sys
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import sacrebleu
from rouge_score import rouge_scorer
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, EvalPrediction, TrainerState

from hf_flexdemo.seq2seq import data as seq2seq_data
from hf_flexdemo.seq2seq import metrics as seq2seq_metrics
from hf_flexdemo.seq2seq import model as seq2seq_model
from hf_flexdemo.seq2seq.tiny_t5 import build_tokenizer

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def load_recipe():
    """``recipes/seq2seq.py``: a script next to its entry points, so loaded from its file."""
    spec = importlib.util.spec_from_file_location("recipe_seq2seq", RECIPES / "seq2seq.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


recipe = load_recipe()

MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
needs_multi30k = pytest.mark.skipif(
    not (MULTI30K / "val.en.gz").is_file(),
    reason=f"the Multi30k files are not at {MULTI30K} (../shared/data/multi30k from the repository root)",
)


def parse(task: str, *argv: str):
    return recipe.parse_arguments(task, list(argv))


def load(task: str, tmp_path: Path, *argv: str):
    """Parse ``argv``, then load, check and split the data as ``main`` does."""
    _, data_args, _, _ = parse(task, "--output_dir", str(tmp_path / "out"), *argv)
    raw, _ = seq2seq_data.load_raw_datasets(task, data_args, str(tmp_path / "cache"), seed=0)
    return seq2seq_data.prepare_splits(raw, data_args, seed=0), data_args


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return str(path)


def write_gz(path: Path, lines: list[str]) -> str:
    with gzip.open(path, "wt") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return str(path)


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt") as handle:
        return handle.read().splitlines()


PAIRS = [
    {"translation": {"en": "a red car", "fr": "une voiture rouge", "de": "ein rotes Auto"}},
    {"translation": {"en": "two dogs", "fr": "deux chiens", "de": "zwei Hunde"}},
    {"translation": {"en": "a man runs", "fr": "un homme court", "de": "ein Mann rennt"}},
]
ARTICLES = [
    {"text": "The river flooded the town. People left their homes.", "summary": "River floods town."},
    {"text": "A new bridge opened today after two years of work.", "summary": "Bridge opens."},
    {"text": "The team won the final in extra time.", "summary": "Team wins final."},
]


# --- arguments -------------------------------------------------------------------------------------------


def test_builtin_job_defaults() -> None:
    model_args, data_args, training_args, flexdemo = parse("translation")
    assert data_args.uses_number_words and flexdemo.method == "flexdemo"
    assert (training_args.max_steps, training_args.learning_rate) == (600, 3e-3)  # local steps: AdamW's own lr
    assert training_args.do_train and training_args.do_eval and training_args.predict_with_generate
    assert training_args.output_dir == "outputs/t5_translation"
    assert training_args.average_tokens_across_devices is True  # Trainer's; FlexDeMoTrainer.compute_loss fits T5
    assert (data_args.source_lang, data_args.target_lang, data_args.source_prefix) == ("en", "fr", "")


def test_user_values_win_over_recipe_defaults() -> None:
    _, _, training_args, _ = parse("translation", "--learning_rate", "1e-4", "--max_steps=5", "--do_eval")
    assert (training_args.learning_rate, training_args.max_steps) == (1e-4, 5)
    assert training_args.do_eval and not training_args.do_train
    _, _, training_args, _ = parse("translation", "--predict_with_generate", "False", "--do-eval")
    assert not training_args.predict_with_generate and not training_args.do_train


@pytest.mark.parametrize(
    ("argv", "lr"), [(["--method", "adamw"], 3e-3), (["--local_steps", "8"], 3e-3),
                     *((["--local_steps", "1", *argv], lr) for argv, lr in (
                         ([], 1e-3), (["--update", "rmsprop"], 1e-3), (["--momentum", "avg"], 1e-3),
                         *((["--momentum", "lr", "--update", u], lr) for u, lr in
                           (("sgd", 1.0), ("adamw", 1e-3), ("sign", 3e-3), ("rmsprop", 1e-3)))))]
)
def test_builtin_learning_rate_follows_the_update_rule(argv: list[str], lr: float) -> None:
    """Local steps and AdamW-HSDP take AdamW's lr; the step-wise rules each their own."""
    assert parse("translation", *argv)[2].learning_rate == lr


def test_the_summary_names_the_mode_and_the_wire() -> None:
    describe = recipe._method_description
    assert describe(parse("translation")[3]) == (
        "flexdemo (8 local AdamW steps per round in 4 fragments, replicator demo, rate 0.25 of 32-sided blocks in "
        "int2)")
    assert describe(parse("translation", "--local_steps", "1")[3]) == (
        "flexdemo (update sgd, replicator demo, rate 0.25 of 32-sided DCT blocks in float8)")


def test_user_data_keeps_the_trainer_defaults() -> None:
    _, data_args, training_args, _ = parse("summarization", "--train_file", "articles.jsonl")
    assert not data_args.uses_number_words
    assert (training_args.max_steps, training_args.learning_rate) == (-1, 5e-5)
    assert training_args.predict_with_generate and training_args.output_dir == "outputs/t5_summarization"


def test_arguments_from_a_json_file(tmp_path: Path) -> None:
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"output_dir": str(tmp_path), "max_steps": 7, "local_steps": 1, "momentum": "lr",
                                  "update": "sgd"}))
    _, data_args, training_args, flexdemo = parse("translation", str(config))
    assert (training_args.max_steps, training_args.learning_rate, flexdemo.update) == (7, 1.0, "sgd")
    assert training_args.do_train and training_args.predict_with_generate and data_args.uses_number_words


def test_config_file_under_command_line_flags(tmp_path: Path) -> None:
    """TRL's precedence: recipe defaults < --config file < command-line flags, wherever --config stands."""
    config = tmp_path / "run.yaml"
    config.write_text(
        f"output_dir: {tmp_path / 'out'}\nmax_steps: 7\nupdate: sgd\nlearning_rate: 0.5\ncompression_topk: 8\n"
        "do_eval: true\n"
    )
    _, data_args, training_args, flexdemo = parse(
        "translation", "--max_steps", "9", "--config", str(config), "--compression_topk=2"
    )
    assert (training_args.max_steps, flexdemo.compression_topk) == (9, 2)  # the flags win over the file
    assert (training_args.learning_rate, flexdemo.update) == (0.5, "sgd")  # the file wins over the recipe
    assert training_args.output_dir == str(tmp_path / "out") and data_args.uses_number_words
    assert training_args.do_eval and not training_args.do_train  # the file chose the phases
    assert training_args.predict_with_generate and training_args.warmup_steps == 50  # the recipe's defaults


def test_recipe_defaults_follow_the_file_and_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "run.yml"
    config.write_text("local_steps: 1\nmomentum: lr\nupdate: adamw\n")
    _, _, training_args, flexdemo = parse("translation", f"--config={config}")
    assert (flexdemo.update, training_args.learning_rate) == ("adamw", 1e-3)
    assert training_args.do_train and training_args.do_eval
    _, _, training_args, flexdemo = parse("translation", "--config", str(config), "--update", "sgd")
    assert (flexdemo.update, training_args.learning_rate) == ("sgd", 1.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [("max_stepz: 3\n", r"unknown argument\(s\) \['max_stepz'\]"), ("- 3\n", "expected a mapping")],
)
def test_bad_config_files_are_refused(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(content)
    with pytest.raises(ValueError, match=message):
        parse("translation", "--config", str(config))


def test_preset_fills_only_what_the_user_left_open() -> None:
    _, data_args, _, _ = parse("translation", "--data_preset", "opus_books_en_fr", "--max_source_length", "64")
    assert (data_args.dataset_name, data_args.dataset_config_name) == ("Helsinki-NLP/opus_books", "en-fr")
    assert data_args.source_prefix == "translate English to French: "
    assert (data_args.max_source_length, data_args.max_target_length) == (64, 512)
    assert data_args.validation_split_percentage == 20
    _, data_args, _, _ = parse("summarization", "--data_preset", "wikihow", "--source_prefix", "")
    assert (data_args.text_column, data_args.summary_column, data_args.source_prefix) == ("text", "title", "")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data_preset", "opus_books"], r"invalid data_preset='opus_books'; accepted: opus_books_en_fr \| wikihow "
                                          r"\(the FlexDeMo paper's data sets\) \(a set of FlexDeMo knob values is "
                                          r"--flexdemo_preset\)"),
        (["--dataset_name", "x", "--train_file", "y"], "not both"),
        (["--data_preset", "wikihow", "--train_file", "y"], "not both"),
        (["--source_lang", "fr"], "must differ"),
        (["--validation_split_percentage", "0"], "validation_split_percentage must be in"),
        (["--max_target_length", "0"], "max_target_length must be >= 1"),
        (["--model_name_or_path", "m", "--config_name", "t5-small"], "pass one of them"),
        (["--tokenizer_vocab_size", "4"], "tokenizer_vocab_size must be >= 16"),
    ],
)
def test_bad_arguments_are_refused_at_parse_time(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse("translation", *argv)


@pytest.mark.parametrize(("flag", "value"), [("--method", "sgd"), ("--replicator", "powersgd"), ("--update", "lion"),
                                             ("--momentum", "nesterov"), ("--on_drift", "ignore")])
def test_typed_choices_are_refused_by_argparse_with_the_choices(flag, value) -> None:
    """As an exception (the recipe reports it once per job), not argparse's usage message and exit on every rank."""
    with pytest.raises(argparse.ArgumentError) as refused:
        parse("translation", flag, value)
    assert f"argument {flag}" in str(refused.value) and f"invalid choice: '{value}' (choose from" in str(refused.value)


@pytest.mark.parametrize("preset", ["step-wise", "flexdemo-paper", "demo-paper", "default"])
def test_a_knob_preset_given_as_the_data_preset_points_to_flexdemo_preset(preset: str) -> None:
    message = (rf"invalid data_preset='{preset}'; accepted: opus_books_en_fr \| wikihow \(the FlexDeMo paper's data "
               rf"sets\)\. '{preset}' is a set of FlexDeMo knob values, not a data set: pass "
               rf"--flexdemo_preset {preset}$")
    with pytest.raises(ValueError, match=message):
        parse("translation", "--data_preset", preset)
    assert parse("translation", "--flexdemo_preset", preset)[3].flexdemo_preset == preset


@pytest.mark.parametrize("argv", [["--preset", "wikihow"], ["--preset=flexdemo-paper"]])
def test_the_ambiguous_preset_flag_names_both_of_its_meanings(argv: list[str]) -> None:
    with pytest.raises(ValueError, match=r"unrecognized argument --preset; accepted: --data_preset for a data set of "
                                         r"the FlexDeMo paper \(opus_books_en_fr \| wikihow\), or --flexdemo_preset "
                                         r"for a set of FlexDeMo knob values \(default \| step-wise \| "
                                         r"flexdemo-paper \| demo-paper\)"):
        parse("summarization", *argv)


def test_an_unknown_flag_names_its_closest_match() -> None:
    with pytest.raises(ValueError, match=r"unrecognized argument\(s\) \['--lerning_rate', '1e-3'\] \(did you mean "
                                         r"'--learning_rate' for '--lerning_rate'\?\); --help lists the accepted "
                                         r"flags"):
        parse("translation", "--lerning_rate", "1e-3")


def run_main(monkeypatch: pytest.MonkeyPatch, task: str, *argv: str) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(sys, "argv", [f"t5_{task}.py", *argv])
    recipe.main(task)


def test_predict_without_a_test_split_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="do_predict needs test data: pass --test_file"):
        run_main(monkeypatch, "translation", "--output_dir", str(tmp_path), "--do_predict",
                 "--number_words_train_size", "20", "--number_words_eval_size", "5")


def test_preset_of_the_other_task_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"invalid data_preset='wikihow': it is a summarization data set and this "
                                         r"recipe does translation; accepted: opus_books_en_fr \(the FlexDeMo paper's "
                                         r"translation data sets\), or recipes/t5_summarization.py for 'wikihow'"):
        run_main(monkeypatch, "translation", "--data_preset", "wikihow", "--output_dir", str(tmp_path))


# --- data sources ----------------------------------------------------------------------------------------


def test_builtin_number_words(tmp_path: Path) -> None:
    splits, _ = load("translation", tmp_path, "--number_words_train_size", "300", "--number_words_eval_size", "20")
    assert (len(splits["train"]), len(splits["validation"])) == (300, 20)
    assert set(splits["train"][0]["translation"]) == {"en", "fr"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--number_words_train_size", "20000"], "number_words_train_size/eval_size/max_number: .*exceeds"),
        (["--number_words_max_number", "0"], "max_number must be in"),
        (["--target_lang", "de"], "number-words data is en -> fr"),
    ],
)
def test_builtin_data_refuses_bad_arguments(tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load("translation", tmp_path, *argv)


def test_summarization_needs_data(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="summarization needs data"):
        load("summarization", tmp_path)


@needs_multi30k
def test_multi30k_parallel_pair_by_prefix(tmp_path: Path) -> None:
    splits, data_args = load(
        "translation", tmp_path, "--train_file", str(MULTI30K / "val"),
        "--validation_file", str(MULTI30K / "test_2016_flickr"),
    )
    english, french = read_gz(MULTI30K / "val.en.gz"), read_gz(MULTI30K / "val.fr.gz")
    assert (len(splits["train"]), len(splits["validation"])) == (1014, 1000)
    assert splits["train"][0]["translation"] == {"en": english[0], "fr": french[0]}
    assert splits["train"][-1]["translation"] == {"en": english[-1], "fr": french[-1]}
    sources, targets = seq2seq_data.source_and_target_texts(splits["validation"], "translation", data_args)
    assert (sources[5], targets[5]) == (
        read_gz(MULTI30K / "test_2016_flickr.en.gz")[5],
        read_gz(MULTI30K / "test_2016_flickr.fr.gz")[5],
    )


@needs_multi30k
def test_multi30k_pair_by_one_of_its_files_and_reversed(tmp_path: Path) -> None:
    splits, data_args = load(
        "translation", tmp_path, "--train_file", str(MULTI30K / "val.en.gz"), "--source_lang", "fr",
        "--target_lang", "en", "--max_train_samples", "100",
    )
    sources, targets = seq2seq_data.source_and_target_texts(splits["train"], "translation", data_args)
    french, english = read_gz(MULTI30K / "val.fr.gz"), read_gz(MULTI30K / "val.en.gz")
    assert len(splits["train"]) == 100
    assert len(splits["validation"]) == 51  # 5% of the 1014 pairs held out, as there is no validation file
    pairs = set(zip(french, english))
    assert all(pair in pairs for pair in zip(sources, targets))


@needs_multi30k
def test_broken_parallel_pairs_are_refused(tmp_path: Path) -> None:
    english, french = read_gz(MULTI30K / "val.en.gz")[:40], read_gz(MULTI30K / "val.fr.gz")[:40]
    write_gz(tmp_path / "short.en.gz", english)
    write_gz(tmp_path / "short.fr.gz", french[:39])
    with pytest.raises(ValueError, match="not aligned: .*40 lines.* 39"):
        load("translation", tmp_path, "--train_file", str(tmp_path / "short"))
    write_gz(tmp_path / "lonely.en.gz", english)
    with pytest.raises(ValueError, match="partner .*lonely.fr.gz is missing"):
        load("translation", tmp_path, "--train_file", str(tmp_path / "lonely.en.gz"))
    with pytest.raises(ValueError, match="found .*lonely.en.gz but no fr side"):
        load("translation", tmp_path, "--train_file", str(tmp_path / "lonely"))
    write_gz(tmp_path / "void.en.gz", [])
    write_gz(tmp_path / "void.fr.gz", [])
    with pytest.raises(ValueError, match="empty"):
        load("translation", tmp_path, "--train_file", str(tmp_path / "void"))


def test_jsonl_in_the_translation_convention(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", PAIRS * 20)
    splits, data_args = load("translation", tmp_path, "--train_file", path, "--validation_file", path)
    assert len(splits["train"]) == 60
    sources, targets = seq2seq_data.source_and_target_texts(splits["train"], "translation", data_args)
    assert (sources[1], targets[1]) == ("two dogs", "deux chiens")
    splits, data_args = load("translation", tmp_path, "--train_file", path, "--target_lang", "de")
    assert seq2seq_data.source_and_target_texts(splits["train"], "translation", data_args)[1][0] in {
        "ein rotes Auto", "zwei Hunde", "ein Mann rennt"
    }


def test_flat_language_columns_in_json_and_csv(tmp_path: Path) -> None:
    flat = [row["translation"] for row in PAIRS]
    json_path = write_jsonl(tmp_path / "flat.jsonl", flat)
    csv_path = tmp_path / "flat.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["en", "fr", "de"])
        writer.writeheader()
        writer.writerows(flat)
    for path in (json_path, str(csv_path)):
        splits, data_args = load("translation", tmp_path, "--train_file", path, "--validation_file", path)
        assert splits["validation"].column_names == ["translation"]
        assert seq2seq_data.source_and_target_texts(splits["validation"], "translation", data_args) == (
            ["a red car", "two dogs", "a man runs"],
            ["une voiture rouge", "deux chiens", "un homme court"],
        )


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [{"translation": {"en": "a", "de": "b"}}],
            r"language pair en -> fr is not in the data, which has \['en', 'de'\]",
        ),
        ([{"source": "a", "target": "b"}], r"expected a 'translation' column .* found columns \['source', 'target'\]"),
        ([{"translation": {"en": "", "fr": "x"}}, {"translation": {"en": "y", "fr": None}}], "no example has both"),
    ],
)
def test_json_without_usable_pairs_is_refused(tmp_path: Path, rows: list[dict], message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=f"--train_file {re.escape(path)}: {message}"):
        load("translation", tmp_path, "--train_file", path)


def test_rows_missing_a_side_are_dropped(tmp_path: Path) -> None:
    rows = [*PAIRS, {"translation": {"en": "three cats", "fr": None}}, {"translation": {"en": " ", "fr": "x"}}]
    path = write_jsonl(tmp_path / "holes.jsonl", rows)
    splits, _ = load("translation", tmp_path, "--train_file", path, "--validation_file", path)
    assert len(splits["validation"]) == 3


@pytest.mark.parametrize("content", ["", "en,fr\n"])
def test_empty_files_are_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / ("empty.csv" if content else "empty.jsonl")
    path.write_text(content)
    with pytest.raises(ValueError, match="empty"):
        load("translation", tmp_path, "--train_file", str(path))


def test_missing_and_unsupported_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--train_file .*nowhere.jsonl: no such file; .*PREFIX\.en\[\.gz\]"):
        load("translation", tmp_path, "--train_file", str(tmp_path / "nowhere.jsonl"))
    with pytest.raises(ValueError, match="--validation_file .*nowhere: no such file"):
        load("summarization", tmp_path, "--validation_file", str(tmp_path / "nowhere"))
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    with pytest.raises(ValueError, match="unsupported file type; expected a .json, .jsonl, .csv or .parquet"):
        load("summarization", tmp_path, "--train_file", str(notes))


def test_summarization_from_local_files(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "articles.jsonl", ARTICLES * 10)
    splits, data_args = load("summarization", tmp_path, "--train_file", path, "--max_eval_samples", "1")
    assert (len(splits["train"]), len(splits["validation"])) == (28, 1)  # 5% of 30 held out, rounded up
    csv_path = tmp_path / "news.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["article", "highlights"])
        writer.writerows([row["text"], row["summary"]] for row in ARTICLES)
    splits, data_args = load(
        "summarization", tmp_path, "--train_file", str(csv_path), "--validation_file", str(csv_path),
        "--text_column", "article", "--summary_column", "highlights",
    )
    assert seq2seq_data.source_and_target_texts(splits["validation"], "summarization", data_args)[1] == [
        "River floods town.", "Bridge opens.", "Team wins final."
    ]
    with pytest.raises(ValueError, match=r"no column \['text', 'summary'\]; found columns \['article', 'highlights'\]"):
        load("summarization", tmp_path, "--train_file", str(csv_path))


# --- preprocessing ---------------------------------------------------------------------------------------


def test_tokenization_adds_the_prefix_and_masks_padding(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", PAIRS)
    model_args, data_args, training_args, _ = parse(
        "translation", "--output_dir", str(tmp_path), "--train_file", path, "--validation_file", path,
        "--source_prefix", "translate: ", "--pad_to_max_length", "--max_source_length", "12",
        "--max_target_length", "10",
    )
    raw, _ = seq2seq_data.load_raw_datasets("translation", data_args, str(tmp_path / "cache"), seed=0)
    splits = seq2seq_data.prepare_splits(raw, data_args, seed=0)
    tokenizer = seq2seq_model.load_tokenizer(model_args, splits, "translation", data_args)
    tokenized = seq2seq_data.tokenize_splits(splits, "translation", tokenizer, data_args, training_args)
    example = tokenized["train"][1]
    assert len(example["input_ids"]) == 12 and len(example["labels"]) == 10
    assert tokenizer.decode(example["input_ids"], skip_special_tokens=True) == "translate: two dogs"
    labels = [t for t in example["labels"] if t != -100]
    assert tokenizer.decode(labels, skip_special_tokens=True) == "deux chiens"
    assert example["labels"][len(labels) :] == [-100] * (10 - len(labels))


# --- metrics ---------------------------------------------------------------------------------------------

HYPOTHESES = ["le chat est sur le tapis", "il pleut beaucoup aujourd'hui", "un homme court"]
REFERENCES = ["le chat est sur la table", "il pleut fort aujourd'hui", "un homme court vite"]


def test_offline_metric_modules_match_the_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    references = [[r] for r in REFERENCES]
    bleu = seq2seq_metrics.load_metric("sacrebleu").compute(predictions=HYPOTHESES, references=references)
    assert bleu["score"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score)
    chrf = seq2seq_metrics.load_metric("chrf").compute(predictions=HYPOTHESES, references=references)
    assert chrf["score"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    rouge = seq2seq_metrics.load_metric("rouge").compute(predictions=HYPOTHESES, references=REFERENCES)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"])
    expected = [scorer.score(r, h) for h, r in zip(HYPOTHESES, REFERENCES)]
    assert rouge["rouge1"] == pytest.approx(np.mean([s["rouge1"].fmeasure for s in expected]))
    assert rouge["rougeL"] == pytest.approx(np.mean([s["rougeL"].fmeasure for s in expected]))
    assert 0 < bleu["score"] < 100 and 0 < rouge["rouge2"] < 1


def test_metrics_fall_back_to_the_local_modules_without_network(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(seq2seq_metrics, "_hub_unreachable", False)
    monkeypatch.delenv("RANK", raising=False)
    with caplog.at_level("WARNING", logger="hf_flexdemo.seq2seq.metrics"):
        metric = seq2seq_metrics.load_metric("chrf")
        bleu = seq2seq_metrics.load_metric("sacrebleu").compute(predictions=HYPOTHESES,
                                                                references=[[h] for h in HYPOTHESES])
        assert bleu["score"] == pytest.approx(100)
    assert caplog.text.count("could not reach the Hub") == 1  # once, for every metric of the process
    assert f"the metrics come from the offline copies in {seq2seq_metrics.METRICS_DIR}" in caplog.text
    assert metric.compute(predictions=["un homme"], references=[["un homme"]])["score"] == pytest.approx(100)


def test_only_rank_0_says_the_metrics_are_offline(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(seq2seq_metrics.evaluate, "load", lambda path, **kwargs: refuse() if "/" not in path else path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(seq2seq_metrics, "_hub_unreachable", False)
    monkeypatch.setenv("RANK", "3")
    with caplog.at_level("WARNING", logger="hf_flexdemo.seq2seq.metrics"):
        assert seq2seq_metrics.load_metric("chrf") == str(seq2seq_metrics.METRICS_DIR / "chrf")
    assert caplog.text == ""


def test_seq2seq_metrics_decode_and_score(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    tokenizer = build_tokenizer(HYPOTHESES + REFERENCES)
    predictions = tokenizer(HYPOTHESES, padding=True, return_tensors="np").input_ids
    labels = tokenizer(text_target=HYPOTHESES, padding=True, return_tensors="np").input_ids
    labels[labels == tokenizer.pad_token_id] = -100
    metrics = seq2seq_metrics.Seq2SeqMetrics("translation", tokenizer)
    scores = metrics(EvalPrediction(predictions=predictions, label_ids=labels))
    assert scores["bleu"] == pytest.approx(100) and scores["chrf"] == pytest.approx(100)
    assert metrics.predictions == HYPOTHESES == metrics.references
    other = tokenizer(REFERENCES, padding=True, return_tensors="np").input_ids
    assert metrics(EvalPrediction(predictions=(other,), label_ids=labels))["bleu"] < 100
    summaries = seq2seq_metrics.Seq2SeqMetrics("summarization", tokenizer)
    assert summaries(EvalPrediction(predictions=predictions, label_ids=labels))["rouge1"] == pytest.approx(100)


def test_run_summary_reports_losses_scores_and_traffic(tmp_path: Path) -> None:
    _, data_args, training_args, flexdemo = parse("translation", "--output_dir", str(tmp_path / "model"))
    splits, _ = load("translation", tmp_path, "--number_words_train_size", "10", "--number_words_eval_size", "5")
    state = TrainerState(
        global_step=20,
        log_history=[
            {"loss": 5.1, "flexdemo/bytes_sent": 2 * 2**20, "step": 10},
            {"loss": 0.7, "flexdemo/bytes_sent": 3 * 2**20, "flexdemo/compression_ratio": 896.0, "step": 20},
        ],
    )
    text = recipe.run_summary(
        "translation", "number words", splits, "tiny", training_args, flexdemo,
        {"train_loss": 1.9, "train_runtime": 12.0}, {"eval_loss": 0.5, "eval_bleu": 41.5, "eval_chrf": 60.25},
        state, 210,
    )
    assert "10 train / 5 validation examples" in text
    assert "first logged 5.1000, last logged 0.7000, mean 1.9000 (20 steps in 12 s)" in text
    assert "eval loss   0.5000 (a uniform guess over the 210 tokens scores 5.35)" in text
    assert "BLEU / chrF 41.50 / 60.25" in text
    assert "bytes_sent 3.000 MiB" in text and "compression_ratio 896" in text
    assert f"saved to    {tmp_path / 'model'}" in text


# --- whole runs (one process, a few steps) ---------------------------------------------------------------


def test_translation_run_on_builtin_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    run_main(
        monkeypatch, "translation", "--output_dir", str(out), "--max_steps", "4", "--number_words_train_size",
        "64", "--number_words_eval_size", "8", "--generation_max_length", "8", "--disable_tqdm", "True",
    )
    printed = capsys.readouterr().out
    assert "Example generations (validation):" in printed and "t5_translation summary" in printed
    assert "BLEU / chrF" in printed and f"saved to    {out}" in printed
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    generated = model.generate(**tokenizer(["seven"], return_tensors="pt"), max_length=5)
    assert generated.shape[0] == 1
    assert json.loads((out / "eval_results.json").read_text())["eval_loss"] > 0
    card = (out / "README.md").read_text()  # written without push_to_hub
    assert "- flexdemo" in card and "## FlexDeMo training" in card and "- method: flexdemo" in card
    assert "This model was trained from scratch on the English -> French number words (built in) dataset." in card


@needs_multi30k
def test_translation_run_on_multi30k(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    run_main(
        monkeypatch, "translation", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"),
        "--train_file", str(MULTI30K / "val"), "--validation_file", str(MULTI30K / "test_2016_flickr.fr.gz"),
        "--max_train_samples", "64", "--max_eval_samples", "8", "--max_steps", "3", "--per_device_train_batch_size",
        "8", "--tokenizer_vocab_size", "2000", "--generation_max_length", "8", "--disable_tqdm", "True",
    )
    printed = capsys.readouterr().out
    assert "val.en.gz + " in printed and "64 train / 8 validation examples" in printed
    assert "source     " + read_gz(MULTI30K / "test_2016_flickr.en.gz")[0] in printed


def test_summarization_run_on_a_local_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    path = write_jsonl(tmp_path / "articles.jsonl", ARTICLES * 8)
    test = write_jsonl(tmp_path / "test.jsonl", ARTICLES)
    out = tmp_path / "out"
    run_main(
        monkeypatch, "summarization", "--output_dir", str(out), "--cache_dir", str(tmp_path / "cache"),
        "--train_file", path, "--validation_file", path, "--test_file", test, "--max_eval_samples", "4",
        "--max_predict_samples", "2", "--do_train", "--do_eval", "--do_predict", "--max_steps", "3",
        "--source_prefix", "summarize: ", "--generation_max_length", "8", "--disable_tqdm", "True",
    )
    printed = capsys.readouterr().out
    assert "t5_summarization summary" in printed and "ROUGE       rouge1" in printed
    assert "predict     2 test examples" in printed
    results = json.loads((out / "predict_results.json").read_text())
    assert results["predict_samples"] == 2 and results["predict_loss"] > 0 and "predict_rouge1" in results
    assert len((out / "generated_predictions.txt").read_text(encoding="utf-8").split("\n")) == 2
    assert "## FlexDeMo training" in (out / "README.md").read_text()
