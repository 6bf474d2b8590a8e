"""GPU-cluster habits of ``FlexDeMo.step()``, checked on CPU: one collective crosses nodes per step, one
host sync per step, the counters equal their formulas, resume keeps the drift schedule, empty shards."""

from __future__ import annotations

import pytest
import torch
from launch import run_worker

from hf_flexdemo.wire.replicators import exchange_bytes

REPLICATORS = ("demo", "random", "full")
CASES = [
    *(f"habits,replicator={r},update={u}" for r in REPLICATORS for u in ("sign", "sgd", "rmsprop")),
    *(f"bytes,replicator={r},topology={t}" for r in REPLICATORS for t in ("2x2", "1x4")),
    "resume_drift,replicator=demo", "resume_drift,replicator=random", "empty_rank,replicator=demo",
    "empty_rank,replicator=random",
]
NODES = ({0, 1}, {2, 3})  # 2 nodes x 2 processes, node-major
# the payload all-gather's name: torch 2.13 deprecates all_gather_into_tensor for all_gather_single
GATHER = "all_gather_single" if hasattr(torch.distributed, "all_gather_single") else "all_gather_into_tensor"


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    args = [a for case in CASES for a in ("--case", case)]
    return run_worker("habits_worker", 4, tmp_path_factory.mktemp("habits"), *args, timeout=600)


def _case(suite, spec):
    return [rank[spec] for rank in suite]


def _crosses_nodes(ranks: tuple[int, ...]) -> bool:
    return not any(set(ranks) <= node for node in NODES)


@pytest.mark.parametrize("replicator", REPLICATORS)
@pytest.mark.parametrize("update", ["sign", "sgd", "rmsprop"])
def test_one_cross_node_collective_and_one_host_sync_per_step(suite, replicator, update):
    for rank, result in enumerate(_case(suite, f"habits,replicator={replicator},update={update}")):
        for log in result["logs"]:
            crossing = [c for c in log["collectives"] if _crosses_nodes(c[1])]
            local = [c for c in log["collectives"] if not _crosses_nodes(c[1])]
            expected = GATHER if replicator == "demo" else "all_reduce"
            assert [name for name, _ in crossing] == [expected], log["collectives"]
            assert len(crossing[0][1]) == 2 and rank in crossing[0][1]  # the replicate group only, never all ranks
            assert local == [("all_reduce", tuple(sorted(next(n for n in NODES if rank in n))))]  # the flag
            assert log["syncs"] == ["item"], log["syncs"]  # the skip decision; AdamW's host-side step counters aside


@pytest.mark.parametrize("replicator", REPLICATORS)
def test_replicas_stay_bit_identical(suite, replicator):
    ranks = _case(suite, f"habits,replicator={replicator},update=sign")
    for a, b in [(0, 2), (1, 3)]:
        for name, value in ranks[a]["params"].items():
            assert torch.equal(value, ranks[b]["params"][name]), name


@pytest.mark.parametrize("replicator", REPLICATORS)
@pytest.mark.parametrize("topology", ["2x2", "1x4"])
def test_bytes_equal_the_formula(suite, replicator, topology):
    """R = 2 (2 nodes x 2) and R = 4 (4 nodes x 1): the counters against ``exchange_bytes``."""
    for result in _case(suite, f"bytes,replicator={replicator},topology={topology}"):
        stats, replicas = result["comm_stats"], result["replicas"]
        assert replicas == {"2x2": 2, "1x4": 4}[topology]
        assert result["value_dtype"] == {"demo": "float8", "full": "float32"}.get(replicator, "bfloat16")  # "auto"
        expected = exchange_bytes(replicator, result["local_shapes"], replicas, rate=0.25, topk=None, chunk=8,
                                  value_dtype=result["value_dtype"])
        assert stats["bytes_sent"] == stats["bytes_received"] == expected > 0
        assert stats["collectives"] == 1 and stats["node_collectives"] == (1 if topology == "2x2" else 0)


@pytest.mark.parametrize("replicator", ["demo", "random"])
def test_state_dict_alone_resumes_knobs_counters_and_drift_schedule(suite, replicator):
    for result in _case(suite, f"resume_drift,replicator={replicator}"):
        assert result["straight_checks"] == [0, 3, 6]
        assert result["resumed_checks"] == [6]  # the fresh optimizer was built with other knobs: state_dict wins
        assert result["knobs"]["lr"] == 3e-3 and result["knobs"]["drift_check_every"] == 3
        assert result["knobs"]["replicator"] == replicator
        assert result["equal"]


@pytest.mark.parametrize("replicator", ["demo", "random"])
def test_rank_with_only_empty_shards_joins_every_collective(suite, replicator):
    ranks = _case(suite, f"empty_rank,replicator={replicator}")
    assert [r["local_numel"] for r in ranks] == [6, 0, 6, 0]
    assert all(r["collectives"] == 1 for r in ranks)
    assert torch.equal(ranks[0]["params"][0], ranks[2]["params"][0])
