"""The option groups of :class:`~hf_flexdemo.optim.optimizer.FlexDeMo`, as ``fully_shard`` groups its options in
policies.

Each policy is a frozen dataclass built from the knob table (:data:`hf_flexdemo.knobs.KNOBS`): its fields are the
table's knobs of that policy, with their defaults and help. ``FlexDeMo`` takes ``compression``, ``outer``,
``step_rule``, ``budget`` and ``guards``; ``lr``, ``betas``, ``eps``, ``weight_decay``, ``local_steps``, ``overlap`` and
``bucket_cap_mb`` stay plain keywords. ``FlexDeMoConfig`` keeps every knob flat for ``HfArgumentParser``;
:func:`from_knobs` and :func:`knob_values` convert between the two spellings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .knobs import BY_NAME, KNOBS, POLICIES, check


def _policy(name: str, policy: str, doc: str) -> type:
    fields = [(knob.field, knob.type, dataclasses.field(default=knob.default, metadata={"knob": knob.name,
                                                                                       "help": knob.help}))
              for knob in POLICIES[policy]]
    cls = dataclasses.make_dataclass(name, fields, frozen=True, kw_only=True,
                                     namespace={"__doc__": doc, "__module__": __name__})
    return cls


CompressionPolicy = _policy("CompressionPolicy", "compression", "What travels between nodes: the share of each block "
                            "(rate or top-k), the block size and transform, the error feedback, the replicator, its "
                            "consensus and wire type.")
OuterPolicy = _policy("OuterPolicy", "outer", "Local steps (the default mode): how a round's consensus moves the "
                      "anchor, how the exchange streams (delay, fragments), and the error feedback's decay.")
StepRulePolicy = _policy("StepRulePolicy", "step_rule", "The step-wise mode (local_steps=1): how a gradient enters "
                         "the compressed momentum, its decay, and the update from the consensus.")
BudgetPolicy = _policy("BudgetPolicy", "budget", "A byte or time budget instead of a fixed rate, and the rates it may "
                       "choose between.")
GuardPolicy = _policy("GuardPolicy", "guards", "Non-finite gradients, and the check that the replicas stay "
                      "identical.")
CLASSES: dict[str, type] = {"compression": CompressionPolicy, "outer": OuterPolicy, "step_rule": StepRulePolicy,
                            "budget": BudgetPolicy, "guards": GuardPolicy}


def knob_values(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """Every knob's value, flat (``FlexDeMo``'s keywords: plain knobs and policies, the missing ones at their
    defaults). A policy of the wrong type is refused, naming the expected one."""
    values = {knob.name: knob.default for knob in KNOBS}
    for key, value in keywords.items():
        if key in CLASSES:
            if value is None:
                continue
            check(isinstance(value, CLASSES[key]), key, value, f"a {CLASSES[key].__name__}(...) or None")
            values.update({knob.name: getattr(value, knob.field) for knob in POLICIES[key]})
        else:
            check(key in BY_NAME and BY_NAME[key].policy is None, "keyword", key,
                  f"{' | '.join(k.name for k in KNOBS if k.policy is None)} or a policy "
                  f"({' | '.join(CLASSES)})")
            values[key] = value
    return values


def from_knobs(values: Mapping[str, Any]) -> dict[str, Any]:
    """``FlexDeMo``'s keywords for flat knob ``values`` (``FlexDeMoConfig``'s spelling): the knobs of a policy grouped
    into it (the policy's other fields at their defaults), every other keyword (``lr``, ``local_steps``,
    ``replicate_group``, ``preset``) as given, so ``FlexDeMo(params, **from_knobs(values))`` builds the optimizer."""
    keywords = {name: value for name, value in values.items() if name not in BY_NAME or BY_NAME[name].policy is None}
    for policy, members in POLICIES.items():
        given = {knob.field: values[knob.name] for knob in members if knob.name in values}
        if given:
            keywords[policy] = CLASSES[policy](**given)
    return keywords
