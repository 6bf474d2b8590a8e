"""FlexDeMoTrainer on 4 CPU ranks (2 nodes x 2 processes), a tiny T5 on a toy reversal task: two launches of
several trainer runs each (``trainer_worker --runs``; most of a launch's time on CPU is the ranks' imports), and
one through ``accelerate launch``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from launch import WORKERS, accelerate_launch, run_worker
from transformers import AutoModelForSeq2SeqLM

from hf_flexdemo.testing import fixed_batch, tiny_t5


def _train_losses(log_history: list[dict]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in log_history if "loss" in e}


MID_ROUND = [("none", 1, 10), ("delayed", 1, 8), ("delayed", 0, 9)]  # (overlap, outer_fragments, checkpoint step)
# the lengthening's estimate from each step's two micro-batches, in rounds of 4 streamed in the default fragments
MICRO = ["--steps", "10", "--logging_steps", "1", "--local_steps", "4", "--topk", "0", "--overlap", "delayed",
         "--batch", "2", "--ga", "2", "--progress_scale", "batch", "--progress_scale_estimate", "micro_batches"]


def _mid_round_flags(overlap: str, fragments: int) -> list[str]:
    return ["--steps", "18", "--logging_steps", "1", "--local_steps", "4", "--value_dtype", "int2", "--topk", "0",
            "--overlap", overlap, *(("--outer_fragments", str(fragments)) if fragments else ())]


def _launch(out, runs: list[list[str]]) -> dict[str, list[dict]]:
    """Several trainer runs in one 4-rank launch, in order (``[name, *flags]``; a run's output directory is
    ``out/name``): each run's results, one per rank, by name."""
    runs = [[name, "--output_dir", str(out / name), *flags] for name, *flags in runs]
    ranks = run_worker("trainer_worker", 4, out, "--runs", json.dumps(runs), timeout=1200)
    return {name: [rank[name] for rank in ranks] for name, *_ in runs}


@pytest.fixture(scope="module")
def flexdemo_runs(tmp_path_factory):
    """The flexdemo runs and their resumes: 20 steps with a checkpoint at step 10 and the final model saved, resumed
    from step 10; and local steps checkpointed mid-round (:data:`MID_ROUND`), each resumed."""
    out = tmp_path_factory.mktemp("flexdemo")
    runs = [["straight", "--steps", "20", "--save_steps", "10", "--logging_steps", "1", "--final_save"],
            ["resumed", "--steps", "20", "--logging_steps", "1", "--resume", str(out / "straight" / "checkpoint-10")]]
    for overlap, fragments, save in MID_ROUND:
        name, flags = f"local-{overlap}-{fragments}-{save}", _mid_round_flags(overlap, fragments)
        runs += [[name, "--save_steps", str(save), "--final_save", *flags],
                 [f"{name}-resumed", "--resume", str(out / name / f"checkpoint-{save}"), *flags]]
    runs += [["micro", "--save_steps", "6", *MICRO],
             ["micro-resumed", "--resume", str(out / "micro" / "checkpoint-6"), *MICRO]]
    return out, _launch(out, runs)


@pytest.fixture(scope="module")
def other_runs(tmp_path_factory):
    """The baselines, the reduce dtypes, gradient accumulation against a larger batch, the overlap with backward,
    and bf16 mixed precision."""
    out = tmp_path_factory.mktemp("others")
    # one node trains as AdamW, scale-free: the emulated wire's SGD shows a scale
    accumulation = ["--steps", "3", "--lr", "0.5", "--update", "sgd", "--logging_steps", "1", "--shard_size", "4",
                    "--replicator", "none"]
    overlap = ["--steps", "3", "--batch", "2", "--ga", "2", "--topk", "0", "--update", "rmsprop",
               "--bucket_cap_mb", "0.02"]
    runs = [["adamw", "--method", "adamw", "--steps", "15", "--lr", "3e-3"],
            ["demo", "--method", "demo", "--steps", "15", "--lr", "1e-3"],
            *([f"reduce-{dtype}", "--method", "adamw", "--steps", "4", "--lr", "3e-3", "--reduce_dtype", dtype]
              for dtype in ("float32", "bfloat16")),
            ["big", "--batch", "4", *accumulation],
            ["accumulated", "--batch", "2", "--ga", "2", "--undeclared_loss_kwargs", *accumulation],
            *([f"overlap-{mode}", "--overlap", mode, *overlap] for mode in ("none", "backward")),
            ["bf16", "--steps", "10", "--bf16"]]
    return _launch(out, runs)


@pytest.fixture(scope="module")
def straight(flexdemo_runs):
    out, runs = flexdemo_runs
    return out, runs["straight"]


def test_flexdemo_trains_logs_traffic_and_keeps_replicas_identical(straight):
    _, ranks = straight
    losses = _train_losses(ranks[0]["log_history"])
    assert sum(list(losses.values())[-5:]) < sum(list(losses.values())[:5])
    assert ranks[0]["topology"] == {"world_size": 4, "shard_size": 2, "replicate_size": 2}
    total_sent = sum(r["comm_stats"]["bytes_sent"] for r in ranks)
    total_dense = sum(r["comm_stats"]["dense_bytes"] for r in ranks)
    logs = [e for e in ranks[0]["log_history"] if "loss" in e]
    # step 1 also carries the drift check (drift_check_every=100: steps 0, 100, ...), counted in the bytes
    check = logs[0]["flexdemo/bytes_sent"] - total_sent
    assert check > 0
    for entry in logs[1:]:
        assert entry["flexdemo/bytes_sent"] == total_sent
        assert entry["flexdemo/bytes_received"] == sum(r["comm_stats"]["bytes_received"] for r in ranks)
        # headline: vs a bf16 all-reduce of the same shards (per rank dense_allreduce_bytes(numel, R, 2): the fp32
        # figure halved and floored, test_trainer.py)
        total_bf16 = sum(r["comm_stats"]["dense_bytes"] // 2 for r in ranks)
        assert entry["flexdemo/compression_ratio"] == pytest.approx(total_bf16 / total_sent)
        assert entry["flexdemo/compression_ratio_fp32"] == pytest.approx(total_dense / total_sent)
        assert entry["flexdemo/comm_seconds"] > 0
    assert logs[-1]["flexdemo/total_bytes_sent"] == 20 * total_sent + check
    for a, b in [(0, 2), (1, 3)]:
        for name, value in ranks[a]["params"].items():
            assert torch.equal(value, ranks[b]["params"][name]), name


def test_saved_model_reloads_with_from_pretrained(straight):
    out, ranks = straight
    model = AutoModelForSeq2SeqLM.from_pretrained(out / "straight")
    with torch.no_grad():
        logits = model(**fixed_batch()).logits
    torch.testing.assert_close(logits, ranks[0]["logits"], atol=1e-5, rtol=1e-5)
    saved = out / "straight" / "checkpoint-10"
    assert (saved / "flexdemo_complete.json").is_file()
    assert len(list((saved / "flexdemo_optimizer").glob("rank*.pt"))) == 4
    # the weights once, where from_pretrained and a resume read them; not FSDP's second copy
    assert (saved / "model.safetensors").is_file() and not list(saved.glob("pytorch_model_fsdp*"))


def test_resume_from_checkpoint_is_exact(flexdemo_runs):
    ranks, resumed = flexdemo_runs[1]["straight"], flexdemo_runs[1]["resumed"]
    want, got = _train_losses(ranks[0]["log_history"]), _train_losses(resumed[0]["log_history"])
    assert sorted(got) == list(range(1, 21))  # steps 1-10 come back from the checkpoint's trainer state
    assert all(got[step] == want[step] for step in range(11, 21))
    # the traffic total continues from the checkpoint (it restarted at 0: 0 and 3,982 at steps 11, 12, not 21,778)
    totals = [[e["flexdemo/total_bytes_sent"] for e in r[0]["log_history"] if "flexdemo/total_bytes_sent" in e
               and e["step"] > 10] for r in (ranks, resumed)]
    assert len(totals[0]) >= 10 and totals[1] == totals[0]
    for rank_straight, rank_resumed in zip(ranks, resumed):
        for name, value in rank_straight["params"].items():
            assert torch.equal(value, rank_resumed["params"][name]), name


@pytest.mark.parametrize(("overlap", "fragments", "save"), MID_ROUND)
def test_local_steps_resume_mid_round_is_exact_and_log_outer_rounds(flexdemo_runs, overlap, fragments, save):
    """local_steps=4 for 18 steps (exchanges at 4, 8, 12, 16; streamed, each lands in the next step) with a
    checkpoint mid-round, or streamed with the exchange of step 8 in flight, or streamed in the default 4
    fragments (one fragment's exchange every step) with the exchange of step 9 in flight: the resumed run's losses
    and parameters equal the straight run's, the logs count the rounds and the amortised bytes, and after train()
    every node holds the final round's consensus, the model saved."""
    out, runs = flexdemo_runs
    name = f"local-{overlap}-{fragments}-{save}"
    straight, ranks, resumed = out / name, runs[name], runs[f"{name}-resumed"]
    want, got = _train_losses(ranks[0]["log_history"]), _train_losses(resumed[0]["log_history"])
    assert all(got[step] == want[step] for step in range(save + 1, 19))
    for rank_straight, rank_resumed in zip(ranks, resumed):
        for name, value in rank_straight["params"].items():
            assert torch.equal(value, rank_resumed["params"][name]), name
    logs = [e for e in ranks[0]["log_history"] if "loss" in e]
    assert [e["flexdemo/outer_rounds"] for e in logs] == [step // 4 for step in range(1, 19)]
    sent = [e["flexdemo/bytes_sent"] for e in logs]
    # the exchanges, and the drift check of step 1 (drift_check_every=100: the first point where replicas agree);
    # in fragments, one fragment's exchange every step
    assert all((value > 0) == (step % 4 == 0 or step == 1 or not fragments) for step, value in zip(range(1, 19), sent))
    # step 18 is mid-round: the end-of-run landing brought both nodes to one consensus, and it is what was saved
    assert torch.equal(ranks[0]["logits"], ranks[2]["logits"])
    assert torch.equal(ranks[0]["consensus_logits"], ranks[0]["logits"])
    saved = AutoModelForSeq2SeqLM.from_pretrained(straight)
    with torch.no_grad():
        torch.testing.assert_close(saved(**fixed_batch()).logits, ranks[0]["consensus_logits"], atol=1e-5, rtol=1e-5)


def test_the_estimate_from_micro_batches_trains_and_resumes_exactly(flexdemo_runs):
    """``progress_scale_estimate="micro_batches"`` under the Trainer, 2 x 2 with gradient accumulation 2: the trainer
    reduces every micro-batch inside the node (Accelerate's sync_each_batch) and reports each one to the optimizer,
    which refuses a step without them, so training at all shows the wiring; the estimate moved on every shard with a
    gradient (not on the decoder's relative-position rows of distances no training pair reaches), the nodes end at
    one model, and a resume mid-round (step 6 of rounds of 4) continues bit for bit."""
    ranks, resumed = flexdemo_runs[1]["micro"], flexdemo_runs[1]["micro-resumed"]
    want, got = _train_losses(ranks[0]["log_history"]), _train_losses(resumed[0]["log_history"])
    assert sorted(want) == list(range(1, 11)) and all(got[step] == want[step] for step in range(7, 11))
    for rank_straight, rank_resumed in zip(ranks, resumed):
        assert rank_straight["sync_each_batch"] and len(rank_straight["estimated"]) > 10
        assert all(moved or "relative_attention_bias" in name for name, moved in rank_straight["estimated"].items())
        for name, value in rank_straight["params"].items():
            assert torch.equal(value, rank_resumed["params"][name]), name
            assert torch.equal(value, ranks[0]["params"][name]), name


@pytest.mark.parametrize("method", ["adamw", "demo"])
def test_baselines_train_through_the_same_trainer(method, other_runs):
    ranks = other_runs[method]
    losses = list(_train_losses(ranks[0]["log_history"]).values())
    assert losses[-1] < losses[0]
    assert ranks[0]["fsdp"] == (method == "adamw")
    if method == "demo":
        assert ranks[0]["topology"]["replicate_size"] == 4
        # every rank is its own replica: the payload (carrying the non-finite flag) is the only collective
        assert ranks[0]["comm_stats"]["collectives"] == 1 and ranks[0]["comm_stats"]["node_collectives"] == 0
    for other in ranks[1:]:
        for name, value in ranks[0]["params"].items():
            assert torch.equal(value, other["params"][name]), name


def test_adamw_baseline_reduces_gradients_in_bfloat16_when_asked(other_runs):
    """``reduce_dtype="bfloat16"`` (method="adamw"): FSDP2's policy casts the gradients to bfloat16 before the
    reduce-scatter inside the node and the all-reduce across nodes (gloo runs both in bfloat16 on CPU), so every
    reduced gradient the optimizer sees is a bfloat16 value; with the fp32 default almost none is, and training
    differs."""
    bf16, fp32 = other_runs["reduce-bfloat16"], other_runs["reduce-float32"]
    assert bf16[0]["mp_policy"].reduce_dtype == torch.bfloat16 and bf16[0]["mp_policy"].param_dtype is None
    assert fp32[0]["mp_policy"].reduce_dtype is None  # the gradients' own dtype: float32
    assert bf16[0]["reduce_dtypes"] == ["torch.bfloat16"] and fp32[0]["reduce_dtypes"] == ["None"]
    for rank in bf16:
        assert rank["bf16_exact_grads"] == [True] * 4
    for rank in fp32:
        assert not any(rank["bf16_exact_grads"])
    assert {v.dtype for v in bf16[0]["params"].values()} == {torch.float32}  # parameters stay float32
    losses = list(_train_losses(bf16[0]["log_history"]).values())
    assert all(map(math.isfinite, losses))
    assert any(not torch.equal(value, fp32[0]["params"][name]) for name, value in bf16[0]["params"].items())
    for other in bf16[1:]:  # every rank holds the same all-reduced parameters
        for name, value in bf16[0]["params"].items():
            assert torch.equal(value, other["params"][name]), name


def test_gradient_accumulation_matches_a_larger_batch(other_runs):
    """On one node, GA 2 x batch 2 and batch 4 average the same 16 samples per step (all 8 label tokens
    long), so parameters and losses must agree to float rounding. ``update="sgd"`` (``p -= Q``, Q linear
    in the gradient), because sign updates and top-k are scale-invariant and would hide a gradient of the
    wrong size. Measured on 2 CPUs: parameters bit-identical, losses within 3e-7; a doubled gradient (what
    T5 without ``accepts_loss_kwargs = False`` gave: Trainer then skipped the division by the GA steps)
    moves them by up to 0.098, and the whole 3-step update is 0.107, both far above the 1e-6 bound.
    (Across nodes the identity does not hold: Accelerate deals micro-batches to ranks round-robin,
    so with GA each node averages a different subset of the step's samples.) The accumulated run's T5 does not
    declare ``accepts_loss_kwargs = False``, as ``from_pretrained`` gives it: ``FlexDeMoTrainer.compute_loss``
    must undo both of stock Trainer's factors, x 2 (no division by the GA steps) and x 4 (the processes)."""
    big, accumulated = other_runs["big"], other_runs["accumulated"]
    bound = 1e-6
    a, b = big[0]["params"], accumulated[0]["params"]
    assert max((a[n] - b[n]).abs().max().item() for n in a) <= bound
    initial = dict(tiny_t5().named_parameters())
    assert max((a[n] - initial[n]).abs().max().item() for n in a) > 1000 * bound  # a scale error would show
    want, got = _train_losses(big[0]["log_history"]), _train_losses(accumulated[0]["log_history"])
    assert sorted(got) == sorted(want) == [1, 2, 3]
    assert all(got[step] == pytest.approx(want[step], rel=bound) for step in want)


def test_overlap_under_the_trainer_exchanges_once_per_step_with_accumulation(other_runs):
    """2 nodes x 2, gradient accumulation 2: Trainer skips FSDP2's gradient sync on the first micro-batch
    (Accelerate's no_sync), so each bucket's exchange starts once, during the last backward. Parameters
    equal those of the exchange in step() (``torch.equal``)."""
    for plain, overlapped in zip(other_runs["overlap-none"], other_runs["overlap-backward"]):
        assert plain["comm_stats"]["collectives"] == 1
        assert overlapped["comm_stats"]["collectives"] > 2  # one per bucket
        for name, value in plain["params"].items():
            assert torch.equal(value, overlapped["params"][name]), name


def test_accelerate_launch_reads_the_topology_from_the_yaml(tmp_path):
    config = WORKERS.parents[2] / "accelerate_configs" / "cpu_2x2.yaml"
    args = ["--out", str(tmp_path), "--output_dir", str(tmp_path / "run"), "--steps", "5", "--shard_size", "0"]
    accelerate_launch(config, WORKERS / "trainer_worker.py", args)
    rank = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert rank["topology"] == {"world_size": 4, "shard_size": 2, "replicate_size": 2} and rank["fsdp"]
    assert rank["log_history"][0]["flexdemo/bytes_sent"] > 0


def test_bf16_mixed_precision_trains_with_fp32_parameters(other_runs):
    ranks = other_runs["bf16"]
    losses = list(_train_losses(ranks[0]["log_history"]).values())
    assert losses[-1] < losses[0]
    assert {v.dtype for v in ranks[0]["params"].values()} == {torch.float32}
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[2]["params"][name]), name
