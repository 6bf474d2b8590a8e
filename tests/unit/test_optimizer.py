"""Single-process FlexDeMo behaviour: argument validation, lazy state, state_dict contents."""

import io
import re

import pytest
import torch
from torch import nn

from hf_flexdemo import FlexDeMo
from hf_flexdemo.optim.mesh import validate_shard_size
from hf_flexdemo.policies import CompressionPolicy, from_knobs


# FlexDeMo in its step-wise mode (an exchange every step) on the wire emulated on one process (replicator="none";
# one replica otherwise trains as AdamW), which these tests pin; a local_steps= or replicator= argument overrides it.
def step_wise(params, **knobs):
    """FlexDeMo in the step-wise mode, its knobs spelt flat (FlexDeMoConfig's names)."""
    return FlexDeMo(params, **from_knobs({"local_steps": 1, "replicator": "none", **knobs}))


def _params(dtype=torch.float32):
    return nn.Linear(8, 4).to(dtype).parameters()


@pytest.mark.parametrize(
    ("kwargs", "field", "accepted"),
    [
        ({"compression_topk": 0}, "compression_topk", "integer >= 1"),
        ({"compression_topk": 2.5}, "compression_topk", "integer >= 1"),
        ({"compression_chunk": 0}, "compression_chunk", "integer >= 1"),
        ({"momentum_decay": 1.0}, "momentum_decay", "[0, 1)"),
        ({"momentum_decay": -0.1}, "momentum_decay", "[0, 1)"),
        ({"lr": -1.0}, "lr", ">= 0"),
        ({"update": "lion"}, "update", "sign | sgd | adamw"),
        ({"replicator": "powersgd"}, "replicator", "demo | owner | leader | random | full | none"),
        ({"replicator": "leader", "value_dtype": "float8"}, "value_dtype", "'int2' | 'int4' with replicator='leader'"),
        ({"replicator": "leader", "budget_bytes": 10}, "replicator", "'demo' | 'random' with a budget"),
        ({"consensus": "mean"}, "consensus", "choosers | replicas"),
        ({"momentum": "nesterov"}, "momentum", "lr | ema | avg | adam"),
        ({"compression_feedback": 0.0}, "compression_feedback", "(0, 1]"),
        ({"replicator_seed": -1}, "replicator_seed", ">= 0"),
        ({"weight_decay": -0.1}, "weight_decay", ">= 0"),
        ({"value_dtype": "float16"}, "value_dtype", "auto | bfloat16 | float32 | float8"),
        ({"value_dtype": "float8", "replicator": "random"}, "value_dtype", "replicator='demo' for float8"),
        ({"betas": (0.9, 1.0)}, "betas", "[0, 1)"),
        ({"eps": 0.0}, "eps", "> 0"),
        ({"overlap": "async"}, "overlap", "none | backward | delayed"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb", "> 0"),
        ({"budget_bytes": 0}, "budget_bytes", "integer > 0"),
        ({"budget_fraction": 1.0}, "budget_fraction", "(0, 1)"),
        ({"budget_min_rate": 0.5, "budget_max_rate": 0.25}, "budget_min_rate, budget_max_rate", "<= budget_max_rate"),
        ({"budget_bytes": 10, "budget_fraction": 0.1}, "budget_bytes, budget_fraction", "one of them"),
        ({"budget_fraction": 0.1, "compression_topk": 4}, "compression_topk", "None with a budget"),
        ({"budget_fraction": 0.1, "replicator": "full"}, "replicator", "'demo' | 'random' with a budget"),
    ],
)
def test_invalid_arguments_name_field_and_accepted_values(kwargs, field, accepted):
    with pytest.raises(ValueError, match=rf"{field}=.*accepted:.*{re.escape(accepted)}"):
        step_wise(_params(), **kwargs)


@pytest.mark.parametrize(("replicator", "local_steps", "wire"), [
    ("demo", 1, "float8"), ("demo", 4, "int2"), ("random", 1, "bfloat16"), ("full", 1, "float32"),
    ("full", 4, "float32"), ("leader", 1, "int2"), ("leader", 4, "int2")])
def test_auto_value_dtype_is_scaled_for_demo_only(replicator, local_steps, wire):
    """The default ``value_dtype="auto"`` resolves once, so the state_dict records (and a resume keeps) the wire type;
    ``random``'s all-reduce adds values, which per-block scales would not allow; ``leader``'s adds codes on one
    shared scale; ``full`` sends the float32 momentum whole."""
    opt = FlexDeMo(_params(), local_steps=local_steps, compression=CompressionPolicy(replicator=replicator))
    assert opt.options["value_dtype"] == wire
    assert opt.options["overlap"] == ("delayed" if local_steps > 1 else "none")


def test_fp16_parameters_are_refused():
    with pytest.raises(ValueError, match=r"parameter dtype.*float16.*accepted: torch.float32 \| torch.bfloat16"):
        step_wise(_params(torch.float16))


@pytest.mark.parametrize(("shard_size", "world"), [(3, 4), (0, 4), (8, 4)])
def test_shard_size_must_divide_world(shard_size, world):
    with pytest.raises(ValueError, match=r"shard_size=.*accepted: \[1, 2, 4\]"):
        validate_shard_size(shard_size, world)


def test_state_is_lazy_and_per_parameter():
    model = nn.Linear(8, 4)
    opt = step_wise(model.parameters(), lr=0.1)
    assert not opt.state
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    state = opt.state_dict()["state"]
    assert set(state) == {0, 1}
    assert set(state[0]) == {"step", "delta", "grad_avg", "grad_avg_sq"}  # the defaults: AdamW's moments, then SGD
    saved = opt.state_dict()
    assert saved["flexdemo"] == {"options": opt.options, "steps": 1, "skipped_steps": 0, "rate": None, "pending": None,
                                 "outer_lr_follows_nodes": True}
    # per-group knobs in the param groups, optimizer-wide ones once, in the options
    assert {"compression_rate", "compression_chunk"} <= set(saved["param_groups"][0])
    assert not {"replicator", "drift_check_every"} & set(saved["param_groups"][0])
    assert {"replicator", "drift_check_every"} <= set(saved["flexdemo"]["options"])
    assert all(isinstance(k, torch.Tensor) for k in opt.state)  # only parameters key the state


@pytest.mark.parametrize("strip", ["options", "flexdemo", "one option"])
def test_a_state_dict_without_the_saved_options_is_refused_and_nothing_is_loaded(strip):
    model = nn.Linear(8, 4)
    opt = step_wise(model.parameters(), lr=0.1)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    saved = opt.state_dict()
    if strip == "flexdemo":
        del saved["flexdemo"]
    elif strip == "options":
        del saved["flexdemo"]["options"]
    else:
        del saved["flexdemo"]["options"]["consensus"]
    fresh = step_wise(model.parameters(), lr=0.2)
    with pytest.raises(ValueError, match=r"lacks the options \[.*'consensus'.*not saved by this version"):
        fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 0.2 and not fresh.state and fresh.steps == 0


def test_bf16_parameters_keep_fp32_momentum_through_state_dict():
    model = nn.Linear(8, 4).to(torch.bfloat16)
    opt = step_wise(model.parameters(), lr=0.1)
    model(torch.randn(3, 8, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    saved = {k: v["delta"].clone() for k, v in opt.state_dict()["state"].items()}
    fresh = step_wise(model.parameters(), lr=0.1)
    fresh.load_state_dict(opt.state_dict())
    for index, p in enumerate(model.parameters()):
        assert fresh.state[p]["delta"].dtype == torch.float32
        assert torch.equal(fresh.state[p]["delta"], saved[index])


def test_single_node_has_no_traffic_and_none_replicator_needs_one_node():
    model = nn.Linear(8, 4)
    opt = step_wise(model.parameters(), lr=0.1, replicator="none")
    model(torch.randn(3, 8)).sum().backward()
    before = model.weight.detach().clone()
    opt.step()
    assert opt.comm_stats["bytes_sent"] == 0 and opt.comm_stats["collectives"] == 0
    assert not torch.equal(before, model.weight)


@pytest.mark.parametrize(("update", "momentum"),
                         [("sgd", "lr"), ("rmsprop", "lr"), ("sign", "lr"), ("sgd", "adam"), ("rmsprop", "avg")])
def test_delayed_application_is_the_synchronous_update_one_step_late(update, momentum):
    """With a gradient that does not depend on the parameters, delayed application after n steps is exactly
    the synchronous optimizer after n - 1: the same momentum chain, each consensus applied one step later."""
    gradient = torch.randn(16, 24, generator=torch.Generator().manual_seed(0))

    def trained(overlap: str, steps: int) -> torch.Tensor:
        weight = nn.Parameter(torch.zeros(16, 24))
        opt = step_wise([weight], lr=1e-2, replicator="none", update=update, momentum=momentum, overlap=overlap,
                       drift_check_every=0)
        for _ in range(steps):
            weight.grad = gradient.clone()
            opt.step()
        return weight.detach()

    assert torch.equal(trained("delayed", 1), torch.zeros(16, 24))
    for steps in (2, 5):
        assert torch.equal(trained("delayed", steps), trained("none", steps - 1))


@pytest.mark.parametrize("transform", ["dct", "none"])
@pytest.mark.parametrize(("momentum", "update", "beta1", "state"), [
    ("adam", "sgd", 0.9, {"step", "delta", "grad_avg", "grad_avg_sq"}),
    ("lr", "rmsprop", 0.0, {"step", "delta", "exp_avg_sq"}),
])
def test_without_compression_is_adamw(momentum, update, beta1, state, transform):
    """With every coefficient kept (rate 1, float32 values) the momentum is spent each step, so
    ``momentum="adam"`` (AdamW's own direction into the momentum) with ``update="sgd"`` is torch's AdamW, and
    ``update="rmsprop"`` on DeMo's momentum is torch's AdamW with ``beta1 = 0``."""
    gradients = torch.randn(12, 16, 24, generator=torch.Generator().manual_seed(0))
    ours, reference = nn.Parameter(torch.ones(16, 24)), nn.Parameter(torch.ones(16, 24))
    opt = step_wise([ours], lr=1e-2, weight_decay=0.1, momentum=momentum, update=update, replicator="none",
                   compression_rate=1.0, compression_chunk=8, compression_transform=transform, value_dtype="float32",
                   drift_check_every=0)
    adamw = torch.optim.AdamW([reference], lr=1e-2, weight_decay=0.1, betas=(beta1, 0.999))
    for gradient in gradients:
        ours.grad, reference.grad = gradient.clone(), gradient.clone()
        opt.step()
        adamw.step()
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    assert set(opt.state[ours]) == state


def test_without_a_transform_top_k_keeps_each_blocks_largest_values():
    """``compression_transform="none"`` (SparseLoCo's selection): the step is each 8 x 8 block's 5 largest
    momentum values, exactly, and error feedback keeps the rest."""
    gradient = torch.randn(16, 24, generator=torch.Generator().manual_seed(0))
    weight = nn.Parameter(torch.zeros(16, 24))
    opt = step_wise([weight], lr=1.0, momentum="lr", update="sgd", replicator="none", compression_transform="none",
                   compression_topk=5, compression_chunk=8, momentum_decay=0.0, value_dtype="float32",
                   drift_check_every=0)
    weight.grad = gradient.clone()
    opt.step()
    blocks = gradient.view(2, 8, 3, 8).transpose(1, 2).reshape(6, 64)
    largest = blocks.abs().topk(5, dim=1).indices
    kept = torch.zeros_like(blocks).scatter(1, largest, blocks.gather(1, largest))
    kept = kept.view(2, 3, 8, 8).transpose(1, 2).reshape(16, 24)
    assert torch.equal(weight.detach(), -kept)
    assert torch.equal(opt.state[weight]["delta"], gradient - kept)


@pytest.mark.parametrize("overlap", ["none", "delayed"])
@pytest.mark.parametrize("momentum", ["avg", "adam"])
def test_gradient_moments_skip_and_resume_exactly(momentum, overlap):
    """The replica's gradient moments are candidates like the momentum: a skipped (non-finite) step leaves them
    as they were, and 8 steps straight equal 5, a state_dict through bytes into a fresh optimizer, and 3."""
    gradients = torch.randn(8, 16, 24, generator=torch.Generator().manual_seed(1))
    gradients[2, 3, 4] = float("nan")

    def optimizer(weight: nn.Parameter) -> FlexDeMo:
        return step_wise([weight], lr=1e-2, momentum=momentum, update="sgd" if momentum == "adam" else "rmsprop",
                        replicator="none", overlap=overlap, drift_check_every=0)

    def run(opt: FlexDeMo, weight: nn.Parameter, steps: range) -> None:
        for i in steps:
            weight.grad = gradients[i].clone()
            opt.step()

    straight = nn.Parameter(torch.zeros(16, 24))
    opt = optimizer(straight)
    with pytest.warns(UserWarning, match="non-finite"):
        run(opt, straight, range(8))
    assert opt.skipped_steps == 1 and all(torch.isfinite(v).all() for v in opt.state[straight].values())

    resumed = nn.Parameter(torch.zeros(16, 24))
    first = optimizer(resumed)
    with pytest.warns(UserWarning, match="non-finite"):
        run(first, resumed, range(5))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    second = optimizer(resumed)
    second.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    run(second, resumed, range(5, 8))
    assert torch.equal(straight, resumed)
    for key, value in opt.state[straight].items():
        assert torch.equal(value, second.state[resumed][key]), key
