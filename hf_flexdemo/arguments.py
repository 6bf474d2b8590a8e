"""``ConfigArgumentParser``: ``HfArgumentParser`` with a ``--config`` file, as TRL's ``TrlParser``.

``parse_args_and_config()`` fills the dataclasses from, lowest first: the fields' defaults, the
caller's ``defaults`` (a mapping, or a function of what the user set), the ``--config`` file (JSON or
YAML, a mapping of field names to values) and the command-line flags. As in the Hugging Face
examples, a lone leading ``.json`` / ``.yaml`` argument is read as the config file too.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import yaml
from transformers import HfArgumentParser

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
HELP_FLAGS = ("-h", "--help")

Defaults = Mapping[str, Any] | Callable[[dict[str, Any]], Mapping[str, Any]]
T = TypeVar("T")


def read_config(path: str) -> dict[str, Any]:
    """The arguments a ``--config`` file sets: a JSON or YAML mapping of argument names to values."""
    text = Path(path).read_text()
    values = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a mapping of argument names to values, got {values!r}")
    return values


def split_config(args: list[str]) -> tuple[str | None, list[str]]:
    """The ``--config`` path (or a lone leading .json/.yaml, the HF examples' form) and the other arguments."""
    for i, arg in enumerate(args):
        if arg == "--config":
            if i + 1 == len(args):
                raise ValueError("--config needs a file: --config run.yaml")
            return args[i + 1], args[:i] + args[i + 2 :]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], args[:i] + args[i + 1 :]
    if args and args[0].endswith(CONFIG_SUFFIXES):
        return args[0], args[1:]
    return None, args


def from_values(dataclass_type: type[T], values: Mapping[str, Any]) -> T:
    """``dataclass_type`` with its fields found in ``values`` (e.g. the values a user set) and defaults elsewhere."""
    return dataclass_type(**{f.name: values[f.name] for f in fields(dataclass_type) if f.init and f.name in values})


class ConfigArgumentParser(HfArgumentParser):
    """An ``HfArgumentParser`` whose ``parse_args_and_config`` also reads ``--config file.yaml``.

    >>> parser = ConfigArgumentParser((ModelArguments, Seq2SeqTrainingArguments))
    >>> model_args, training_args = parser.parse_args_and_config()
    """

    def __init__(self, dataclass_types: Any, **kwargs: Any) -> None:
        super().__init__(dataclass_types, **kwargs)
        self.add_argument(
            "--config", default=argparse.SUPPRESS,
            help=f"A {' / '.join(CONFIG_SUFFIXES)} file of arguments; flags on the command line override it.",
        )

    @property
    def field_names(self) -> set[str]:
        """The names a config file may set: every dataclass field the parser fills."""
        return {action.dest for action in self._actions} - {"help", "config"}

    def set_defaults_with_config(self, values: Mapping[str, Any]) -> None:
        """Make ``values`` the defaults of the parser's options (TRL's method of the same name, on a mapping)."""
        for action in self._actions:
            if action.dest in values:
                action.default = values[action.dest]
                action.required = False

    def given_values(self, args: Iterable[str]) -> dict[str, Any]:
        """The values the flags in ``args`` set, typed, without defaults; other arguments are ignored."""
        saved = [(action, action.default, action.required) for action in self._actions]
        for action, _, _ in saved:
            action.default, action.required = argparse.SUPPRESS, False
        try:
            given, _ = self.parse_known_args([arg for arg in args if arg not in HELP_FLAGS])
        finally:
            for action, default, required in saved:
                action.default, action.required = default, required
        return vars(given)

    def parse_args_and_config(self, args: Iterable[str] | None = None, defaults: Defaults | None = None) -> tuple:
        """The dataclasses filled from ``defaults`` < the ``--config`` file < the flags in ``args`` (default: argv).

        ``defaults`` may be a function: it gets the values the user set (the file's, overridden by the
        flags') and returns the defaults to put under them. An unknown key in the file is a ``ValueError``
        that names it and the accepted fields.
        """
        args = list(sys.argv[1:] if args is None else args)
        path, args = split_config(args)
        config = read_config(path) if path else {}
        self._check_config_keys(path, config)
        if callable(defaults):
            defaults = defaults(config | self.given_values(args))
        self.set_defaults_with_config({**(defaults or {}), **config})
        return self.parse_args_into_dataclasses(args=args)

    def _check_config_keys(self, path: str | None, config: Mapping[str, Any]) -> None:
        accepted = self.field_names
        unknown = sorted(set(config) - accepted)
        if not unknown:
            return
        guesses = [
            f"{match[0]!r} for {name!r}" for name in unknown if (match := difflib.get_close_matches(name, accepted, 1))
        ]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise ValueError(
            f"--config {path}: unknown argument(s) {unknown}{hint}; "
            f"the accepted fields are {', '.join(sorted(accepted))}"
        )
