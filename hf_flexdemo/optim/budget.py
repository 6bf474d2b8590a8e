"""Bandwidth budget: the compression rate chosen from a byte budget or from measured step times.

A user on a slow link may state what the exchange may cost instead of a rate: inter-node bytes per
step (``budget_bytes``) or the fraction of the step time the exchange may keep the step waiting
(``budget_fraction``). The rate then moves inside ``[budget_min_rate, budget_max_rate]``.

Every replica must use the same rate at every step, or their payloads would not line up. Both rules
therefore work from numbers every replica has:

* a byte budget depends on the local shard shapes only, which are the same on every replica of a
  shard, so :func:`rate_for_bytes` is solved once and never changes;
* a time budget uses measured seconds, which differ between ranks. Each rank's measured fraction
  travels in its payload (4 bytes), the mean over the replicate group is taken from the gathered
  payload and the maximum over the node from the step's non-finite all-reduce; :func:`next_rate`
  turns that agreed number into the next step's rate on every rank alike.
"""

from __future__ import annotations

from collections.abc import Callable

# The rate moves at most by this factor per step: a noisy measurement cannot swing it.
MAX_STEP_FACTOR = 2.0


def rate_for_bytes(bytes_at: Callable[[float], int], budget: int, low: float, high: float) -> float:
    """The largest rate in ``[low, high]`` whose payload ``bytes_at(rate)`` fits ``budget``.

    ``bytes_at`` is non-decreasing in the rate (kept counts are rounded per block). Raises ``ValueError``
    when even ``low`` does not fit, naming both knobs.
    """
    if bytes_at(high) <= budget:
        return high
    least = bytes_at(low)
    if least > budget:
        raise ValueError(f"FlexDeMo: invalid budget_bytes={budget}; the lowest rate (budget_min_rate={low:g}) "
                         f"already sends {least} bytes per step on this rank. Accepted: budget_bytes >= {least}, "
                         "or a lower budget_min_rate.")
    for _ in range(40):  # bisection to ~1e-12 of the interval: exact for any block size in practice
        middle = (low + high) / 2
        low, high = (middle, high) if bytes_at(middle) <= budget else (low, middle)
    return low


def next_rate(rate: float, measured: float, target: float, low: float, high: float) -> float:
    """The rate for the next step, from the agreed measured fraction of the step spent waiting on the exchange.

    Multiplicative control with half the gain: the waited time is about proportional to the payload, so
    ``target / measured`` would be the full correction, but the measurement arrives a step late (two with
    ``overlap="delayed"``), and full corrections on late measurements oscillate; the rate therefore scales by
    ``sqrt(target / measured)``, bounded by :data:`MAX_STEP_FACTOR` per step and by ``[low, high]``. A
    negative ``measured`` (nothing measured yet) keeps the rate.
    """
    if measured < 0:
        return rate
    factor = (target / measured) ** 0.5 if measured > 0 else MAX_STEP_FACTOR
    factor = min(max(factor, 1 / MAX_STEP_FACTOR), MAX_STEP_FACTOR)
    return min(max(rate * factor, low), high)
