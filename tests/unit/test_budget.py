"""The bandwidth budget's rules: the byte budget's largest fitting rate, the time budget's bounded control."""

import pytest

from hf_flexdemo.optim.budget import MAX_STEP_FACTOR, next_rate, rate_for_bytes
from hf_flexdemo.wire.compression import kept_per_block


def _bytes(rate: float, blocks: int = 1000, block: int = 64) -> int:
    return blocks * kept_per_block(block, rate, None) * 4  # rounded per block, as the payload is


@pytest.mark.parametrize("budget", [4_000, 20_000, 33_000, 64_000])
def test_byte_budget_gives_the_largest_rate_that_fits(budget):
    rate = rate_for_bytes(_bytes, budget, 1 / 64, 1 / 2)
    assert _bytes(rate) <= budget
    assert rate == 1 / 2 or _bytes(rate * 1.001) > budget


def test_byte_budget_below_the_lowest_rate_names_the_fix():
    message = r"budget_bytes=100;.*budget_min_rate=0.015625.*4000 bytes.*budget_bytes >= 4000"
    with pytest.raises(ValueError, match=message):
        rate_for_bytes(_bytes, 100, 1 / 64, 1 / 2)


def test_time_budget_moves_towards_the_target_within_bounds():
    # half the gain: twice the target waited moves the rate by 1/sqrt(2), not 1/2
    assert next_rate(0.125, measured=0.2, target=0.1, low=1 / 64, high=1 / 4) == pytest.approx(0.125 / 2**0.5)
    assert next_rate(0.125, measured=0.025, target=0.1, low=1 / 64, high=1 / 4) == pytest.approx(0.25)
    assert next_rate(0.125, measured=0.0, target=0.1, low=1 / 64, high=1 / 2) == 0.125 * MAX_STEP_FACTOR
    assert next_rate(0.125, measured=10.0, target=0.1, low=1 / 64, high=1 / 4) == 0.125 / MAX_STEP_FACTOR
    assert next_rate(1 / 64, measured=1.0, target=0.1, low=1 / 64, high=1 / 4) == 1 / 64
    assert next_rate(0.125, measured=-1.0, target=0.1, low=1 / 64, high=1 / 4) == 0.125  # nothing measured yet
