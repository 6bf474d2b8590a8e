"""Elastic resume on plain tensors: FSDP2's cut, exact reassembly across shard sizes, and the policies'
semantics for per-node state (``average``, ``reset``, ``keep``) beside replicated state, which reshards exactly."""

from __future__ import annotations

import pytest
import torch

from hf_flexdemo.optim.reshard import assemble, cut, reshard_state_dict, reshard_tensor
from hf_flexdemo.policies import CompressionPolicy, GuardPolicy, StepRulePolicy

SHAPES = [(5, 3), (1, 4), (4,), (7, 2), (2, 8)]  # uneven, fewer rows than ranks (empty shards), 1-D


def _shards(full: torch.Tensor, shard_size: int) -> list[torch.Tensor]:
    return [cut(full, shard_size, i) for i in range(shard_size)]


def _ranks(nodes: list[torch.Tensor], shard_size: int) -> list[torch.Tensor]:
    """Every rank's shard, node-major, of one full tensor per node."""
    return [shard for node in nodes for shard in _shards(node, shard_size)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("shard_size", [1, 2, 3, 4])
def test_cut_is_fsdp2s_chunk_with_empty_shards(shape, shard_size):
    """FSDP2's shard (``_chunk_with_empty``, then ``(0, *rest)`` for an empty one) and its reassembly."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty, _get_dim_chunked_size

    full = torch.randn(shape)
    for i, chunk in enumerate(_chunk_with_empty(full, shard_size, dim=0)):
        assert cut(full, shard_size, i).shape == _get_dim_chunked_size(chunk, full.shape, dim=0)
    assert torch.equal(assemble(_shards(full, shard_size), shard_size)[0], full)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("old", "new"), [((2, 2), (1, 2)), ((1, 2), (2, 2)), ((2, 2), (2, 1)), ((2, 1), (2, 2)),
                                          ((2, 2), (2, 4)), ((1, 3), (2, 2))])
def test_replicated_state_reshards_exactly(shape, old, new):
    """(nodes, shard size) old -> new: every new rank's shard is FSDP2's cut of old node 0's tensor."""
    full = torch.randn(shape)
    shards = _ranks([full] * old[0], old[1])
    got = [reshard_tensor(shards, old_shard_size=old[1], rank=r, shard_size=new[1], replicate_size=new[0],
                          policy=None) for r in range(new[0] * new[1])]
    for node in assemble(got, new[1]):
        assert torch.equal(node, full)


def test_average_reset_and_keep_semantics():
    nodes = [torch.randn(5, 3) for _ in range(2)]
    shards = _ranks(nodes, 2)

    def new(policy, replicate_size, shard_size):
        ranks = [reshard_tensor(shards, old_shard_size=2, rank=r, shard_size=shard_size, replicate_size=replicate_size,
                                policy=policy) for r in range(replicate_size * shard_size)]
        return assemble(ranks, shard_size)

    mean = (nodes[0] + nodes[1]) / 2
    for replicate_size, shard_size in [(1, 2), (2, 1), (1, 4), (3, 2)]:
        assert all(torch.equal(node, mean) for node in new("average", replicate_size, shard_size))
        assert all(torch.equal(node, torch.zeros(5, 3)) for node in new("reset", replicate_size, shard_size))
    for shard_size in (1, 3, 4):  # one-to-one: node n keeps its own tensor, whatever the processes per node
        assert all(torch.equal(got, want) for got, want in zip(new("keep", 2, shard_size), nodes))
    with pytest.raises(ValueError, match=r"resume_policy='keep' needs one new node per old node.*checkpoint has 2 "
                                         r"node\(s\) and this run 1; accepted: 'average' \| 'reset'"):
        new("keep", 1, 2)


def _state_dict(rank: int, shard_size: int, nodes: list[dict[str, torch.Tensor]], local_steps: int) -> dict:
    """A FlexDeMo-like state_dict of ``rank``: one parameter, each key's full tensor per node cut for the rank."""
    node, index = divmod(rank, shard_size)
    entry = {key: cut(value, shard_size, index) for key, value in nodes[node].items()}
    entry["step"] = torch.tensor(7.0)
    return {"state": {0: entry}, "param_groups": [{"params": [0], "lr": 0.1, "update": "adamw"}],
            "flexdemo": {"options": {"local_steps": local_steps}, "steps": 7, "pending": None}}


def test_state_dict_policies_touch_only_per_node_keys():
    """Step-wise mode with update="adamw": ``delta`` and the gradient moments are per node, ``exp_avg`` /
    ``exp_avg_sq`` (fed the consensus) replicated. Local steps: the inner moments are per node and ``local``
    restarts from the anchor unless ``keep``."""
    torch.manual_seed(0)
    replicated = {"exp_avg": torch.randn(5, 3), "exp_avg_sq": torch.rand(5, 3), "anchor": torch.randn(5, 3)}
    nodes = [{**replicated, "delta": torch.randn(5, 3), "grad_avg": torch.randn(5, 3), "local": torch.randn(5, 3)}
             for _ in range(2)]
    for local_steps in (1, 4):
        old = [_state_dict(r, 2, nodes, local_steps) for r in range(4)]
        for policy in ("average", "reset", "keep"):
            new = [reshard_state_dict(old, old_shard_size=2, rank=r, shard_size=4, replicate_size=2, policy=policy)
                   for r in range(8)]
            assert all(s["flexdemo"] == old[0]["flexdemo"] and s["param_groups"] == old[0]["param_groups"] for s in new)
            # step counts the inner AdamW's per-node moments with local steps (reset restarts it), and also the
            # replicated AdamW of the consensus step-wise (kept)
            step = 0.0 if policy == "reset" and local_steps > 1 else 7.0
            assert all(torch.equal(s["state"][0]["step"], torch.tensor(step)) for s in new)
            per_node = {"delta", "grad_avg", "local"} | ({"exp_avg", "exp_avg_sq"} if local_steps > 1 else set())
            for key in nodes[0]:
                got = assemble([s["state"][0][key] for s in new], 4)
                if key == "local" and policy != "keep":
                    want = [nodes[0]["anchor"]] * 2
                elif key not in per_node:
                    want = [nodes[0][key]] * 2
                elif policy == "average":
                    want = [(nodes[0][key] + nodes[1][key]) / 2] * 2
                elif policy == "reset":
                    want = [torch.zeros(5, 3)] * 2
                else:
                    want = [nodes[0][key], nodes[1][key]]
                assert all(torch.equal(g, w) for g, w in zip(got, want)), (local_steps, policy, key)
    with pytest.raises(ValueError, match="resume_policy='keep' needs one new node per old node"):
        reshard_state_dict(old, old_shard_size=2, rank=0, shard_size=2, replicate_size=1, policy="keep")


def test_reset_restarts_step_where_it_counts_per_node_moments_only():
    """Step-wise with update="sgd" ``step`` is the bias correction of the replica's gradient moments alone."""
    nodes = [{"delta": torch.randn(4, 2), "grad_avg": torch.randn(4, 2)} for _ in range(2)]
    old = [_state_dict(r, 1, nodes, 1) for r in range(2)]
    for state in old:
        state["param_groups"][0]["update"] = "sgd"
    for policy, step in (("reset", 0.0), ("average", 7.0)):
        new = reshard_state_dict(old, old_shard_size=1, rank=0, shard_size=1, replicate_size=1, policy=policy)
        assert torch.equal(new["state"][0]["step"], torch.tensor(step))


def test_load_resharded_into_one_process_checks_the_parameters(tmp_path):
    """A 2 x 2 checkpoint's rank files (per-node ``delta`` differing) loaded into one process under ``average``:
    ``delta`` is the nodes' mean, ``exp_avg`` (update="adamw", replicated) the saved one; other parameters are
    refused, naming the first that differs."""
    from hf_flexdemo import FlexDeMo
    from hf_flexdemo.trainer import checkpoint

    def optimizer(*shapes):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        return FlexDeMo(params, local_steps=1, step_rule=StepRulePolicy(update="adamw"),
                        guards=GuardPolicy(drift_check_every=0), compression=CompressionPolicy(replicator="none"))

    source = optimizer((5, 3), (4,))
    source.step()
    full = source.state_dict()
    deltas = [{i: s["delta"] + node for i, s in full["state"].items()} for node in range(2)]
    for rank in range(4):
        node, index = divmod(rank, 2)
        state = {i: {k: v if v.dim() == 0 else cut(deltas[node][i] if k == "delta" else v, 2, index)
                     for k, v in s.items()} for i, s in full["state"].items()}
        (tmp_path / "flexdemo_optimizer").mkdir(exist_ok=True)
        torch.save({**full, "state": state}, tmp_path / checkpoint.rank_file(rank))
    record = {"world_size": 4, "shard_size": 2, "replicate_size": 2, "method": "flexdemo",
              **checkpoint.describe_state(source, 4)}
    checkpoint.write_topology(tmp_path, record)
    target = optimizer((5, 3), (4,))
    checkpoint.load_resharded(target, tmp_path, rank=0, shard_size=1, replicate_size=1, policy="average")
    for i, p in enumerate(target.param_groups[0]["params"]):
        assert torch.equal(target.state[p]["delta"], (deltas[0][i] + deltas[1][i]) / 2)
        assert torch.equal(target.state[p]["exp_avg"], full["state"][i]["exp_avg"])
    with pytest.raises(ValueError, match=r"other parameters: 2 saved, 2 now; \(name, saved shape, shape now\) = "
                                         r"\[\('param_groups\[0\]\[1\]', \[4\], \[5\]\)\]"):
        checkpoint.load_resharded(optimizer((5, 3), (5,)), tmp_path, rank=0, shard_size=1, replicate_size=1,
                                  policy="average")


def test_a_mid_round_extra_progress_restarts_with_the_replica():
    """progress_scale="batch": the gradient statistics are per node; the extra progress restarts from 0 with the
    replica at the anchor (unless ``keep``), and a streamed exchange in flight keeps its error feedback: held as
    feedback + (local + extra) at its launch, it becomes feedback + the anchor."""
    torch.manual_seed(0)
    anchor = torch.randn(5, 3)
    nodes = [{"anchor": anchor, "local": torch.randn(5, 3), "extra_progress": torch.randn(5, 3),
              "prev_grad": torch.randn(5, 3), "lag_product": torch.randn(5, 3), "feedback": torch.randn(5, 3)}
             for _ in range(2)]
    for node in nodes:
        node["pending_delta"] = node.pop("feedback") + node["local"] + node["extra_progress"]
    old = [_state_dict(r, 2, nodes, 4) for r in range(4)]
    for policy in ("average", "reset", "keep"):
        new = [reshard_state_dict(old, old_shard_size=2, rank=r, shard_size=1, replicate_size=2, policy=policy)
               for r in range(2)]
        got = {key: [s["state"][0][key] for s in new] for key in nodes[0]}
        feedback = [node["pending_delta"] - node["local"] - node["extra_progress"] for node in nodes]
        if policy == "keep":
            want = {key: [node[key] for node in nodes] for key in nodes[0]}
        else:
            combined = {"average": lambda ts: (ts[0] + ts[1]) / 2, "reset": lambda ts: torch.zeros(5, 3)}[policy]
            want = {"anchor": [anchor] * 2, "local": [anchor] * 2, "extra_progress": [torch.zeros(5, 3)] * 2,
                    **{key: [combined([node[key] for node in nodes])] * 2 for key in ("prev_grad", "lag_product")},
                    "pending_delta": [combined(feedback) + anchor] * 2}
        for key in nodes[0]:
            assert all(torch.allclose(g, w) for g, w in zip(got[key], want[key])), (policy, key)
