"""Hiding the exchange, on 2 nodes x 2 processes: overlap with backward gives bit-identical parameters,
gradient accumulation exchanges once, delayed application resumes exactly, a budget's rate is agreed."""

from __future__ import annotations

import pytest
import torch
from launch import run_worker

NODES = ({0, 1}, {2, 3})
CASES = [
    "equal,replicator=demo", "equal,replicator=random", "equal,replicator=demo,micro=2",
    "accumulate_without_no_sync", "delayed,replicator=demo", "delayed,replicator=random",
    "budget_bytes,replicator=demo,budget=9000", "budget_bytes,replicator=random,budget=3000",
    "budget_bytes_local,budget=500",
    "budget_fraction,replicator=demo,fraction=0.001",
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    args = [a for case in CASES for a in ("--case", case)]
    return run_worker("overlap_worker", 4, tmp_path_factory.mktemp("overlap"), *args, timeout=600)


def _case(suite, spec):
    return [rank[spec] for rank in suite]


def _crossing(collectives):
    return [c for c in collectives if not any(set(c[1]) <= node for node in NODES)]


def _replicas_equal(results):
    for a, b in [(0, 2), (1, 3)]:
        for name, value in results[a]["params"].items():
            assert torch.equal(value, results[b]["params"][name]), name


@pytest.mark.parametrize("spec", ["equal,replicator=demo", "equal,replicator=random", "equal,replicator=demo,micro=2"])
def test_overlap_with_backward_is_bit_identical_and_exchanges_during_backward(suite, spec):
    results = _case(suite, spec)
    _replicas_equal(results)
    for result in results:
        assert result["equal"]  # 20 steps, overlap="backward" vs "none", compared with torch.equal
        assert result["buckets"] > 2
        for log, plain in zip(result["logs"], result["plain_logs"]):
            crossing = _crossing(log["collectives"])
            assert len(crossing) == result["buckets"]  # one per bucket per optimizer step, micro-batches or not
            assert len(_crossing(log["collectives"][: log["in_backward"]])) >= result["buckets"] - 1
            assert len(_crossing(plain["collectives"])) == 1  # overlap="none": one, in step()
            assert not _crossing(plain["collectives"][: plain["in_backward"]])
            assert log["syncs"] == ["item"]
            assert log["comm_stats"]["collectives"] == result["buckets"]


def test_accumulation_that_reduces_every_micro_batch_is_refused(suite):
    for result in _case(suite, "accumulate_without_no_sync"):
        assert result["error"] and "arrived twice before step()" in result["error"]
        assert "set_requires_gradient_sync(False)" in result["error"]


@pytest.mark.parametrize("replicator", ["demo", "random"])
def test_delayed_application_is_one_step_late_and_resumes_exactly(suite, replicator):
    results = _case(suite, f"delayed,replicator={replicator}")
    _replicas_equal(results)
    for result in results:
        assert result["first_step_unchanged"]
        assert result["resumed_equal"]
        assert result["differs_from_synchronous"]
        assert {"pending_delta", "pending_update"} <= set(result["pending_keys"])


@pytest.mark.parametrize("replicator,budget", [("demo", 9000), ("random", 3000)])
def test_byte_budget_picks_the_largest_rate_that_fits(suite, replicator, budget):
    results = _case(suite, f"budget_bytes,replicator={replicator},budget={budget}")
    for a, b in [(0, 2), (1, 3)]:
        assert results[a]["rate"] == results[b]["rate"]  # replicas of a shard agree
    for result in results:
        rate = result["rate"]
        assert 1 / 64 <= rate < 1 / 4
        assert result["sent"] == [result["formula"][rate]] * 3
        assert result["formula"][rate] <= budget
        assert result["formula"][min(rate * 1.05, 1.0)] > budget  # no larger rate fits


def test_byte_budget_with_local_steps_counts_a_round_over_its_steps(suite):
    """At the defaults (a round of 8 steps in 4 fragments), the budget bounds the bytes per step amortised over a
    round, as the logs count them: every other step sends one fragment's exchange, a round's sum fits 8 x the
    budget, and no 5 % larger rate would."""
    results = _case(suite, "budget_bytes_local,budget=500")
    for a, b in [(0, 2), (1, 3)]:
        assert results[a]["rate"] == results[b]["rate"]
    for result in results:
        rate, formula = result["rate"], result["formula"]
        assert (result["local_steps"], result["fragments"]) == (8, 4) and 1 / 64 <= rate < 1 / 4
        fragments = formula[rate]
        # fragment f's round ends after step 2 (f + 1) mod 8: steps 1..8 send nothing, 0, nothing, 1, ..., 3
        assert result["sent"] == [sent for fragment in fragments for sent in (0, fragment)]
        assert sum(fragments) <= 8 * 500 < sum(formula[min(rate * 1.05, 1.0)])


def test_time_budget_rate_is_agreed_and_moves_within_bounds(suite):
    results = _case(suite, "budget_fraction,replicator=demo,fraction=0.001")
    _replicas_equal(results)
    rates = results[0]["rates"]
    assert all(r["rates"] == rates for r in results)  # every rank, every step: the same rate
    assert all(1 / 64 <= r <= 1 / 4 for r in rates)
    assert rates[-1] < rates[0]  # waiting on gloo takes far more than 0.1 % of a step: the rate comes down
    assert all(syncs == ["tolist"] for syncs in results[0]["syncs"])  # flag and fraction in the one sync
