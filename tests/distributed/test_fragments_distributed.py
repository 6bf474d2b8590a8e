"""``outer_fragments=F > 1`` on 2 nodes x 2 processes (FSDP2 shards of the tiny T5): every rank splits the parameters
alike; each fragment lands on its own schedule, its parameters bit-identical across replicas at the landing (the
others still apart); the bytes of each step are one fragment's and a whole round's are F = 1's plus F - 1 more
flags; the exact drift check runs on the landed fragment; a resume with a fragment's exchange in flight continues
bit for bit."""

from __future__ import annotations

import pytest
import torch
from launch import run_worker

from hf_flexdemo.wire.replicators import exchange_bytes

LANDINGS = ["landings,local_steps=4,fragments=2,outer_delay=2", "landings,local_steps=4,fragments=4,outer_delay=1"]
CASES = [*LANDINGS, "resume"]
REPLICA_PAIRS = [(0, 2), (1, 3)]  # the same shard on the two nodes


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    args = [a for case in CASES for a in ("--case", case)]
    return run_worker("fragments_worker", 4, tmp_path_factory.mktemp("fragments"), *args, timeout=600)


def _knobs(case: str) -> tuple[int, int, int]:
    given = dict(item.split("=") for item in case.split(",")[1:])
    return int(given["local_steps"]), int(given["fragments"]), int(given["outer_delay"])


def _fragment_at(done: int, every: int, fragments: int) -> int:
    """The fragment whose round ends after ``done`` steps: f's at ``done % H == (f + 1) * H / F % H``."""
    slot = every // fragments
    return next(f for f in range(fragments) if done % every == (f + 1) * slot % every)


@pytest.mark.parametrize("case", LANDINGS)
def test_every_rank_splits_the_parameters_alike_balanced_by_size(suite, case):
    _, fragments, _ = _knobs(case)
    members, numel = suite[0][case]["members"], suite[0][case]["numel"]
    assert all(rank[case]["members"] == members for rank in suite)
    assert len(members) == fragments and all(members)
    assert sorted(n for fragment in members for n in fragment) == sorted(numel)
    loads = [sum(numel[n] for n in fragment) for fragment in members]
    assert max(loads) - min(loads) <= max(numel.values())  # largest first into the least loaded: within one item


@pytest.mark.parametrize("case", LANDINGS)
def test_each_fragment_lands_on_its_schedule_bit_identical_across_replicas(suite, case):
    every, fragments, delay = _knobs(case)
    slot = every // fragments
    members = suite[0][case]["members"]
    dones = range(slot + delay, 3 * every + 1, slot)  # the first launch after slot steps, then one every slot
    expected = [(done, _fragment_at(done - delay, every, fragments)) for done in dones]
    for rank in suite:
        landings = rank[case]["landings"]
        assert [landing["done"] for landing in landings] == [done for done, _ in expected]
        for landing, (_, fragment) in zip(landings, expected):
            nonempty = {n for n in members[fragment] if all(rank[case]["local_shapes"][n])}
            assert set(landing["restarted"]) == nonempty and nonempty
    for a, b in REPLICA_PAIRS:
        for mine, theirs in zip(suite[a][case]["landings"], suite[b][case]["landings"]):
            for name, shard in mine["restarted"].items():
                assert torch.equal(shard, theirs["restarted"][name]), (mine["done"], name)
            # the fragments that did not land are where each node's own data took them: apart
            assert any(not torch.equal(shard, theirs["others"][name]) for name, shard in mine["others"].items())


def _payload(result: dict, names: list[str]) -> int:
    """``exchange_bytes`` of the local shards of ``names`` (demo, int2, 1/4 of 8 x 8 blocks)."""
    return exchange_bytes("demo", [result["local_shapes"][n] for n in names], result["replicas"], rate=0.25,
                          topk=None, chunk=8, value_dtype="int2")


@pytest.mark.parametrize("case", LANDINGS)
def test_each_step_sends_one_fragment_and_a_round_sends_the_whole_model_once(suite, case):
    every, fragments, _ = _knobs(case)
    slot = every // fragments
    for rank in suite:
        result = rank[case]
        replicas = result["replicas"]
        assert replicas == 2
        for step, stats in enumerate(result["comm_stats"]):
            done = step + 1
            sends = done % slot == 0
            want = _payload(result, result["members"][_fragment_at(done, every, fragments)]) if sends else 0
            assert stats["bytes_sent"] == stats["bytes_received"] == want, (done, stats)
            assert stats["collectives"] == int(sends)
        whole = _payload(result, list(result["local_shapes"]))  # F = 1's exchange: every parameter, one flag
        for start in range(0, len(result["comm_stats"]), every):
            sent = sum(stats["bytes_sent"] for stats in result["comm_stats"][start:start + every])
            assert sent == whole + (fragments - 1) * (replicas - 1) > 0


def test_resume_with_a_fragment_in_flight_continues_bit_identically_and_drift_checks_the_landed_fragment(suite):
    members = suite[0]["resume"]["members"]
    for rank in suite:
        result = rank["resume"]
        assert result["equal"]
        assert result["options"]["outer_fragments"] == 2 and result["options"]["outer_delay"] == 2
        assert result["in_flight"] == members[1]  # saved after 5 steps: fragment 1's round ended after step 4
        # H = 4, F = 2, tau = 2: fragment 0 lands in steps 4, 8, 12, fragment 1 in 6, 10; step 1 checks everything
        assert result["checks"] == [(1, None), (4, members[0]), (6, members[1]), (8, members[0]), (10, members[1]),
                                    (12, members[0])]
