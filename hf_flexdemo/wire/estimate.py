"""What the exchange costs a node, from the byte formulas alone: bits per parameter per step, and the link it needs.

Bits per parameter per step are the figure that carries over between models: a node's inter-node bits per optimizer
step over the model's parameter count. With local steps, a round's payload (one exchange per fragment) is spread over
its ``local_steps`` steps; each fragment's exchange must arrive within ``outer_delay`` steps, so the link that hides it
behind compute carries one fragment's payload in ``outer_delay`` step times (the peak), while the link's mean load is
the round's payload over ``local_steps`` steps. An all-gather (``replicator="demo"``) puts ``R - 1`` payloads on each
node's link in each direction, so both grow with the number of nodes ``R``.

The payload is computed for the knobs' resolved defaults (or the given knobs; ``local_steps=None`` for a run of
``max_steps`` steps on the model's parameters: a short run's rounds of 4 send twice a long run's bits, a long run's
rounds of 16 on a large model half) on square ``side x side`` matrices,
which is what a transformer's weights are to within their block layout; measured bytes equal the same formulas
(``flexdemo/bits_per_param_sent`` in a run's logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import knobs
from .replicators import REGISTRY, ShardTotals


@dataclass(frozen=True)
class LinkEstimate:
    """A node's traffic for ``parameters`` at ``step_seconds`` per step on ``nodes`` nodes: bits per parameter per
    step sent (= received, for an all-gather), the link's mean load and the link that hides each exchange behind
    compute (Mbit/s, each direction)."""

    parameters: float
    step_seconds: float
    nodes: int
    bits_per_param: float
    mean_mbits: float
    needed_mbits: float

    def describe(self) -> str:
        size = f"{self.parameters / 1e9:g} B" if self.parameters >= 1e9 else f"{self.parameters / 1e6:g} M"
        return (f"a {size}-parameter model at {self.step_seconds:g} s per step on {self.nodes} nodes: "
                f"{self.bits_per_param:.3g} bits per parameter per step sent and received per node; the link carries "
                f"{self.mean_mbits:,.0f} Mbit/s on average and hides the exchange behind compute from "
                f"{self.needed_mbits:,.0f} Mbit/s per direction")


def resolved(overrides: dict[str, Any] | None = None, max_steps: int | None = None,
             parameters: float | None = None) -> dict[str, Any]:
    """The knobs in force for a run of ``max_steps`` steps on ``parameters`` parameters (each ``None``: not known):
    the defaults with ``overrides``, validated and resolved (``"auto"``, ``None``)."""
    values = {**knobs.DEFAULTS, **(overrides or {})}
    knobs.validate(values)
    return knobs.resolve(knobs.with_default_rate(values), max_steps, parameters)


def payload_bits_per_param(nodes: int, overrides: dict[str, Any] | None = None, *, side: int = 4096,
                           max_steps: int | None = None, parameters: float | None = None) -> tuple[float, float]:
    """A node's bits per parameter per step, and per parameter per exchange of one fragment, sent (and received)
    over ``nodes`` nodes at the knobs in force for a run of ``max_steps`` steps on ``parameters`` parameters."""
    if nodes < 2:
        return 0.0, 0.0
    values = resolved(overrides, max_steps, parameters)
    totals = ShardTotals.of([(side, side)], rate=values["compression_rate"], topk=values["compression_topk"],
                            chunk=values["compression_chunk"], value_dtype=values["value_dtype"])
    exchange = REGISTRY[values["replicator"]].step_bytes(totals, nodes, value_dtype=values["value_dtype"],
                                                        timing=False) * 8 / (side * side)
    fragments = values["outer_fragments"]
    per_step = exchange / values["local_steps"]  # a round: every fragment's share once, over local_steps steps
    return per_step, exchange / fragments


def link_estimate(parameters: float, step_seconds: float, nodes: int, overrides: dict[str, Any] | None = None, *,
                  max_steps: int | None = None) -> LinkEstimate:
    """The link a node needs for ``parameters`` at ``step_seconds`` per step on ``nodes`` nodes (see the module
    docstring); ``overrides``: knobs other than the defaults, by their flat names; ``max_steps``: the run's length
    (``None``: not known, a long run's rounds of 8 whatever the model's size)."""
    per_step, per_fragment = payload_bits_per_param(nodes, overrides, max_steps=max_steps, parameters=parameters)
    values = resolved(overrides, max_steps, parameters)
    window = step_seconds * (values["outer_delay"] if values["local_steps"] > 1 else 1)
    return LinkEstimate(parameters, step_seconds, nodes, per_step, per_step * parameters / step_seconds / 1e6,
                        per_fragment * parameters / window / 1e6)
