"""``local_steps`` on one process: H = 1 is today's optimizer bit for bit, the knobs' checks, the memory bound,
and the low-bit wire values: what receivers decode is what the sender's error feedback subtracted."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
from torch import nn

from hf_flexdemo import FlexDeMo, FlexDeMoConfig, knobs
from hf_flexdemo.optim import local_shards, local_steps
from hf_flexdemo.policies import CompressionPolicy, OuterPolicy, from_knobs
from hf_flexdemo.trainer.model_card import training_mode
from hf_flexdemo.wire import compression, quantize
from hf_flexdemo.wire.collectives import pack, unpack
from hf_flexdemo.wire.dct import BlockLayout

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
    train(one, FlexDeMo(one.parameters(), lr=1e-2, local_steps=1,
                        compression=CompressionPolicy(chunk=8, replicator="none")), 5)
    train(before, FlexDeMo(before.parameters(), lr=1e-2, local_steps=1, overlap="none",
                           compression=CompressionPolicy(chunk=8, value_dtype="float8", replicator="none")), 5)
    for a, b in zip(one.parameters(), before.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("value_dtype", WIDTHS)
def test_local_steps_train_and_restart_from_the_anchor(value_dtype):
    model = mlp()
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=3, overlap="none",
                   compression=CompressionPolicy(value_dtype=value_dtype, replicator="none", chunk=8))
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
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=4, compression=CompressionPolicy(replicator="none"),
                   outer=OuterPolicy(momentum=outer_momentum))
    train(reference, adamw, 1)
    train(model, opt, 1)
    numel = sum(p.numel() for p in model.parameters())
    extra = 8 + 4 * (outer_momentum > 0)
    assert state_bytes(opt) == state_bytes(adamw) + extra * numel


@pytest.mark.parametrize(("knob", "value"), [("local_steps", 0), ("local_steps", 1.5), ("outer_lr", 0.0),
                                             ("outer_momentum", 1.0), ("value_dtype", "int3")])
def test_invalid_knobs_name_field_value_and_accepted(knob, value):
    with pytest.raises(ValueError, match=f"{knob}={value!r}; accepted: "):
        FlexDeMo(mlp().parameters(), **from_knobs({knob: value}))


@pytest.mark.parametrize(("given", "named"), [({"overlap": "backward"}, "overlap"),
                                              ({"budget_fraction": 0.1}, "budget_fraction")])
def test_local_steps_refuse_a_per_step_schedule(given, named):
    with pytest.raises(ValueError, match=f"invalid {named}="):
        FlexDeMo(mlp().parameters(), **from_knobs({"local_steps": 4, **given}))


@pytest.mark.parametrize("value_dtype", ["int4", "int2"])
def test_low_bit_values_need_demo_not_random(value_dtype):
    with pytest.raises(ValueError, match="value_dtype"):
        FlexDeMo(mlp().parameters(), compression=CompressionPolicy(replicator="random", value_dtype=value_dtype))


def test_config_carries_the_local_steps_knobs():
    config = FlexDeMoConfig(local_steps=4, outer_lr=0.7, outer_momentum=0.9, value_dtype="int2")
    assert {k: config.optimizer_kwargs()[k] for k in ("local_steps", "outer_lr", "outer_momentum")} == {
        "local_steps": 4, "outer_lr": 0.7, "outer_momentum": 0.9}
    assert knobs.DEFAULTS["local_steps"] is None and "local_steps" in knobs.OPTIMIZER_WIDE


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
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=2, overlap="none",
                   compression=CompressionPolicy(replicator="none"))
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


# A lossless wire (every coefficient, float32, no transform) and an AdamW with betas 0.5 and a tiny eps, which
# under the loss ``sum(p)`` (gradient 1 wherever it is) moves every entry by exactly the step's lr.
EXACT = dict(replicator="none", compression_rate=1.0, compression_transform="none", value_dtype="float32",
             betas=(0.5, 0.5), eps=1e-12, weight_decay=0.0)


def _linear_run(lrs: list[float], **streaming) -> tuple[list[float], list[float]]:
    """One parameter of 4 zeros under the loss ``sum(p)``, local_steps=2 on the ``EXACT`` wire and outer SGD at
    lr 1, the whole model in one round. The parameter and the anchor after each step."""
    p = nn.Parameter(torch.zeros(4))
    opt = FlexDeMo([p], **from_knobs({"lr": lrs[0], "local_steps": 2, "outer_fragments": 1, "drift_check_every": 0,
                                      **EXACT, **streaming}))
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
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=3, overlap=overlap,
                   compression=CompressionPolicy(replicator="none"))
    train(model, opt, steps)
    local = [p.detach().clone() for p in model.parameters()]
    with opt.consensus_parameters():
        for p in model.parameters():
            assert torch.equal(p, opt.state[p]["anchor"])
    for p, held in zip(model.parameters(), local):
        assert torch.equal(p, held) and not torch.equal(p, opt.state[p]["anchor"])


# ---- outer_fragments --------------------------------------------------------------------------------------------


def _state_of(opt: FlexDeMo) -> list[dict[str, torch.Tensor]]:
    return [{key: value.clone() for key, value in opt.state[p].items()}
            for group in opt.param_groups for p in group["params"]]


def test_four_fragments_are_the_default_bit_for_bit_and_one_is_not():
    """``outer_fragments=4`` spelled out trains as the default over three rounds (parameters, every state tensor,
    the traffic counters of every step); the whole model in one round trains otherwise (the choice reaches the
    schedule)."""
    runs = {}
    for name, given in (("default", {}), ("four", {"outer_fragments": 4}), ("one", {"outer_fragments": 1})):
        model = mlp()
        opt = FlexDeMo(model.parameters(), **from_knobs({"lr": 1e-2, "compression_chunk": 8, "replicator": "none",
                                                         "drift_check_every": 3, **given}))
        stats = []
        for step in range(12):
            train_step = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 16, generator=train_step), torch.randn(8, 8, generator=train_step)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            stats.append(opt.comm_stats)
        runs[name] = ([p.detach().clone() for p in model.parameters()], _state_of(opt), stats, opt.options)
    (params, states, stats, options), (four_params, four_states, four_stats, four_options) = (runs["default"],
                                                                                            runs["four"])
    assert options == four_options and options["outer_fragments"] == 4 and stats == four_stats
    assert all(torch.equal(a, b) for a, b in zip(params, four_params))
    for state, four in zip(states, four_states):
        assert state.keys() == four.keys() and all(torch.equal(state[k], four[k]) for k in state)
    assert not all(torch.equal(a, b) for a, b in zip(params, runs["one"][0]))


@pytest.mark.parametrize(("given", "chosen"), [
    ({}, 4), ({"local_steps": 8}, 4), ({"local_steps": 6}, 3), ({"local_steps": 2}, 2), ({"local_steps": 5}, 1),
    ({"outer_delay": 2}, 4), ({"outer_delay": 3}, 2), ({"local_steps": 4, "outer_delay": 2}, 2),
    ({"local_steps": 4, "outer_delay": 3}, 1),
    ({"overlap": "none"}, 1), ({"local_steps": 1}, 1), ({"preset": "step-wise"}, 1), ({"outer_fragments": 2}, 2),
])
def test_fragments_left_to_the_package_are_the_most_up_to_4_that_fit(given, chosen):
    """``outer_fragments=None`` (the default) picks the largest divisor F <= 4 of ``local_steps`` with
    ``outer_delay <= local_steps / F`` when streamed, else 1, so that no setting that was valid before the default
    changed is refused; the optimizer and the config record the choice."""
    opt = FlexDeMo(mlp().parameters(), **from_knobs(given))
    assert opt.options["outer_fragments"] == chosen
    config = {("flexdemo_preset" if key == "preset" else key): value for key, value in given.items()}
    assert FlexDeMoConfig(**config).for_run(None).outer_fragments == chosen


@pytest.mark.parametrize(("given", "chosen"), [
    ({}, 2), ({"local_steps": 16}, 2), ({"local_steps": 4}, 1), ({"local_steps": 2}, 1), ({"outer_fragments": 1}, 2),
    ({"outer_fragments": 2, "local_steps": 4}, 2), ({"outer_delay": 1}, 1), ({"outer_delay": 4, "local_steps": 16}, 4),
    ({"overlap": "none"}, 1), ({"local_steps": 1}, 1), ({"preset": "step-wise"}, 1),
])
def test_delay_left_to_the_package_lasts_until_the_next_fragment_starts_at_most_2(given, chosen):
    """``outer_delay=None`` (the default) lets each fragment's streamed exchange travel until the next fragment's
    starts (``local_steps / outer_fragments`` steps), at most 2, and is 1 where nothing streams; the fragments are
    chosen first, as before; the optimizer and the config record the choice."""
    opt = FlexDeMo(mlp().parameters(), **from_knobs(given))
    assert opt.options["outer_delay"] == chosen
    config = {("flexdemo_preset" if key == "preset" else key): value for key, value in given.items()}
    assert FlexDeMoConfig(**config).for_run(None).outer_delay == chosen


@pytest.mark.parametrize(("given", "chosen"), [
    ({}, "none"), ({"local_steps": 2}, "none"), ({"local_steps": 1}, "dct"), ({"preset": "step-wise"}, "dct"),
    ({"compression_transform": "dct"}, "dct"), ({"local_steps": 1, "compression_transform": "none"}, "none"),
])
def test_transform_left_to_the_package_is_none_with_local_steps_and_dct_step_wise(given, chosen):
    """``compression_transform="auto"`` (the default) resolves once, from ``local_steps``, in the optimizer's
    groups, its defaults (a later ``add_param_group``) and the config."""
    opt = FlexDeMo(mlp().parameters(), **from_knobs(given))
    assert opt.param_groups[0]["compression_transform"] == opt.defaults["compression_transform"] == chosen
    config = {("flexdemo_preset" if key == "preset" else key): value for key, value in given.items()}
    assert FlexDeMoConfig(**config).for_run(None).compression_transform == chosen


def test_a_groups_own_auto_transform_resolves_too():
    first, second = list(mlp().parameters())[:2]
    opt = FlexDeMo([{"params": [first]}, {"params": [second], "compression_transform": "auto"}], local_steps=1,
                   compression=CompressionPolicy(transform="none"))
    assert [group["compression_transform"] for group in opt.param_groups] == ["none", "dct"]


def test_partition_puts_the_largest_first_into_the_least_loaded_fragment():
    assert local_steps.partition([5, 3, 3, 2, 1], 2) == [0, 1, 1, 0, 1]  # loads 7 and 7
    assert local_steps.partition([2, 2, 2], 2) == [0, 1, 0]  # ties: the earlier item, the lower fragment
    assert local_steps.partition([1, 9], 3) == [1, 0]  # a fragment may stay empty
    model = mlp()  # 512 + 32 + 256 + 8 elements: the first weight alone, the rest together
    opt = FlexDeMo(model.parameters(), lr=1e-2, local_steps=4, outer=OuterPolicy(fragments=2),
                   compression=CompressionPolicy(replicator="none"))
    train(model, opt, 1)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    fragments = [[index[id(p)] for p in members] for members in opt.mode.members]
    assert fragments == [[0], [1, 2, 3]]
    stacks = [stack for bucket in opt.exchange_plan() for stack in bucket.stacks]
    assert sorted(index[id(p)] for s in stacks for p in s.params) == [0, 1, 2, 3]
    for stack in stacks:  # a stack is exchanged with its fragment: all its parameters are of that one
        assert all(index[id(p)] in fragments[stack.fragment] for p in stack.params)


def _fragments_run(lrs: list[float], **knobs) -> dict[str, tuple[list[float], list[float]]]:
    """``_linear_run`` with two parameters, ``a`` (4 zeros: fragment 0, the larger) and ``b`` (2 zeros: fragment 1)."""
    a, b = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(2))
    opt = FlexDeMo([a, b], **from_knobs({"lr": lrs[0], "outer_fragments": 2, **EXACT, **knobs}))
    seen: dict[str, tuple[list[float], list[float]]] = {"a": ([], []), "b": ([], [])}
    for lr in lrs:
        opt.param_groups[0]["lr"] = lr
        (a.sum() + b.sum()).backward()
        opt.step()
        opt.zero_grad()
        for name, p in (("a", a), ("b", b)):
            assert bool((p == p[0]).all())
            seen[name][0].append(p[0].item())
            seen[name][1].append(opt.state[p]["anchor"][0].item())
    assert [[p.shape[0] for p in members] for members in opt.mode.members] == [[4], [2]]
    return seen


STRAIGHT = [-0.5, -0.75, -0.875, -0.9375, -0.96875, -0.984375, -0.9921875, -0.99609375]  # every step at its lr


@pytest.mark.parametrize(("knobs", "a", "b"), [
    # H = 4, F = 2, tau = 1: a's rounds end after steps 2 and 6 (the first round is H / F = 2 steps), land in steps
    # 3 and 7; b's end after 4 and 8, land in 5 (and 9). Each anchor moves at its own landings only, by its round.
    ({"local_steps": 4, "outer_delay": 1},
     (STRAIGHT, [0.0, 0.0, -0.75, -0.75, -0.75, -0.75, -0.984375, -0.984375]),
     (STRAIGHT, [0.0, 0.0, 0.0, 0.0, -0.9375, -0.9375, -0.9375, -0.9375])),
    # tau = H / F = 2: a lands in steps 4 and 8, b in step 6; the eager step's progress (a: 0.125 in step 3, 0.0078125
    # in 7; b: 0.03125 in 5) is given back at the landing and sent with the fragment's next round (a's second round
    # sends 0.125 + 0.109375 = 0.234375: the anchor reaches -0.984375)
    ({"local_steps": 4, "outer_delay": 2},
     ([-0.5, -0.75, -0.875, -0.8125, -0.84375, -0.859375, -0.8671875, -0.98828125],
      [0.0, 0.0, 0.0, -0.75, -0.75, -0.75, -0.75, -0.984375]),
     ([-0.5, -0.75, -0.875, -0.9375, -0.96875, -0.953125, -0.9609375, -0.96484375],
      [0.0, 0.0, 0.0, 0.0, 0.0, -0.9375, -0.9375, -0.9375])),
    # H = F = 2, tau = 1: a's rounds end after odd steps (its first after one step) and land in even ones, b's
    # (the last fragment) as the whole model's with F = 1: [0.0, *ON_TIME[:-1]]
    ({"local_steps": 2, "outer_delay": 1},
     (STRAIGHT, [0.0, -0.5, -0.5, -0.875, -0.875, -0.96875, -0.96875, -0.9921875]),
     (STRAIGHT, [0.0, *ON_TIME[:-1]])),
])
@pytest.mark.parametrize("drift_check_every", [0, 1])  # 1: the drift check at every landing leaves the rest alone
def test_each_fragment_lands_at_its_own_steps_and_loses_no_progress(knobs, a, b, drift_check_every):
    seen = _fragments_run(LRS, drift_check_every=drift_check_every, **knobs)
    assert seen["a"][0] == pytest.approx(a[0], abs=1e-6) and seen["a"][1] == pytest.approx(a[1], abs=1e-6)
    assert seen["b"][0] == pytest.approx(b[0], abs=1e-6) and seen["b"][1] == pytest.approx(b[1], abs=1e-6)


def test_fragments_resume_with_an_exchange_in_flight_bit_for_bit():
    """12 straight steps vs 5, ``state_dict`` into a fresh optimizer, 7 more (H = 4, F = 2, tau = 2: fragment 1's
    first round ended after step 4 and lands in step 6); only its parameters hold the exchange in flight."""
    kwargs = dict(lr=1e-2, compression_chunk=8, local_steps=4, outer_fragments=2, outer_delay=2, outer_momentum=0.9,
                  drift_check_every=1, replicator="none")
    straight = mlp()
    train(straight, FlexDeMo(straight.parameters(), **from_knobs(kwargs)), 12)
    model = mlp()
    first = FlexDeMo(model.parameters(), **from_knobs(kwargs))
    train(model, first, 5)
    saved = first.state_dict()
    in_flight = sorted(index for index, state in saved["state"].items() if "pending_update" in state)
    assert in_flight == [1, 2, 3] and saved["flexdemo"]["pending"] is not None  # fragment 1: all but the first weight
    assert all("local" in state for state in saved["state"].values())  # replicas differ: each local shard travels
    fresh = mlp()
    resumed = FlexDeMo(fresh.parameters(), lr=1.0)
    resumed.load_state_dict(copy.deepcopy(saved))
    assert resumed.options["outer_fragments"] == 2

    def rest(model, opt):
        for step in range(5, 12):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()

    rest(fresh, resumed)
    for a, b in zip(straight.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("given", "field", "accepted"), [
    ({"local_steps": 4, "outer_fragments": 3}, "outer_fragments", r"a divisor of local_steps=4: 1 \| 2 \| 4"),
    ({"local_steps": 6, "outer_fragments": 4}, "outer_fragments", r"a divisor of local_steps=6: 1 \| 2 \| 3 \| 6"),
    ({"local_steps": 4, "outer_fragments": 2, "outer_delay": 3}, "outer_delay",
     r"1 <= outer_delay <= local_steps / outer_fragments = 4 / 2 = 2 with outer_fragments=2 \(one fragment's "
     r"exchange in flight at a time\); lower outer_delay or outer_fragments"),
    ({"local_steps": 1, "outer_fragments": 2}, "outer_fragments", r"1 with local_steps=1 .*set local_steps=H > 1"),
    ({"local_steps": 4, "outer_fragments": 2, "overlap": "none"}, "outer_fragments",
     r"1 with overlap='none' \(fragments need the streamed exchange\); set overlap='delayed' or 'auto'"),
    *(({"outer_fragments": bad}, "outer_fragments", r"None \(the package's choice\) or an integer >= 1")
      for bad in (2.0, True, 0)),
])
def test_invalid_fragments_name_field_value_accepted_and_fix(given, field, accepted):
    value = given[field]
    for build in (lambda: FlexDeMo(mlp().parameters(), **from_knobs(given)), lambda: FlexDeMoConfig(**given)):
        with pytest.raises(ValueError, match=rf"invalid {field}={value!r}; accepted: {accepted}"):
            build()


@pytest.mark.parametrize(("max_steps", "parameters", "rounds", "fragments", "delay"), [
    (None, None, 8, 4, 2), (0, None, 8, 4, 2), (1000, None, 8, 4, 2), (5000, None, 8, 4, 2), (999, None, 4, 4, 1),
    (300, None, 4, 4, 1), (1, None, 4, 4, 1), (2000, 8_000_000, 16, 4, 2), (5000, 10**9, 16, 4, 2),
    (1999, 10**9, 8, 4, 2), (2000, 7_999_999, 8, 4, 2), (999, 10**9, 4, 4, 1), (None, 10**9, 8, 4, 2),
    (0, 10**9, 8, 4, 2)])
def test_rounds_left_to_the_package_follow_the_runs_length_and_the_models_size(max_steps, parameters, rounds,
                                                                               fragments, delay):
    """``local_steps=None`` (the default) is 4 for a run known to be shorter than 1,000 steps, 16 for one of 2,000
    steps or more on 8 M parameters or more, and 8 otherwise (a length not known: 8, as the optimizer built by hand
    takes, whatever the size); the knobs that follow from it wait for it, so a short run's fragments land after one
    step, a long run's after two."""
    waiting = FlexDeMoConfig()
    assert (waiting.local_steps, waiting.outer_fragments, waiting.outer_delay) == (None, None, None)
    config = waiting.for_run(max_steps, parameters)
    assert (config.local_steps, config.outer_fragments, config.outer_delay) == (rounds, fragments, delay)
    assert config.overlap == "delayed" and config.value_dtype == "int2" and config.compression_transform == "none"
    assert config.for_run(300) is config  # resolved once: a later length does not move it
    assert FlexDeMoConfig(local_steps=16).for_run(max_steps).local_steps == 16  # a value set is kept
    assert FlexDeMoConfig(flexdemo_preset="step-wise").for_run(max_steps).local_steps == 1
    assert FlexDeMoConfig(method="adamw").for_run(max_steps).local_steps is None  # the baseline reads no knob
    assert FlexDeMo(mlp().parameters()).options["local_steps"] == knobs.LONG_RUN_LOCAL_STEPS == 8


def test_rounds_left_to_the_package_refuse_what_no_length_fits():
    """A knob that fits only the long runs' rounds is refused once the length picks the short ones, naming the fix."""
    config = FlexDeMoConfig(outer_fragments=8)  # a divisor of 8, not of 4
    assert config.for_run(2000).outer_fragments == 8
    with pytest.raises(ValueError, match=r"invalid outer_fragments=8; accepted: a divisor of local_steps=4"):
        config.for_run(300)


def test_config_carries_outer_fragments():
    config = FlexDeMoConfig(outer_fragments=2).for_run(None)
    assert config.optimizer_kwargs()["outer_fragments"] == 2 and config.overlap == "delayed"
    assert knobs.DEFAULTS["outer_fragments"] is None and "outer_fragments" in knobs.OPTIMIZER_WIDE


@pytest.mark.parametrize("knobs", [{"overlap": "none"}, {}, {"outer_delay": 2}, {"outer_delay": 4},
                                   {"outer_fragments": 2}, {"outer_fragments": 4}, {"outer_fragments": 2,
                                                                                     "outer_delay": 2}])
@pytest.mark.parametrize("bad_step", [0, 1, 3, 4, 5])
def test_one_non_finite_gradient_costs_one_round_and_training_goes_on(knobs, bad_step):
    """A NaN gradient at any phase of a round (before, at, between a launch and its landing) is skipped once:
    every replica restarts from its anchor, the parameters, moments and error feedback are finite again, and the
    rounds after it exchange and move the anchor."""
    model = mlp()
    opt = FlexDeMo(model.parameters(),
                   **from_knobs({"lr": 1e-2, "compression_chunk": 8, "replicator": "none", **knobs}))
    anchors = []
    with pytest.warns(UserWarning, match="non-finite gradient"):
        for step in range(24):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
            ((model(x) - y) ** 2).mean().backward()
            if step == bad_step:
                next(model.parameters()).grad[0, 0] = float("nan")
            opt.step()
            opt.zero_grad()
            anchors.append([opt.state[p]["anchor"].clone() for p in model.parameters()])
    assert opt.skipped_steps == 1
    for p in model.parameters():
        assert all(torch.isfinite(t).all() for t in (p, *opt.state[p].values()) if t.is_floating_point())
    assert all(not torch.equal(a, b) for a, b in zip(anchors[-9], anchors[-1]))  # the last rounds moved every anchor


@pytest.mark.parametrize(("replicas", "given", "resolved"), [(1, None, 1.0), (2, None, 1.0), (3, None, math.sqrt(1.5)),
                                                             (8, None, 2.0), (32, None, 4.0), (8, 0.5, 0.5)])
def test_the_outer_step_defaults_to_the_square_root_of_half_the_nodes(replicas, given, resolved):
    assert knobs.resolve_outer_lr(given, replicas, "demo") == resolved


@pytest.mark.parametrize("replicator", ["full", "owner"])
@pytest.mark.parametrize(("replicas", "given", "resolved"), [(2, None, 1.0), (8, None, 1.0), (32, None, 1.0),
                                                             (8, 2.0, 2.0)])
def test_replicators_that_land_a_mean_default_to_the_mean_itself(replicator, replicas, given, resolved):
    """The dense mean and the owners' top-k of the mean overshoot at sqrt(R / 2): their default step is 1."""
    assert knobs.resolve_outer_lr(given, replicas, replicator) == resolved
    described = training_mode(FlexDeMoConfig(replicator=replicator, outer_lr=given), replicas)
    assert f"outer lr {resolved:g}" in described


def test_one_node_resolves_the_outer_step_and_records_it():
    opt = FlexDeMo(mlp().parameters(), compression=CompressionPolicy(replicator="none"))
    assert opt.options["outer_lr"] == 1.0 and opt.state_dict()["flexdemo"]["options"]["outer_lr"] == 1.0


@pytest.mark.parametrize(("given", "loaded"), [(None, 1.0), (2.0, 2.0)])
def test_a_resume_on_other_nodes_resolves_a_default_outer_step_again(given, loaded, caplog):
    """A checkpoint written on 8 nodes at the default outer step (2 there) resumes here, on one node, at this
    topology's 1; an outer step the user set travels with the checkpoint."""
    saved = FlexDeMo(mlp().parameters(), outer=OuterPolicy(lr=given),
                     compression=CompressionPolicy(replicator="none")).state_dict()
    assert saved["flexdemo"]["outer_lr_follows_nodes"] is (given is None)
    saved["flexdemo"]["options"]["outer_lr"] = knobs.resolve_outer_lr(given, 8, "demo")  # as written on 8 nodes
    opt = FlexDeMo(mlp().parameters(), outer=OuterPolicy(lr=3.0), compression=CompressionPolicy(replicator="none"))
    with caplog.at_level(logging.INFO, logger="hf_flexdemo"):
        opt.load_state_dict(saved)
    assert opt.options["outer_lr"] == loaded and opt.mode.lr == loaded
    assert ("outer_lr follows the nodes: 2 in the checkpoint, 1 on 1 node(s) now" in caplog.text) is (given is None)
    assert opt.state_dict()["flexdemo"]["outer_lr_follows_nodes"] is (given is None)


def test_one_node_keeps_only_adamw_state_from_a_checkpoint_of_several():
    """A checkpoint of several nodes resumed on one (an elastic run that lost a node): that node trains as AdamW, so
    the anchor, error feedback and mid-round local shard are dropped on load; kept, they would go stale while it
    trains and come back as the starting point of the next resume on several nodes (a streamed exchange held in
    the checkpoint too: landed there, it would find its state gone)."""
    model = mlp()
    opt = FlexDeMo(model.parameters())
    model(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    saved = opt.state_dict()
    for state in saved["state"].values():
        state |= {"anchor": torch.zeros_like(state["exp_avg"]), "delta": torch.ones_like(state["exp_avg"]),
                  local_shards.LOCAL_KEY: torch.ones_like(state["exp_avg"]),
                  "pending_delta": torch.ones_like(state["exp_avg"])}
    saved["flexdemo"]["pending"] = {"skip": False, "own_nonfinite": False, "lrs": [1.0], "step": 0}
    resumed = FlexDeMo(model.parameters())
    resumed.load_state_dict(saved)
    assert all(set(state) == {"step", "exp_avg", "exp_avg_sq"} for state in resumed.state.values())
    again = resumed.state_dict()
    assert all(set(state) == {"step", "exp_avg", "exp_avg_sq"} for state in again["state"].values())
    assert resumed.exchange.held is None and again["flexdemo"]["pending"] is None


def test_the_consensus_view_of_an_optimizer_with_nothing_anchored_is_the_parameters():
    p = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([p], lr=0.1)
    with local_shards.anchored(optimizer):
        assert torch.equal(p.detach(), torch.ones(3))
    assert torch.equal(p.detach(), torch.ones(3))
