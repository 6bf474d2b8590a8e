"""``ConfigArgumentParser``: ``HfArgumentParser`` with a ``--config`` file, as TRL's ``TrlParser``.

``parse_args_and_config()`` fills the dataclasses from, lowest first: the fields' defaults, the
caller's ``defaults`` (a mapping, or a function of what the user set), the ``--config`` file (JSON or
YAML, a mapping of field names to values) and the command-line flags. As in the Hugging Face
examples, a lone leading ``.json`` / ``.yaml`` argument is read as the config file too.

``--help`` lists each dataclass's flags under its own heading, each with one default: the one its help
text states, else argparse's. ``bad_input_exits()`` turns a script's input errors into one
``error: <message>`` line per job.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn, TypeVar, get_type_hints

import yaml
from transformers import HfArgumentParser

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
HELP_FLAGS = ("-h", "--help")
# An unknown key's error lists the accepted fields up to this many; beyond, it points to --help.
LISTED_FIELDS = 20
# A help text that already says what its field defaults to, e.g. "(default: en)", "None (the default): ...",
# "Defaults to 'loss'", "default 0.25 unless ...": argparse's "(default: ...)" would be a second, often other, one.
STATED_DEFAULT = re.compile(r"\(default\b|\(the default\)|\bdefaults? to\b|\bdefault:|\bdefault \d", re.IGNORECASE)
# Set to 1 for the traceback of a bad-input error (on every rank) instead of bad_input_exits()'s one line.
TRACEBACK_ENV = "HF_FLEXDEMO_TRACEBACK"
BAD_INPUT = (ValueError, TypeError, argparse.ArgumentError)
# How long a rank other than 0 waits, after a bad-input error, for rank 0 to report the same error and the launcher
# to end the job, before it reports the error itself (an error rank 0 did not have).
REPORT_WAIT_S = 30.0

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


class OneDefaultHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``HfArgumentParser``'s formatter, which appends ``(default: ...)`` to every help text, except to those that
    already state their default (:data:`STATED_DEFAULT`): a field whose default ``None`` means "decided later"
    (``source_lang``: ``en`` unless a data preset says otherwise) states the value it ends up with."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and STATED_DEFAULT.search(action.help):
            return action.help
        return super()._get_help_string(action)


def _group_title(dtype: type) -> str:
    return getattr(dtype, "_argument_group_name", None) or dtype.__name__


class ConfigArgumentParser(HfArgumentParser):
    """An ``HfArgumentParser`` whose ``parse_args_and_config`` also reads ``--config file.yaml``.

    ``group_titles`` names the ``--help`` heading of a dataclass's flags (default: its ``_argument_group_name``,
    ``HfArgumentParser``'s attribute, else its class name). With ``exit_on_error=False`` every argparse error
    (a bad choice or type, an ambiguous abbreviation) is an ``argparse.ArgumentError`` instead of a usage
    message and exit, so that :func:`bad_input_exits` reports it once per job.

    >>> parser = ConfigArgumentParser((ModelArguments, Seq2SeqTrainingArguments))
    >>> model_args, training_args = parser.parse_args_and_config()
    """

    def __init__(self, dataclass_types: Any, group_titles: Mapping[type, str] | None = None, **kwargs: Any) -> None:
        self.group_titles = dict(group_titles or {})  # read by _add_dataclass_arguments, from super().__init__
        kwargs.setdefault("formatter_class", OneDefaultHelpFormatter)
        super().__init__(dataclass_types, **kwargs)
        self.add_argument(
            "--config", default=argparse.SUPPRESS,
            help=f"A {' / '.join(CONFIG_SUFFIXES)} file of arguments; flags on the command line override it.",
        )

    def _add_dataclass_arguments(self, dtype: type) -> None:
        """As ``HfArgumentParser``'s, with every dataclass's flags in an argument group of their own."""
        group = self.add_argument_group(self.group_titles.get(dtype) or _group_title(dtype))
        hints = get_type_hints(dtype)
        for field in dataclasses.fields(dtype):
            if field.init:
                field.type = hints[field.name]
                self._parse_dataclass_field(group, field)

    def error(self, message: str) -> NoReturn:
        if self.exit_on_error:
            super().error(message)
        raise argparse.ArgumentError(None, message)

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
        *parsed, unused = self.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
        self._check_unused(unused)
        return tuple(parsed)

    def _check_unused(self, unused: list[str]) -> None:
        """Refuse what no flag took, naming the closest flags."""
        if not unused:
            return
        flags = [option for action in self._actions for option in action.option_strings if option.startswith("--")]
        guesses = [f"{match[0]!r} for {arg!r}" for arg in unused if arg.startswith("-")
                   and (match := difflib.get_close_matches(arg.split("=", 1)[0], flags, 1))]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise ValueError(f"unrecognized argument(s) {unused}{hint}; --help lists the accepted flags")

    def _check_config_keys(self, path: str | None, config: Mapping[str, Any]) -> None:
        accepted = self.field_names
        unknown = sorted(set(config) - accepted)
        if not unknown:
            return
        guesses = [
            f"{match[0]!r} for {name!r}" for name in unknown if (match := difflib.get_close_matches(name, accepted, 1))
        ]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        listed = (f"the accepted fields are {', '.join(sorted(accepted))}" if len(accepted) <= LISTED_FIELDS
                  else f"the {len(accepted)} accepted fields are the flags --help lists, without their '--'")
        raise ValueError(f"--config {path}: unknown argument(s) {unknown}{hint}; {listed}")


def _rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


@contextlib.contextmanager
def bad_input_exits(status: int = 2) -> Iterator[None]:
    """Report bad input (``ValueError``, ``TypeError``, ``argparse.ArgumentError``) as one ``error: <message>`` line
    per job on stderr and exit with ``status``; any other exception propagates with its traceback.

    Every rank runs the same checks on the same arguments and data, so rank 0 (``RANK``) speaks for the job. The
    launcher (torchrun, ``accelerate launch``) ends every rank once one exits, so a rank exiting first could end rank
    0 before it reports: the other ranks wait instead (:data:`REPORT_WAIT_S`) for rank 0 to report and exit, and
    report the error themselves, naming their rank, only if still running then (an error rank 0 did not have).
    ``HF_FLEXDEMO_TRACEBACK=1`` re-raises instead, with the traceback on every rank.
    """
    try:
        yield
    except BAD_INPUT as err:
        if os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
            raise
        rank = _rank()
        if rank != 0:
            time.sleep(REPORT_WAIT_S)
        print(f"error{f' (rank {rank})' if rank else ''}: {err}", file=sys.stderr, flush=True)
        _destroy_process_group()
        sys.exit(status)


def _destroy_process_group() -> None:
    """Leave no process group alive at exit: gloo's teardown during interpreter shutdown can abort the process."""
    if "torch" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
