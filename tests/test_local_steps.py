"""``local_steps`` on one process: H = 1 is today's optimizer bit for bit, the knobs' checks, the memory bound,
and the low-bit wire values: what receivers decode is what the sender's error feedback subtracted."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hf_flexdemo import FlexDeMo, FlexDeMoConfig, compression, knobs, quantize
from hf_flexdemo.dct import BlockLayout
from hf_flexdemo.replicate import pack, unpack

WIDTHS = ("float32", "bfloat16", "float8", "int4", "int2")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()


def test_one_local_step_is_the_step_wise_optimizer_bit_for_bit():
    """``local_steps=1`` alone trains as the step-wise defaults before local steps, spelled out."""
    one, before = mlp(), mlp()
    train(one, FlexDeMo(one.parameters(), lr=1e-2, compression_chunk=8, local_steps=1), 5)
    train(before, FlexDeMo(before.parameters(), lr=1e-2, compression_chunk=8, local_steps=1, value_dtype="float8",
                           overlap="none"), 5)
    for a, b in zip(one.parameters(), before.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("value_dtype", WIDTHS)
def test_local_steps_train_and_restart_from_the_anchor(value_dtype):
    model = mlp()
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=3, value_dtype=value_dtype, replicator="none",
                   compression_chunk=8, overlap="none")
    train(model, opt, 6)
    for p in model.parameters():
        assert torch.equal(p, opt.state[p]["anchor"])  # a round just ended: the parameters are the anchor
        assert not torch.equal(p, dict(mlp().named_parameters())[next(
            n for n, q in model.named_parameters() if q is p)])


@pytest.mark.parametrize("outer_momentum", [0.0, 0.9])
def test_memory_is_adamw_plus_anchor_and_error_feedback(outer_momentum):
    """At most AdamW's state + 8 bytes per parameter (float32 anchor and error feedback) without outer momentum."""

    def state_bytes(opt):
        return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())

    model, reference = mlp(), mlp()
    adamw = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=4, replicator="none", outer_momentum=outer_momentum)
    train(reference, adamw, 1)
    train(model, opt, 1)
    numel = sum(p.numel() for p in model.parameters())
    extra = 8 + 4 * (outer_momentum > 0)
    assert state_bytes(opt) == state_bytes(adamw) + extra * numel


@pytest.mark.parametrize(("knob", "value"), [("local_steps", 0), ("local_steps", 1.5), ("outer_lr", 0.0),
                                             ("outer_momentum", 1.0), ("value_dtype", "int3")])
def test_invalid_knobs_name_field_value_and_accepted(knob, value):
    with pytest.raises(ValueError, match=f"{knob}={value!r}; accepted: "):
        FlexDeMo(mlp().parameters(), **{knob: value})


@pytest.mark.parametrize(("given", "named"), [({"overlap": "backward"}, "overlap"),
                                              ({"budget_fraction": 0.1}, "budget_fraction")])
def test_local_steps_refuse_a_per_step_schedule(given, named):
    with pytest.raises(ValueError, match=f"invalid {named}="):
        FlexDeMo(mlp().parameters(), local_steps=4, **given)


@pytest.mark.parametrize("value_dtype", ["int4", "int2"])
def test_low_bit_values_need_demo_not_random(value_dtype):
    with pytest.raises(ValueError, match="value_dtype"):
        FlexDeMo(mlp().parameters(), replicator="random", value_dtype=value_dtype)


def test_config_carries_the_local_steps_knobs():
    config = FlexDeMoConfig(local_steps=4, outer_lr=0.7, outer_momentum=0.9, value_dtype="int2")
    assert {k: config.optimizer_kwargs()[k] for k in ("local_steps", "outer_lr", "outer_momentum")} == {
        "local_steps": 4, "outer_lr": 0.7, "outer_momentum": 0.9}
    assert knobs.DEFAULTS["local_steps"] == 4 and "local_steps" in knobs.OPTIMIZER_WIDE


@pytest.mark.parametrize("value_dtype", WIDTHS)
@pytest.mark.parametrize("k", [16, 2])  # 16 of 8 x 8: positions as a bitmask; 2 of 8 x 8: as indices
def test_receivers_decode_what_the_sender_subtracted(value_dtype, k):
    """The sender's error feedback (``BlockReplicator.encode``) and a receiver's decode, through the wire bytes."""
    layout = BlockLayout.for_shape((16, 24), 8)
    coefficients = torch.randn(3, 16, 24, generator=torch.Generator().manual_seed(k)).to(
        compression.transform_dtype(value_dtype))
    coefficients[1, :8, :8] = 0  # an all-zero block: its scale must stay a normal number
    indices = compression.select_topk(coefficients, layout, k, torch.empty_like(coefficients))
    wire, order = compression.encode_positions(indices, layout.block_numel)
    positions, values = compression.gather(coefficients, layout, order)
    pieces = compression.encode_values(values, value_dtype)
    out = torch.empty(coefficients.shape, dtype=torch.float32)
    subtracted = compression.scatter_mean(positions.unsqueeze(0), compression.decode_values(pieces).view(1, -1),
                                          out=out.clone(), counts=None)
    like = [wire, *pieces]
    where, *received = unpack(pack(like).unsqueeze(0), like)
    decoded = compression.decode(where, received, layout, out=out.clone(), scratch=out.clone(), counts=None,
                                 consensus="replicas")
    assert torch.equal(decoded, subtracted)
    if value_dtype in quantize.WIDTHS:
        scale = pieces[1].float()
        assert bool((scale >= torch.finfo(torch.bfloat16).tiny).all())
        assert pack(like).numel() == layout.num_blocks * 3 * compression.block_payload_bytes(
            layout.block_numel, k, value_dtype)


@pytest.mark.parametrize("value_dtype", ["int4", "int2"])
def test_low_bit_grid_is_uniform_symmetric_and_tiny_blocks_keep_a_normal_scale(value_dtype):
    bits = quantize.WIDTHS[value_dtype]
    values = torch.tensor([[1.0, -1.0, 0.0, 0.5], [1e-41, -1e-41, 0.0, 0.0]])
    decoded = quantize.decode(quantize.encode(values, value_dtype))
    levels = 2**bits - 1
    assert decoded[0, 0] == -decoded[0, 1] and abs(decoded[0, 0] - 1.0) <= 1.0 / levels
    assert bool(decoded[1].isfinite().all()) and bool((decoded[1].abs() <= torch.finfo(torch.float32).tiny).all())
    assert quantize.encode(values, value_dtype)[0].shape == (2, 4 * bits // 8)


def test_state_dict_mid_round_holds_the_local_shard_and_round_boundary_does_not():
    model = mlp()
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=2, replicator="none", overlap="none")
    train(model, opt, 1)
    mid = opt.state_dict()
    assert all("local" in s for s in mid["state"].values()) and not any("local" in s for s in opt.state.values())
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    loaded = FlexDeMo(fresh.parameters(), lr=1.0)
    loaded.load_state_dict(mid)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    train(model, opt, 1)
    assert not any("local" in s for s in opt.state_dict()["state"].values())


def _linear_run(lrs: list[float], **streaming) -> tuple[list[float], list[float]]:
    """One parameter of 4 zeros under the loss ``sum(p)`` (gradient 1 wherever it is), local_steps=2 with a
    lossless wire (every coefficient, float32, no transform) and outer SGD at lr 1; AdamW with betas 0.5 and a
    tiny eps moves every entry by exactly the step's lr. The parameter and the anchor after each step."""
    p = nn.Parameter(torch.zeros(4))
    opt = FlexDeMo([p], lr=lrs[0], local_steps=2, replicator="none", compression_rate=1.0,
                   compression_transform="none", value_dtype="float32", betas=(0.5, 0.5), eps=1e-12,
                   weight_decay=0.0, drift_check_every=0, **streaming)
    params, anchors = [], []
    for lr in lrs:
        opt.param_groups[0]["lr"] = lr
        p.sum().backward()
        opt.step()
        opt.zero_grad()
        assert bool((p == p[0]).all())
        params.append(p[0].item())
        anchors.append(opt.state[p]["anchor"][0].item())
    return params, anchors


LRS = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]  # round r's progress: 0.75 / 4^(r-1)
ON_TIME = [0.0, -0.75, -0.75, -0.9375, -0.9375, -0.984375, -0.984375, -0.99609375]


@pytest.mark.parametrize(("streaming", "params", "anchors"), [
    # each round's pseudo-gradient (0.75, 0.1875, 0.046875, ...) moves the anchor at the round's end
    ({"overlap": "none"}, [-0.5, -0.75, -0.875, -0.9375, -0.96875, -0.984375, -0.9921875, -0.99609375], ON_TIME),
    # tau = 1: round r's exchange lands at the start of the next step, whose update then starts from the anchor:
    # the same parameters here (the gradient does not depend on where it is taken), the anchor one step later
    ({"overlap": "delayed", "outer_delay": 1}, [-0.5, -0.75, -0.875, -0.9375, -0.96875, -0.984375, -0.9921875,
                                                -0.99609375], [0.0, *ON_TIME[:-1]]),
    # tau = H = 2: it lands one round late, after an eager step whose progress (0.125, 0.03125, ...) the replica
    # gives back to the anchor and sends with the next round
    ({"overlap": "delayed", "outer_delay": 2}, [-0.5, -0.75, -0.875, -0.8125, -0.84375, -0.953125, -0.9609375,
                                                -0.98828125], [0.0, 0.0, 0.0, -0.75, -0.75, -0.9375, -0.9375,
                                                               -0.984375]),
])
def test_streaming_lands_each_exchange_outer_delay_steps_late_and_loses_no_progress(streaming, params, anchors):
    got_params, got_anchors = _linear_run(LRS, **streaming)
    assert got_params == pytest.approx(params, abs=1e-6)
    assert got_anchors == pytest.approx(anchors, abs=1e-6)


@pytest.mark.parametrize(("overlap", "steps"), [("none", 4), ("delayed", 3), ("delayed", 5)])
def test_consensus_parameters_are_the_anchor_mid_round_and_the_local_values_come_back(overlap, steps):
    """One step into round 2; streaming (outer_delay 1) also at round 1's end, where the exchange has only started."""
    model = mlp()
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=3, replicator="none", overlap=overlap)
    train(model, opt, steps)
    local = [p.detach().clone() for p in model.parameters()]
    with opt.consensus_parameters():
        for p in model.parameters():
            assert torch.equal(p, opt.state[p]["anchor"])
    for p, held in zip(model.parameters(), local):
        assert torch.equal(p, held) and not torch.equal(p, opt.state[p]["anchor"])
