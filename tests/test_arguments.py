"""``hf_flexdemo.arguments.ConfigArgumentParser``: defaults < ``--config`` file < command-line flags."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hf_flexdemo.arguments import ConfigArgumentParser, from_values


@dataclass
class Knobs:
    steps: int = 10
    name: str = "tiny"
    fast: bool = False
    tags: list[str] = field(default_factory=list)


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
