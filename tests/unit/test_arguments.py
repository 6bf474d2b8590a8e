"""``hf_flexdemo.seq2seq.arguments.ConfigArgumentParser``: defaults < ``--config`` file < command-line flags."""

import argparse
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path

import pytest

from hf_flexdemo.seq2seq import arguments
from hf_flexdemo.seq2seq.arguments import ConfigArgumentParser, bad_input_exits, from_values


@dataclass
class Knobs:
    steps: int = 10
    name: str = "tiny"
    fast: bool = False
    tags: list[str] = field(default_factory=list)


@dataclass
class Data:
    lang: str | None = field(default=None, metadata={"help": "Language code (default: en)."})
    column: str | None = field(default=None, metadata={"help": "Column; None (the default): the first."})
    size: int = field(default=5, metadata={"help": "Examples."})


def parse(*args: str, defaults=None) -> Knobs:
    (knobs,) = ConfigArgumentParser(Knobs).parse_args_and_config(list(args), defaults=defaults)
    return knobs


def test_file_over_defaults_and_flags_over_file(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("steps: 7\nname: file\n")
    assert parse("--config", str(config), defaults={"steps": 3, "fast": True}) == Knobs(7, "file", True)
    assert parse("--steps", "9", f"--config={config}").steps == 9
    assert parse(str(config), "--name", "flag") == Knobs(7, "flag")  # a lone leading file, the HF examples' form


def test_defaults_may_follow_what_the_user_set(tmp_path: Path) -> None:
    config = tmp_path / "run.json"
    config.write_text('{"name": "big"}')
    seen = []

    def defaults(given: dict) -> dict:
        seen.append(given)
        return {"steps": 100 if from_values(Knobs, given).name == "big" else 1}

    assert parse("--config", str(config), "--fast", defaults=defaults) == Knobs(100, "big", True)
    assert seen == [{"name": "big", "fast": True}]  # typed, and only what the file and the flags set
    assert parse("--name", "small", defaults=defaults).steps == 1


def test_unknown_keys_name_themselves_and_the_accepted_fields(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("stepz: 3\ncolour: red\n")
    message = r"unknown argument\(s\) \['colour', 'stepz'\] \(did you mean 'steps' for 'stepz'\?\); " \
              r"the accepted fields are fast, name, steps, tags"
    with pytest.raises(ValueError, match=message):
        parse("--config", str(config))
    with pytest.raises(ValueError, match="--config needs a file"):
        parse("--config")


def test_a_long_list_of_accepted_fields_is_left_to_help(tmp_path: Path) -> None:
    many = make_dataclass("Many", [(f"field_{i}", int, field(default=i)) for i in range(arguments.LISTED_FIELDS + 1)])
    config = tmp_path / "run.yaml"
    config.write_text("field_l: 3\n")
    with pytest.raises(ValueError) as refused:
        ConfigArgumentParser(many).parse_args_and_config(["--config", str(config)])
    assert str(refused.value).endswith("; the 21 accepted fields are the flags --help lists, without their '--'")
    assert "field_0" not in str(refused.value)


def test_an_unknown_flag_is_refused_with_its_closest_match() -> None:
    with pytest.raises(ValueError, match=r"unrecognized argument\(s\) \['--stepz=3'\] \(did you mean '--steps' for "
                                         r"'--stepz=3'\?\); --help lists the accepted flags"):
        parse("--stepz=3")


def test_help_groups_each_dataclass_and_shows_one_default_per_flag() -> None:
    parser = ConfigArgumentParser((Knobs, Data), group_titles={Data: "Data"})
    text = parser.format_help()
    assert "\nKnobs:\n  --steps STEPS" in text and "\nData:\n  --lang LANG" in text  # the class name by default
    flat = " ".join(text.split())
    assert "Language code (default: en). --column" in flat  # stated: argparse's "(default: None)" would contradict it
    assert "Column; None (the default): the first. --size" in flat
    assert "Examples. (default: 5)" in flat  # not stated: argparse's


def test_argparse_errors_raise_when_exit_on_error_is_off() -> None:
    parser = ConfigArgumentParser(Knobs, exit_on_error=False)
    with pytest.raises(argparse.ArgumentError, match="argument --steps: invalid int value: 'many'"):
        parser.parse_args_and_config(["--steps", "many"])
    with pytest.raises(argparse.ArgumentError, match="ambiguous option: --ta could match"):
        ConfigArgumentParser((Knobs, make_dataclass("More", [("tabs", int, 1)])), exit_on_error=False
                             ).parse_args_and_config(["--ta", "1"])
    with pytest.raises(SystemExit):
        ConfigArgumentParser(Knobs).parse_args_and_config(["--steps", "many"])  # argparse's own, by default


@pytest.fixture
def no_wait(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(arguments, "REPORT_WAIT_S", 0.0)
    monkeypatch.delenv(arguments.TRACEBACK_ENV, raising=False)
    return monkeypatch


@pytest.mark.parametrize("error", [ValueError("bad value"), TypeError("bad value"),
                                   argparse.ArgumentError(None, "bad value")])
def test_bad_input_is_one_line_from_rank_0_and_an_exit_everywhere(no_wait, capsys, error: Exception) -> None:
    no_wait.setenv("RANK", "0")
    with pytest.raises(SystemExit) as stopped, bad_input_exits():
        raise error
    assert stopped.value.code == 2 and capsys.readouterr().err == "error: bad value\n"


def test_another_rank_reports_only_what_rank_0_did_not(no_wait, capsys) -> None:
    """Rank 1 waits for the launcher to end it once rank 0 has reported; still running after that, it reports."""
    no_wait.setenv("RANK", "1")
    slept = []
    no_wait.setattr(arguments.time, "sleep", slept.append)
    with pytest.raises(SystemExit), bad_input_exits():
        raise ValueError("only here")
    assert slept == [0.0] and capsys.readouterr().err == "error (rank 1): only here\n"


def test_the_traceback_on_request_and_for_anything_but_bad_input(no_wait) -> None:
    with pytest.raises(RuntimeError, match="a bug"), bad_input_exits():
        raise RuntimeError("a bug")
    no_wait.setenv(arguments.TRACEBACK_ENV, "1")
    with pytest.raises(ValueError, match="bad value"), bad_input_exits():
        raise ValueError("bad value")
