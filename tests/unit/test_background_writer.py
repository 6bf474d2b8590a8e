"""Optimizer state written in the background (``FlexDeMoConfig.async_save``), and when such a checkpoint counts as
complete: only once every rank's file has landed."""

from __future__ import annotations

import threading

import pytest
import torch

from hf_flexdemo.trainer import checkpoint
from hf_flexdemo.trainer.background_writer import BackgroundWriter


def test_the_file_holds_the_state_as_it_was_when_submitted(tmp_path):
    state = {"state": {0: {"exp_avg": torch.ones(3), "step": torch.tensor(4.0)}}, "param_groups": [{"lr": 1e-3}]}
    gate = threading.Event()
    writer = BackgroundWriter(lambda path, s: (gate.wait(), checkpoint.write_state(path, s)))
    writer.submit(tmp_path / "rank.pt", state)
    state["state"][0]["exp_avg"].add_(1)  # the next steps change the live state in place
    assert writer.busy and not (tmp_path / "rank.pt").exists()  # nothing half-written appears meanwhile
    gate.set()
    writer.wait()
    assert not writer.busy
    saved = torch.load(tmp_path / "rank.pt", weights_only=True)
    assert torch.equal(saved["state"][0]["exp_avg"], torch.ones(3)) and saved["param_groups"] == [{"lr": 1e-3}]


def test_a_failed_write_is_raised_once_in_the_training_thread(tmp_path):
    def fail(path, state):
        raise OSError(28, "No space left on device")

    writer = BackgroundWriter(fail)
    writer.submit(tmp_path / "rank.pt", {})
    with pytest.raises(RuntimeError, match="in the background failed: .*No space left on device.*incomplete"):
        writer.wait()
    writer.wait()
    writer.submit(tmp_path / "rank.pt", {})  # the next checkpoint tries again
    with pytest.raises(RuntimeError, match="No space left"):
        writer.wait()


def test_a_checkpoint_is_complete_once_every_rank_file_has_landed(tmp_path):
    files = [checkpoint.rank_file(rank) for rank in range(2)]
    for step in (5, 10):
        folder = tmp_path / f"checkpoint-{step}"
        (folder / checkpoint.OPTIMIZER_DIR).mkdir(parents=True)
        checkpoint.write_topology(folder, {"world_size": 2, "files": files})
        checkpoint.mark_complete(folder, step)  # every rank passed the barrier ...
        checkpoint.write_state(folder / files[0], {})
    checkpoint.write_state(tmp_path / "checkpoint-5" / files[1], {})
    # ... but rank 1's state for step 10 had not landed when its node died
    assert not checkpoint.is_complete(tmp_path / "checkpoint-10")
    assert checkpoint.last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-5")
    with pytest.raises(ValueError, match=r"incomplete \(no flexdemo_complete.json, or a rank file missing\)"):
        checkpoint.check_resumable(tmp_path / "checkpoint-10", {"world_size": 2})
    checkpoint.write_state(tmp_path / "checkpoint-10" / files[1], {})
    assert checkpoint.last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
