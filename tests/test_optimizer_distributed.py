"""FlexDeMo on 4 gloo ranks: 2 nodes x 2 processes, plus the degenerate topologies."""

from __future__ import annotations

import math

import pytest
import torch
from launch import run_worker

pytestmark = pytest.mark.multiprocess


def _divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


CASES = [
    "replicas,value_dtype=bfloat16", "replicas,value_dtype=float32",
    "dense_limit,update=sign", "dense_limit,update=sgd", "dense_limit,update=adamw",
    "degenerate,topology=one_node", "degenerate,topology=one_rank_per_node",
    "resume,steps=5,update=sign", "resume,steps=5,update=adamw",
    "drift,action=raise", "drift,action=resync", "nonfinite,action=skip", "nonfinite,action=raise",
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Every case in one 4-rank launch (2 nodes x 2 processes unless the case says otherwise)."""
    args = [a for case in CASES for a in ("--case", case)]
    return run_worker("optimizer_worker", 4, tmp_path_factory.mktemp("optimizer"), *args)


def _case(suite, spec):
    return [rank[spec] for rank in suite]


@pytest.fixture(params=["bfloat16", "float32"])
def replicas_run(request, suite):
    return request.param, _case(suite, f"replicas,value_dtype={request.param}")


def test_replicas_bit_identical_after_training(replicas_run):
    _, ranks = replicas_run
    for a, b in [(0, 2), (1, 3)]:  # same shard index, different nodes
        for name, value in ranks[a]["params"].items():
            assert torch.equal(value, ranks[b]["params"][name]), name
    changed = [n for n, v in ranks[0]["params"].items() if not torch.equal(v, ranks[0]["initial"][n])]
    assert len(changed) == len(ranks[0]["params"])
    assert ranks[0]["losses"] != ranks[2]["losses"]  # the nodes really saw different data
    assert sum(ranks[0]["losses"][-10:]) < sum(ranks[0]["losses"][:10])


def test_comm_bytes_match_formula(replicas_run):
    value_dtype, ranks = replicas_run
    value_bytes = {"bfloat16": 2, "float32": 4}[value_dtype]
    topk, chunk, replicas = 2, 8, 2
    for rank in ranks:
        coefficients, payload, numel = 0, 0, 0
        for shape in rank["local_shapes"]:
            numel += math.prod(shape)
            if not math.prod(shape):
                continue
            rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
            n1, n2 = _divisor(rows, chunk), _divisor(cols, chunk)
            kept = (rows // n1) * (cols // n2) * min(topk, n1 * n2)
            coefficients += kept
            payload += kept * (2 + value_bytes)  # int16 index + value
        stats = rank["comm_stats"]
        assert stats["coefficients"] == coefficients
        assert stats["bytes_sent"] == stats["bytes_received"] == (replicas - 1) * payload
        assert stats["dense_bytes"] == 2 * (replicas - 1) * numel * 4 // replicas
        assert stats["collectives"] == 2  # the bucketed payload + the job-wide non-finite flag


@pytest.mark.parametrize("update", ["sign", "sgd", "adamw"])
def test_no_compression_equals_dense_rule_on_mean_gradient(update, suite):
    ranks = _case(suite, f"dense_limit,update={update}")
    for rank in ranks:
        for got, want, grad in zip(rank["flexdemo"], rank["dense"], rank["grads"][-1]):
            if update == "sign":
                # sign(0 +- rounding) is the only freedom: compare where the mean gradient is not ~0
                clear = grad.abs() > 1e-6
                torch.testing.assert_close(got[clear], want[clear], atol=1e-6, rtol=0)
            else:
                torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("topology", ["one_node", "one_rank_per_node"])
def test_degenerate_topologies_follow_their_definition(topology, suite):
    ranks = _case(suite, f"degenerate,topology={topology}")
    for rank in ranks:
        if topology == "one_node":
            assert rank["bytes_sent"] == 0 and rank["collectives"] == 1  # only the non-finite flag
        else:
            assert rank["bytes_sent"] > 0 and rank["collectives"] == 2
        for got, want, q in zip(rank["flexdemo"], rank["expected"], rank["q"]):
            clear = q.abs() > 1e-7
            torch.testing.assert_close(got.double()[clear], want[clear], atol=1e-6, rtol=0)
        for got, want in zip(rank["delta"], rank["delta_expected"]):
            torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    if topology == "one_rank_per_node":
        for got, want in zip(ranks[0]["flexdemo"], ranks[3]["flexdemo"]):
            assert torch.equal(got, want)


@pytest.mark.parametrize("update", ["sign", "adamw"])
def test_state_dict_round_trip_resumes_exactly(update, suite):
    ranks = _case(suite, f"resume,steps=5,update={update}")
    for rank in ranks:
        assert rank["delta_dtypes"] == {"torch.float32"}
        for name, value in rank["straight"].items():
            assert torch.equal(value, rank["resumed"][name]), name


def test_drift_guard_raises_on_every_rank_with_the_parameter_name(suite):
    for rank in _case(suite, "drift,action=raise"):
        assert rank["step"] == 4  # perturbed before step 3's update, checked at the next check (step 4)
        assert "replicas differ in ['shared.weight']" in rank["error"]


def test_drift_guard_resync_restores_identical_replicas(suite):
    ranks = _case(suite, "drift,action=resync")
    assert all(r["error"] is None and r["step"] == 5 for r in ranks)
    for a, b in [(0, 2), (1, 3)]:
        for name, value in ranks[a]["params"].items():
            assert torch.equal(value, ranks[b]["params"][name]), name


def test_nonfinite_gradient_is_skipped_by_every_rank(suite):
    ranks = _case(suite, "nonfinite,action=skip")
    for rank in ranks:
        assert rank["error"] is None and rank["skipped"] == 1 and rank["unchanged_at_skip"]
        assert rank["deltas_finite"] and all(v.isfinite().all() for v in rank["params"].values())
    for a, b in [(0, 2), (1, 3)]:
        for name, value in ranks[a]["params"].items():
            assert torch.equal(value, ranks[b]["params"][name]), name


def test_nonfinite_gradient_raises_on_every_rank(suite):
    for rank in _case(suite, "nonfinite,action=raise"):
        assert rank["error"] == "FlexDeMo: non-finite gradient on rank(s) [1] (on_nonfinite='raise')."
