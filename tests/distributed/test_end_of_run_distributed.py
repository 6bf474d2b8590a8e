"""A run ends with the model it trained: after ``train()`` the model in memory, saved and evaluated holds every step
trained, the same on every rank; the best model loaded at the end stays loaded; a second ``train()`` goes on."""

from __future__ import annotations

import pytest
import torch
from launch import run_worker


@pytest.fixture(scope="module", params=[(2, 1), (2, 2), (1, 2)], ids=lambda t: f"{t[0]}x{t[1]}")
def ranks(request, tmp_path_factory):
    nodes, shard = request.param
    best = ["--best"] if nodes == 2 else []  # plain replicas and FSDP2 shards
    out = tmp_path_factory.mktemp(f"end_of_run_{nodes}x{shard}")
    return nodes, shard, run_worker("end_of_run_worker", nodes * shard, out, "--shard_size", str(shard), *best,
                                    timeout=600)


def _equal(a: dict, b: dict, names=None) -> bool:
    return all(torch.equal(a[n], b[n]) for n in (names or a))


@pytest.mark.parametrize("steps", [2, 8, 16])
def test_the_model_after_train_is_the_one_trained_on_every_rank_in_memory_and_on_disk(ranks, steps):
    """Every tensor moved from its initial value (before the end-of-run landing, 2 steps at 4 fragments left the
    saved model exactly the initial one); every rank holds the same weights; the saved file is that model; its loss
    is the loss of the model in memory."""
    _, _, results = ranks
    runs = [r["defaults"][steps] for r in results]
    first = runs[0]
    assert not [n for n in first["model"] if torch.equal(first["model"][n], results[0]["initial"][n])]
    assert all(_equal(first["model"], run["model"]) for run in runs[1:])
    assert _equal(first["model"], first["saved"], first["saved"])
    assert first["loss"] == first["saved_loss"]
    assert all(run["eval_loss"] == first["eval_loss"] for run in runs)


def test_on_the_uncompressed_wire_the_model_is_the_mean_of_what_the_nodes_trained(ranks):
    """Every value in float32: the final round leaves the mean over the nodes of what each trained: its local
    parameters at the end, plus what its error feedback still holds (the pseudo-gradient is ``delta + anchor -
    local``). The anchors alone, as before the landing, miss each fragment's steps since its last round; the local
    parameters alone miss the steps between a streamed exchange's launch and its landing (the defaults land two
    steps later), which restarting from the anchor moved into the error feedback."""
    nodes, shard, results = ranks
    trained = [results[node * shard]["exact"] for node in range(nodes)]
    model = results[0]["exact"]["model"]
    for name, value in model.items():
        mean = sum(node["trained"][name] - node["held_back"][name] for node in trained) / nodes
        torch.testing.assert_close(value, mean, rtol=1e-6, atol=1e-7)
    if nodes > 1:  # the nodes did part, and the steps between a launch and its landing wait in the error feedback
        assert any(not torch.equal(trained[0]["trained"][n], trained[1]["trained"][n]) for n in model)
        assert any(trained[0]["held_back"][n].abs().max() > 0 for n in model)


def test_the_final_round_is_logged_and_counted(ranks):
    nodes, _, results = ranks
    logs = results[0]["defaults"][8]["log_history"]
    final = [e for e in logs if "flexdemo/final_round_bytes_sent" in e]
    assert len(final) == 1
    before = [e["flexdemo/total_bytes_sent"] for e in logs if "loss" in e][-1]
    assert final[0]["flexdemo/total_bytes_sent"] == before + final[0]["flexdemo/final_round_bytes_sent"]
    assert (final[0]["flexdemo/final_round_bytes_sent"] > 0) == (nodes > 1)


def test_a_second_train_goes_on_from_the_consensus(ranks):
    _, _, results = ranks
    again = [r["again"] for r in results]
    assert not _equal(again[0]["model"], results[0]["defaults"][8]["model"])
    assert all(_equal(again[0]["model"], other["model"]) for other in again[1:])


def test_load_best_model_at_end_keeps_the_best_checkpoint(ranks):
    """The worst evaluation counted as best (``greater_is_better=True``) picks an early checkpoint: the model in
    memory and the saved one are that checkpoint's weights, and ``evaluate()`` returns its logged loss."""
    nodes, shard, results = ranks
    if nodes != 2:
        pytest.skip("measured on 2 x 1 and 2 x 2")
    for result in results:
        best = result["best"]
        assert not best["checkpoint"].endswith("checkpoint-12")
        assert _equal(best["model"], best["checkpoint_model"], best["checkpoint_model"])
        assert _equal(best["saved"], best["checkpoint_model"])
        step = int(best["checkpoint"].rsplit("-", 1)[1])
        logged = next(e["eval_loss"] for e in best["log_history"] if e.get("step") == step and "eval_loss" in e)
        assert best["eval_loss"] == logged
