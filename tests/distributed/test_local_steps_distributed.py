"""``local_steps=H`` on 2 nodes x 2 processes (FSDP2 shards): periodic averaging against float64, replicas
bit-identical after every exchange, nothing crosses nodes in an inner step, the bytes of the formula on exchange
steps only, and a resume in the middle of a round. The same at R = 2, 4 and 8 nodes (8 ranks as 2 x 4, 4 x 2 and
8 x 1) with positions as packed indices (rate 1/16 of 8 x 8: 4 indices of 6 bits, 3 bytes, against the bitmask's
8). ``replicator="leader"`` (one all-reduce of codes) and ``replicator="owner"`` (one all-to-all to the blocks'
owners, the bytes of each rank its own) at R = 2, 4 and 8 the same way."""

from __future__ import annotations

import math

import pytest
import torch
from launch import run_worker
from test_step_habits import GATHER

from hf_flexdemo.wire import compression
from hf_flexdemo.wire.dct import BlockLayout
from hf_flexdemo.wire.replicators import exchange_bytes

LEADER = ",replicator=leader"  # the exchange whose received bytes are flat in R: one all-reduce of codes
OWNER = ",replicator=owner"  # flat in R with each node's own top-k: one all-to-all to the blocks' owners
SCALED = ",progress_scale=batch"  # each node's progress lengthened to the nodes' batch
OWN_MEMORY = f"{SCALED},progress_scale_decay=0.9"  # ... by an estimate with a memory of its own
MICRO = f"{SCALED},progress_scale_estimate=micro_batches"  # ... from the products of each step's two micro-batches
WALK = f"{SCALED},progress_scale_path=lengthened"  # ... each node walking its lengthened steps
CASES = ["averaging", f"averaging{SCALED}", f"averaging{OWN_MEMORY}", "habits,topology=2x2,value_dtype=int2",
         "habits,topology=4x1,value_dtype=int4,local_steps=2",
         "habits,topology=2x2,value_dtype=int2,overlap=delayed", "resume,value_dtype=int4",
         "resume,value_dtype=int4,overlap=delayed,outer_delay=2", "nonfinite,bad=3", "nonfinite,bad=4",
         f"habits,topology=2x2,value_dtype=int2{LEADER}",
         f"habits,topology=4x1,value_dtype=int4,overlap=delayed{LEADER}",
         f"resume,value_dtype=int4,overlap=delayed,outer_delay=2{LEADER}",
         f"habits,topology=2x2,value_dtype=int2{OWNER}", f"habits,topology=4x1,value_dtype=int4,overlap=delayed{OWNER}",
         f"resume,value_dtype=int2,overlap=delayed,outer_delay=2{OWNER}", f"resume,value_dtype=int2{OWNER}",
         f"finals{OWNER}", "finals", f"lean{OWNER}", f"lean,overlap=delayed{OWNER}",
         f"habits,topology=2x2,value_dtype=int2{SCALED}", f"resume,value_dtype=int4{SCALED}",
         f"resume,value_dtype=int4,overlap=delayed,outer_delay=2{SCALED}", f"resume,value_dtype=int4{OWN_MEMORY}",
         f"averaging{MICRO}", f"averaging{MICRO},progress_scale_decay=0.9", f"habits,topology=2x2{MICRO}",
         f"resume,value_dtype=int4,overlap=delayed,outer_delay=2{MICRO}", f"averaging{WALK}",
         f"habits,topology=2x2{WALK}", f"resume,value_dtype=int4,overlap=delayed,outer_delay=2{WALK}"]
INDICES = ",rate=0.0625"  # 4 of each 8 x 8 block: packed indices
CASES8 = [f"habits,topology=2x4,value_dtype=int2{INDICES}",
          f"habits,topology=4x2,value_dtype=int2,overlap=delayed{INDICES}",
          f"habits,topology=8x1,value_dtype=int2,overlap=delayed{INDICES}",
          f"resume,topology=4x2,value_dtype=int2{INDICES}",
          f"resume,topology=8x1,value_dtype=int2,overlap=delayed,outer_delay=2{INDICES}",
          f"habits,topology=8x1,value_dtype=int2,overlap=delayed{INDICES}{LEADER}",
          f"habits,topology=4x2,value_dtype=int2{INDICES}{LEADER}",
          f"resume,topology=8x1,value_dtype=int2{INDICES}{LEADER}",
          f"habits,topology=8x1,value_dtype=int2,overlap=delayed{INDICES}{OWNER}",
          f"habits,topology=4x2,value_dtype=int2{INDICES}{OWNER}",
          f"resume,topology=8x1,value_dtype=int2,overlap=delayed,outer_delay=2{INDICES}{OWNER}",
          f"habits,topology=8x1,value_dtype=int2,overlap=delayed{INDICES}{SCALED}"]
HABITS = [case for case in CASES + CASES8 if case.startswith("habits")]
RESUMES = [case for case in CASES + CASES8 if case.startswith("resume")]


def _option(case: str, name: str, default: str) -> str:
    return dict(o.split("=") for o in case.split(",")[1:]).get(name, default)


def _topology(case: str) -> tuple[int, int]:
    """(nodes, processes per node) of a case."""
    nodes, procs = map(int, _option(case, "topology", "2x2").split("x"))
    return nodes, procs


@pytest.fixture(scope="module")
def suite4(tmp_path_factory):
    args = [a for case in CASES for a in ("--case", case)]
    return run_worker("local_steps_worker", 4, tmp_path_factory.mktemp("local_steps"), *args, timeout=600)


@pytest.fixture(scope="module")
def suite8(tmp_path_factory):
    args = [a for case in CASES8 for a in ("--case", case)]
    return run_worker("local_steps_worker", 8, tmp_path_factory.mktemp("local_steps8"), *args, timeout=600)


@pytest.fixture
def suite(request):
    """The ranks' results of the job that ran the test's case (4 ranks unless it is one of CASES8)."""
    case = request.node.callspec.params.get("case") if hasattr(request.node, "callspec") else None
    return request.getfixturevalue("suite8" if case in CASES8 else "suite4")


@pytest.mark.parametrize("case", ["averaging", f"averaging{SCALED}", f"averaging{OWN_MEMORY}", f"averaging{MICRO}",
                                  f"averaging{MICRO},progress_scale_decay=0.9", f"averaging{WALK}"])
def test_full_replicator_with_outer_sgd_is_periodic_averaging(suite, case):
    """The dense limit, against float64 references of periodic averaging (progress_scale="batch": of where the
    replicas are counted, each one's parameters plus its extra progress)."""
    for rank in suite:
        result = rank[case]
        for got, want, initial in zip(result["flexdemo"], result["reference"], result["initial"]):
            assert not torch.equal(got, initial)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", HABITS)
def test_inner_steps_are_silent_and_an_exchange_crosses_nodes_once(suite, case):
    """An exchange's step starts one cross-node collective; the skip decision (one host sync) is taken where it is
    waited for: the same step, or with streaming (outer_delay 1) the step after, which crosses no node."""
    streaming = "delayed" in case
    nodes, procs = _topology(case)

    def crosses_nodes(ranks: tuple[int, ...]) -> bool:
        return len({rank // procs for rank in ranks}) > 1

    for rank, rank_result in enumerate(suite):
        result = rank_result[case]
        every = len(result["logs"]) // 2
        for step, log in enumerate(result["logs"]):
            crossing = [c for c in log["collectives"] if crosses_nodes(c[1])]
            sends, lands = (step + 1) % every == 0, (step + 1) % every == (1 if streaming else 0)
            if not (sends or lands):
                assert log == {"collectives": [], "syncs": []}, (step, log)  # no collective, no host sync
                continue
            collective = {"leader": "all_reduce", "owner": "all_to_all_single"}.get(
                _option(case, "replicator", "demo"), GATHER)
            assert [name for name, _ in crossing] == ([collective] if sends else []), log
            assert not sends or rank in crossing[0][1]
            assert log["syncs"] == (["item"] if lands else []), log["syncs"]  # the skip decision


@pytest.mark.parametrize("case", HABITS)
def test_replicas_bit_identical_after_every_exchange(suite, case):
    nodes, procs = _topology(case)
    replica_pairs = [(local, local + procs * node) for local in range(procs) for node in range(1, nodes)]
    for a, b in replica_pairs:
        for mine, theirs in zip(suite[a][case]["after_exchange"], suite[b][case]["after_exchange"]):
            for name, value in mine.items():
                assert torch.equal(value, theirs[name]), name
    assert len(suite[0][case]["after_exchange"]) == (2 if "delayed" in case else 3)


@pytest.mark.parametrize("case", HABITS)
def test_bytes_equal_the_formula_on_exchange_steps_only(suite, case):
    """R = 2, 4 and 8, bitmasks (rate 1/4) and packed indices (1/16): amortised, H - 1 steps of 0 and one of the
    formula."""
    rate, procs = float(_option(case, "rate", "0.25")), _topology(case)[1]
    for index, rank in enumerate(suite):
        result = rank[case]
        every = len(result["comm_stats"]) // 2
        expected = exchange_bytes(_option(case, "replicator", "demo"), result["local_shapes"], result["replicas"],
                                  rate=rate, topk=None, chunk=8, value_dtype=_option(case, "value_dtype", "int2"),
                                  rank=index // procs)  # the node: this rank's place among its shards' replicas
        assert result["replicas"] == _topology(case)[0]
        layouts = [BlockLayout.for_shape(shape, 8) for shape in result["local_shapes"] if math.prod(shape)]
        bitmasks = {compression.uses_bitmask(layout.block_numel, compression.kept_per_block(
            layout.block_numel, rate, None)) for layout in layouts}
        assert bitmasks == {False} if case in CASES8 else True in bitmasks, bitmasks  # 1/4: most blocks bitmasks
        for step, stats in enumerate(result["comm_stats"]):
            exchange = (step + 1) % every == 0
            assert stats["bytes_sent"] == stats["bytes_received"] == (expected if exchange else 0) >= 0
            assert stats["collectives"] == int(exchange) and stats["dense_bytes"] > 0
        assert expected > 0


@pytest.mark.parametrize("case", HABITS)
def test_the_outer_step_follows_the_nodes(suite, case):
    """outer_lr's default, resolved at construction from the replicate group and the replicator: sqrt(R / 2), at
    least 1; 1 where the replicator lands a mean (owner)."""
    nodes = _topology(case)[0]
    expected = 1.0 if _option(case, "replicator", "demo") == "owner" else {2: 1.0, 4: math.sqrt(2), 8: 2.0}[nodes]
    assert {rank[case]["outer_lr"] for rank in suite} == {expected}


@pytest.mark.parametrize("case", RESUMES)
def test_resume_mid_round_continues_bit_identically(suite, case):
    """Saved one step into the second round: with overlap="delayed", the first round's exchange is in flight."""
    for rank in suite:
        result = rank[case]
        assert result["equal"]
        assert {"anchor", "delta", "exp_avg", "exp_avg_sq", "outer_avg", "local", "step"} <= set(result["keys"])
        assert result["options"]["local_steps"] == 3 and result["options"]["outer_momentum"] == 0.9
        assert ({"pending_delta", "pending_update"} <= set(result["keys"])) == ("delayed" in case)
        assert ({"leader_indices", "leader_scale"} <= set(result["keys"])) == (LEADER in case)
        assert ({"owner_feedback", "owner_result", "own_sent"} <= set(result["keys"])) == (OWNER in case)
        assert ("lag_product" in result["keys"]) == (SCALED in case)
        assert ("extra_progress" in result["keys"]) == (SCALED in case and WALK not in case)  # a walker's is its shard
        assert ("prev_grad" in result["keys"]) == (SCALED in case and MICRO not in case)  # micro-batches: no lag
        assert ("grad_square" in result["keys"]) == (OWN_MEMORY in case or MICRO in case)


@pytest.mark.parametrize("case", [f"finals{OWNER}", "finals"])
def test_on_the_uncompressed_wire_both_final_rounds_end_at_the_same_model(suite, case):
    """With an exchange in flight, ``finish()`` on the compressed wire and on the dense one land the same model: for
    ``replicator="owner"`` also the round its owners still held (two exchanges, or handed back to the senders)."""
    ranks = [rank[case] for rank in suite]
    for rank in ranks:
        for name, value in rank["compressed"].items():
            torch.testing.assert_close(value, rank["dense"][name], rtol=1e-5, atol=1e-6)
        assert any(not torch.equal(rank["compressed"][n], rank["before"][n]) for n in rank["before"])
    for a, b in [(0, 2), (1, 3)]:
        for final in ("compressed", "dense"):
            assert all(torch.equal(value, ranks[b][final][n]) for n, value in ranks[a][final].items())


@pytest.mark.parametrize("case", [f"lean{OWNER}", f"lean,overlap=delayed{OWNER}"])
def test_replicas_that_lean_on_their_own_share_walk_as_a_wire_that_lands_at_once(suite, case):
    """Every node on the same data, on the uncompressed wire: ``replicator="owner"``, whose consensus lands a round
    late, and ``"demo"``, whose lands at once, hold the same parameters after every step and at the end; only the
    owner keeps a share."""
    for rank in suite:
        owner, demo = rank[case]["owner"], rank[case]["demo"]
        for mine, theirs in [*zip(owner["steps"], demo["steps"]), (owner["final"], demo["final"])]:
            for name, value in mine.items():
                torch.testing.assert_close(value, theirs[name], rtol=1e-5, atol=1e-6)
        assert any(not torch.equal(owner["final"][n], owner["steps"][0][n]) for n in owner["final"])
        assert ("own_sent" in owner["keys"], "own_sent" in demo["keys"]) == (True, False)


@pytest.mark.parametrize("case", ["nonfinite,bad=3", "nonfinite,bad=4"])
def test_a_non_finite_gradient_on_one_rank_costs_every_replica_one_round(suite, case):
    """At the defaults (streamed), a NaN on rank 1 in a round's last step (3) or while its exchange is in flight
    (4): every rank skips one round, all state is finite again, replicas agree and the anchors move on."""
    ranks = [rank[case] for rank in suite]
    for rank in ranks:
        assert rank["skipped"] == 1 and rank["finite"]
        after, end = rank["anchors"]
        assert all(not torch.equal(after[name], end[name]) for name in after)
    for a, b in [(0, 2), (1, 3)]:
        for mine, theirs in zip(ranks[a]["anchors"], ranks[b]["anchors"]):
            for name, value in mine.items():
                assert torch.equal(value, theirs[name]), name
