"""Write docs/configuration.md from the one definition of the knobs: ``hf_flexdemo.knobs.KNOBS`` (and the presets),
the policies built from it, and ``FlexDeMoConfig``'s own fields (their types, defaults and help).

    python docs/generate_configuration.py           # rewrite docs/configuration.md
    python docs/generate_configuration.py --check   # exit 1 if it is stale (tests/unit/test_docs.py does the same)

Only the grouping and the order below are written here; every default, accepted value and help text is read from
the package, so a changed knob changes the page the next time this runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from hf_flexdemo import knobs, policies
from hf_flexdemo.trainer.config import FlexDeMoConfig

OUT = Path(__file__).resolve().parent / "configuration.md"

# (title, what the group is for, its knobs in order). The few that matter come first, then the constructor's policies
# in the table's order (hf_flexdemo.policies); a knob or config field missing here lands in the last group, so a new
# one is never left out.
MATTER = ("method", "local_steps", "compression_rate", "flexdemo_preset", "resume_policy")
POLICY_TITLES = {"outer": "Local steps (the default mode, `local_steps > 1`): `OuterPolicy`",
                 "compression": "What travels between nodes: `CompressionPolicy`",
                 "step_rule": "The step-wise mode (`local_steps=1`): `StepRulePolicy`",
                 "budget": "A byte or time budget instead of a fixed rate: `BudgetPolicy`",
                 "guards": "Guards: `GuardPolicy`"}


def _policy_group(policy: str) -> tuple[str, str, tuple[str, ...]]:
    doc = " ".join(policies.CLASSES[policy].__doc__.split())
    return POLICY_TITLES[policy], doc, tuple(k.name for k in knobs.POLICIES[policy] if k.name not in MATTER)


GROUPS: list[tuple[str, str, tuple[str, ...]]] = [
    ("The knobs that matter",
     "Most runs set none of these, or one; README \"The knobs that matter\" says when to touch each.", MATTER),
    *(_policy_group(policy) for policy in POLICY_TITLES),
    ("When the exchange runs", "Keywords of `FlexDeMo` itself, in both modes.", ("overlap", "bucket_cap_mb")),
    ("The trainer's setup", "Fields of `FlexDeMoConfig` that are not optimizer knobs.", ("shard_size", "reduce_dtype")),
    ("From `TrainingArguments`",
     "`FlexDeMoTrainer` passes `TrainingArguments`' values (and their defaults) for these; the defaults below are "
     "`FlexDeMo`'s, for a torch loop.",
     ("lr", "weight_decay", "betas", "eps")),
]
OTHERS = ("Other knobs", "")
# The optimizer keywords FlexDeMoTrainer fills from TrainingArguments (FlexDeMoTrainer.create_optimizer; weight
# decay goes through Trainer's parameter groups, biases and norms without it).
TRAINING_ARGUMENTS = {"lr": "--learning_rate", "weight_decay": "--weight_decay",
                      "betas": "--adam_beta1, --adam_beta2", "eps": "--adam_epsilon"}


def _value(value: Any) -> str:
    """A default as a reader writes it: a rate of 1/64 rather than 0.015625."""
    if isinstance(value, float) and value not in (0.0, 1.0):
        fraction = Fraction(value).limit_denominator(1024)
        power_of_two = fraction.denominator & (fraction.denominator - 1) == 0
        if fraction.numerator == 1 and power_of_two and float(fraction) == value:
            return f"`{fraction}`"
    if isinstance(value, tuple):
        return "`(" + ", ".join(repr(v) for v in value) + ")`"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _accepted(annotation: Any) -> str:
    """The accepted values of a field's type: a Literal's choices, else the type's name."""
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return " \\| ".join(_accepted(a) for a in args)
    if annotation is type(None):
        return "`None`"
    if get_origin(annotation) is tuple:
        return "a pair of floats"
    return {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}.get(annotation,
                                                                                          str(annotation))


def _where(name: str) -> str:
    """How a knob is set in FlexDeMo: a keyword, or a policy's field."""
    knob = knobs.BY_NAME[name]
    if knob.policy is None:
        return f"`FlexDeMo({name}=...)`"
    return f"`FlexDeMo({knob.policy}={policies.CLASSES[knob.policy].__name__}({knob.field}=...))`"


def _entries() -> dict[str, dict[str, str]]:
    """Every knob and every FlexDeMoConfig field: default, accepted values, value in force at the defaults, where
    it is set, and its help text."""
    fields = {f.name: f for f in dataclasses.fields(FlexDeMoConfig)}
    hints = typing.get_type_hints(FlexDeMoConfig)
    in_force = knobs.with_default_rate(dataclasses.asdict(FlexDeMoConfig()))  # the defaults, "auto" and None resolved
    entries: dict[str, dict[str, str]] = {}
    for name in [*fields, *(key for key in knobs.DEFAULTS if key not in fields)]:
        if name in knobs.BY_NAME:
            knob = knobs.BY_NAME[name]
            default, help_text = knob.default, knob.help
            kind = ("per parameter group" if knob.per_group else "optimizer-wide") + (
                "" if len(knob.modes) > 1 else f" · {'local steps' if knob.modes == ('local',) else 'step-wise'} only")
            accepted = _accepted(knob.type) if knob.choices or not knob.accepted else knob.accepted
        else:
            field = fields[name]
            default, help_text, kind = field.default, field.metadata.get("help", ""), "trainer setup"
            accepted = _accepted(hints[name])
        if name in fields:
            where = f"`--{name}`, `FlexDeMoConfig({name}=...)`"
            if name in knobs.BY_NAME:
                where += ", " + _where(name)
        else:
            where = f"`{TRAINING_ARGUMENTS[name]}` (`TrainingArguments`), {_where(name)}"
        facts = [f"default {_value(default)}"]
        if name in in_force and in_force[name] != default:
            facts.append(f"in force at the defaults: {_value(in_force[name])}")
        facts += [f"accepted: {accepted}", kind]
        entries[name] = {"facts": " · ".join(facts), "where": where, "help": help_text}
    return entries


def _presets() -> list[str]:
    lines = ["| preset | sets (on the knobs left at their default) |", "|---|---|"]
    for name, values in knobs.PRESETS.items():
        sets = ", ".join(f"`{key}={value!r}`" for key, value in values.items()) or "nothing: the defaults"
        lines.append(f"| `{name}` | {sets} |")
    return lines


def render() -> str:
    entries = _entries()
    grouped = {name for _, _, names in GROUPS for name in names}
    groups = [*GROUPS, (*OTHERS, tuple(name for name in entries if name not in grouped))]
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by docs/generate_configuration.py from the knob table (hf_flexdemo/knobs.py) and "
        "hf_flexdemo/trainer/config.py; "
        "edit those, then run `make docs`. -->",
        "",
        "Every FlexDeMo knob and every `FlexDeMoConfig` field, with its default, the values it accepts and what it "
        "does, the few that matter first. The same definitions give `FlexDeMo`'s keyword defaults, "
        "`FlexDeMoConfig`'s fields and the recipes' `--help`, and one validation refuses a bad value with a "
        "`ValueError` naming the field, the value and what is accepted, before anything is built.",
        "",
        "* **In a script**: `FlexDeMoTrainer(..., flexdemo_config=FlexDeMoConfig(local_steps=4))`, or a dict "
        "(`flexdemo_config={\"local_steps\": 4}`).",
        "* **On the command line** (the recipes, or any `HfArgumentParser` script that includes `FlexDeMoConfig`): "
        "`--local_steps 4`; in a `--config run.yaml`, `local_steps: 4`.",
        "* **In a torch loop**: `FlexDeMo(params, lr=..., local_steps=4, compression=CompressionPolicy(rate=1/8))`: "
        "`lr`, `betas`, `eps`, `weight_decay`, `local_steps`, `overlap` and `bucket_cap_mb` are keywords, the other "
        "knobs fields of a policy (`from hf_flexdemo import CompressionPolicy, ...`; "
        "`hf_flexdemo.policies.from_knobs` turns the flat names into these keywords). Per-parameter-group knobs "
        "may differ between `param_groups`, under their flat names; optimizer-wide knobs hold for the whole "
        "optimizer (every group shares one exchange) and live, flat, in `FlexDeMo.options`. `FlexDeMo` also takes "
        "`replicate_group` (the process group of "
        "the replicas on other nodes; `None` on one node), `shard_group` (this node's ranks; by default the "
        "parameters' device mesh) and `preset` (the names below).",
        "",
        "\"In force at the defaults\" is what a knob left to the package (`\"auto\"`, `None`) resolves to with "
        "every other knob at its default; the optimizer's `options`, the config's fields and the model card record "
        "the resolved values. Why each default is what it is: [how-it-works.md](how-it-works.md#why-the-defaults); "
        "the measurements: [results.md](results.md).",
        "",
        "## Presets",
        "",
        "`flexdemo_preset` (`FlexDeMoConfig`, `--flexdemo_preset`) and `FlexDeMo(preset=...)` take the same names. "
        "(The recipes' `--data_preset` is another thing: it names a data set.)",
        "",
        *_presets(),
        "",
        knobs.PRESET_HELP,
    ]
    for title, about, names in groups:
        if not names:
            continue
        lines += ["", f"## {title}", ""]
        if about:
            lines += [about, ""]
        for name in names:
            entry = entries[name]
            lines += [f"### `{name}`", "", f"{entry['facts']}. Set with {entry['where']}.", "", entry["help"], ""]
        lines.pop()
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
    text = render()
    if parser.parse_args().check:
        stale = not OUT.exists() or OUT.read_text() != text
        if stale:
            print(f"{OUT} is stale: run python docs/generate_configuration.py", file=sys.stderr)
        return int(stale)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
