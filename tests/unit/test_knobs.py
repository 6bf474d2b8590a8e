"""One source of knobs: the registry of replicators, FlexDeMo's keywords and policies and FlexDeMoConfig come from
the table in ``hf_flexdemo.knobs``, and the optimizer never branches on a replicator's name."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from hf_flexdemo import FlexDeMo, FlexDeMoConfig, knobs, policies
from hf_flexdemo.wire.replicators import REGISTRY, Replicator


def test_every_replicator_name_has_one_registered_class():
    assert set(REGISTRY) == set(knobs.REPLICATORS)
    for name, cls in REGISTRY.items():
        assert issubclass(cls, Replicator) and cls.name == name
        assert not inspect.isabstract(cls), f"{cls.__name__} leaves {sorted(cls.__abstractmethods__)} abstract"


def test_flexdemo_keywords_and_policies_carry_every_knob_with_its_one_default():
    parameters = inspect.signature(FlexDeMo).parameters
    plain = {name: p.default for name, p in parameters.items() if name in knobs.DEFAULTS}
    assert plain == {k.name: k.default for k in knobs.KNOBS if k.policy is None}
    assert {name: parameters[name].default for name in policies.CLASSES} == dict.fromkeys(policies.CLASSES)
    assert set(parameters) - set(plain) - set(policies.CLASSES) == {"params", "replicate_group", "shard_group",
                                                                    "preset"}
    in_policies = {f.metadata["knob"]: f.default for cls in policies.CLASSES.values() for f in dataclasses.fields(cls)}
    assert {**plain, **in_policies} == knobs.DEFAULTS  # every knob once, with the table's default
    for cls in policies.CLASSES.values():
        for f in dataclasses.fields(cls):
            assert f.metadata["help"] == knobs.HELP[f.metadata["knob"]]


def test_flat_knobs_and_policies_spell_the_same_optimizer():
    import torch

    flat = {"lr": 3e-3, "local_steps": 4, "compression_rate": 0.125, "outer_momentum": 0.9, "drift_check_every": 0,
            "budget_bytes": None}
    keywords = policies.from_knobs(flat)
    assert keywords == {"lr": 3e-3, "local_steps": 4, "compression": policies.CompressionPolicy(rate=0.125),
                        "outer": policies.OuterPolicy(momentum=0.9), "budget": policies.BudgetPolicy(),
                        "guards": policies.GuardPolicy(drift_check_every=0)}
    assert policies.knob_values(keywords) == {**knobs.DEFAULTS, **flat}
    weight = torch.nn.Parameter(torch.zeros(4, 4))
    assert FlexDeMo([weight], **keywords).options == FlexDeMo([weight], lr=3e-3, local_steps=4,
                                                              compression=policies.CompressionPolicy(rate=0.125),
                                                              outer=policies.OuterPolicy(momentum=0.9),
                                                              guards=policies.GuardPolicy(drift_check_every=0)).options
    with pytest.raises(ValueError, match=r"invalid compression=OuterPolicy\(.*accepted: a CompressionPolicy"):
        FlexDeMo([weight], compression=policies.OuterPolicy())


@pytest.mark.parametrize(("given", "field", "default", "fix"), [
    ({"momentum": "lr"}, "momentum", "'adam'", r"only the step-wise mode .* reads it; set local_steps=1"),
    ({"update": "sign"}, "update", "'sgd'", r"only the step-wise mode .* reads it; set local_steps=1"),
    ({"momentum_decay": 0.9}, "momentum_decay", "0.999", r"set local_steps=1"),
    ({"local_steps": 1, "feedback_decay": 0.95}, "feedback_decay", "0.999",
     r"only local steps .* reads it; set local_steps=H > 1"),
])
def test_a_knob_the_mode_does_not_read_is_refused_by_the_table(given, field, default, fix):
    for build in (lambda: FlexDeMoConfig(**given), lambda: knobs.validate({**knobs.DEFAULTS, **given})):
        with pytest.raises(ValueError, match=rf"invalid {field}=.*accepted: {default} \(the default\) with "
                                             rf"local_steps=.*{fix}"):
            build()


def test_config_fields_default_to_the_knobs_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(FlexDeMoConfig)}
    shared = {name: value for name, value in fields.items() if name in knobs.DEFAULTS}
    # lr, weight_decay, betas and eps come from TrainingArguments; every other knob is a config field.
    assert set(knobs.DEFAULTS) - set(shared) == {"lr", "weight_decay", "betas", "eps"}
    assert shared == {name: knobs.DEFAULTS[name] for name in shared}
    assert set(FlexDeMoConfig().optimizer_kwargs()) == set(shared)
    for f in dataclasses.fields(FlexDeMoConfig):
        if f.name in knobs.HELP:
            assert f.metadata["help"] == knobs.HELP[f.name]


def test_knob_kinds_partition_the_defaults():
    assert set(knobs.PER_GROUP) | set(knobs.OPTIMIZER_WIDE) == set(knobs.DEFAULTS)
    assert not set(knobs.PER_GROUP) & set(knobs.OPTIMIZER_WIDE)
    assert set(knobs.HELP) == set(knobs.DEFAULTS)


def test_the_optimizer_does_not_branch_on_a_replicator_name():
    """A new replicator is a new module and a registry line: no string naming one appears in the optimizer."""
    source = Path(inspect.getfile(FlexDeMo)).read_text()
    names = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)}
    assert not names & set(knobs.REPLICATORS), names & set(knobs.REPLICATORS)
    assert "replicator ==" not in source and "replicator !=" not in source


@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("replicator", "ring", "demo | random | full | none"),
    ("compression_rate", 1.5, r"a float in \(0, 1\]"),
    ("value_dtype", "int3", "auto | bfloat16 | float32 | float8"),
    ("compression_transform", "fft", "dct | none"),
    ("on_drift", "ignore", "raise | resync | tolerate"),
    ("drift_tolerance", 0, "a float > 0"),
    ("progress_scale_decay", 1.0, r"None \(the inner AdamW's beta2\) or a float in \(0, 1\)"),
])
def test_one_validation_names_field_value_and_accepted_values(field, value, accepted):
    for build in (lambda: FlexDeMoConfig(**{field: value}), lambda: knobs.validate({field: value})):
        with pytest.raises(ValueError, match=rf"invalid {field}={value!r}; accepted: {accepted}"):
            build()


def test_the_dense_replicator_takes_the_float32_it_sends_and_refuses_a_wire_type():
    assert [knobs.resolve_value_dtype("auto", "full", steps) for steps in (1, 8)] == ["float32"] * 2
    FlexDeMoConfig(replicator="full", value_dtype="float32")
    for value in ("bfloat16", "int2", "float8"):
        with pytest.raises(ValueError, match=rf"invalid value_dtype='{value}'; accepted: 'auto' \| 'float32' with "
                                             r"replicator='full'"):
            FlexDeMoConfig(replicator="full", value_dtype=value)


def test_optimizer_wide_knobs_are_refused_in_a_param_group():
    import torch

    weight = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"param group keys=\['replicator'\].*optimizer-wide"):
        FlexDeMo([{"params": [weight], "replicator": "full"}])


STEP_WISE = {"local_steps": 1, "overlap": "none", "outer_fragments": 1, "outer_delay": 1,  # "auto" and None
             "compression_transform": "dct"}  # resolve so step-wise
PAPER = {**STEP_WISE, "momentum": "lr", "update": "sign", "consensus": "choosers", "value_dtype": "float32",
         "momentum_decay": 0.999}


@pytest.mark.parametrize(("preset", "documented"), [
    ("default", {"local_steps": 8, "value_dtype": "int2", "overlap": "delayed", "outer_fragments": 4,  # resolved
                 "outer_delay": 2, "compression_transform": "none"}),
    ("step-wise", {**STEP_WISE, "value_dtype": "float8"}),  # the defaults before local steps
    ("flexdemo-paper", {**PAPER, "compression_topk": 4, "compression_chunk": 8}),  # 4 of 64: the authors' 1/16
    ("demo-paper", {**PAPER, "compression_topk": 32, "compression_chunk": 64}),  # DeMo's 32 of 64 x 64
])
def test_presets_set_their_documented_knobs_in_the_config_and_the_optimizer(preset, documented):
    import torch

    config = FlexDeMoConfig(flexdemo_preset=preset).for_run(None)  # a run of unknown length, as the optimizer's
    assert config.optimizer_kwargs() == {**FlexDeMoConfig().for_run(None).optimizer_kwargs(), **documented}
    opt = FlexDeMo([torch.nn.Parameter(torch.zeros(4, 4))], preset=preset)
    expected = {**knobs.DEFAULTS, **documented}
    assert {key: opt.param_groups[0][key] for key in knobs.PER_GROUP if key in documented} == {
        key: expected[key] for key in knobs.PER_GROUP if key in documented}
    assert {key: opt.options[key] for key in knobs.OPTIMIZER_WIDE if key in documented} == {
        key: expected[key] for key in knobs.OPTIMIZER_WIDE if key in documented}


def test_a_knob_set_by_the_caller_overrides_the_preset_and_a_bad_name_is_refused():
    import torch

    config = FlexDeMoConfig(flexdemo_preset="demo-paper", update="adamw")
    assert config.update == "adamw" and config.compression_topk == 32
    accepted = r"accepted: default \| step-wise \| flexdemo-paper \| demo-paper"
    with pytest.raises(ValueError, match=rf"invalid flexdemo_preset='paper'; {accepted}"):
        FlexDeMoConfig(flexdemo_preset="paper")
    with pytest.raises(ValueError, match=rf"invalid preset='paper'; {accepted}"):
        FlexDeMo([torch.nn.Parameter(torch.zeros(2))], preset="paper")


def test_one_local_step_alone_is_the_step_wise_preset():
    """``local_steps=1`` brings back every knob of the step-wise mode: the wire and the schedule follow it."""
    assert FlexDeMoConfig(local_steps=1).optimizer_kwargs() == FlexDeMoConfig(
        flexdemo_preset="step-wise").optimizer_kwargs()


@pytest.mark.parametrize(("given", "field", "fix"), [
    ({"overlap": "backward"}, "overlap", "overlap='backward' needs local_steps=1"),
    ({"budget_fraction": 0.1}, "budget_fraction", "a time budget needs local_steps=1"),
])
def test_step_wise_knobs_at_the_default_local_steps_name_the_fix(given, field, fix):
    accepted = rf"accepted:.*local_steps=None.*{fix} \(preset='step-wise'\)"
    with pytest.raises(ValueError, match=rf"invalid {field}=.*{accepted}"):
        FlexDeMoConfig(**given)
    FlexDeMoConfig(**given, flexdemo_preset="step-wise")
