"""One process: one replica trains as torch's AdamW; the trainable set may change mid-run (frozen, unfrozen,
``add_param_group``) as torch's optimizers allow; fewer trainable tensors than fragments; ``finish()``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_flexdemo import FlexDeMo
from hf_flexdemo.policies import CompressionPolicy, GuardPolicy, from_knobs

MODES = {"local steps": {}, "step-wise": {"preset": "step-wise"}}


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 8))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> float:
    x, y = batch(step)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def changes(model: nn.Sequential, opt: torch.optim.Optimizer, step: int, extra: nn.Parameter) -> None:
    """The mid-run changes: layer 2's weight frozen until step 4; layer 0's bias frozen from step 10; a new
    group (``extra``, added to the output) from step 6."""
    model[2].weight.requires_grad_(step >= 4)
    model[0].bias.requires_grad_(step < 10)
    if step == 6:
        opt.add_param_group({"params": [extra]})


def run_with_changes(make, steps: int = 24) -> tuple[nn.Sequential, nn.Parameter, list[dict]]:
    model = mlp()
    extra = nn.Parameter(torch.zeros(8))
    opt = make([p for name, p in model.named_parameters()])
    history = []
    for step in range(steps):
        changes(model, opt, step, extra)
        x, y = batch(step)
        loss = ((model(x) + extra - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        history.append({n: p.detach().clone() for n, p in [*model.named_parameters(), ("extra", extra)]})
    return model, extra, history


@pytest.mark.parametrize("mode", MODES)
def test_one_replica_trains_as_torch_adamw_exactly(mode):
    """Nothing crosses nodes, so nothing is compressed: the parameters and losses of torch's AdamW, bit for bit."""
    ours, theirs = mlp(), mlp()
    flexdemo = FlexDeMo(ours.parameters(), **from_knobs({"lr": 3e-3, **MODES[mode]}))
    adamw = torch.optim.AdamW(theirs.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(24):
        assert train_step(ours, flexdemo, step) == train_step(theirs, adamw, step)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    assert flexdemo.comm_stats["bytes_sent"] == 0 and flexdemo.finish()["bytes_sent"] == 0


def test_one_replica_still_skips_a_non_finite_gradient():
    model = mlp()
    opt = FlexDeMo(model.parameters(), lr=3e-3)
    train_step(model, opt, 0)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch(1)
    ((model(x) - y) ** 2).mean().backward()
    model[0].weight.grad[0, 0] = float("nan")
    with pytest.warns(UserWarning, match="non-finite gradient at step 1"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and opt.skipped_steps == 1


def test_replicator_none_emulates_the_wire_on_one_node():
    """The explicit opt-in: the compressed exchange runs as if there were nodes, so AdamW's result differs."""
    ours, theirs = mlp(), mlp()
    emulated = FlexDeMo(ours.parameters(), lr=3e-3, compression=CompressionPolicy(replicator="none"))
    adamw = torch.optim.AdamW(theirs.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(24):
        train_step(ours, emulated, step)
        train_step(theirs, adamw, step)
    assert not emulated.adamw_only
    assert not all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))


@pytest.mark.parametrize("mode", MODES)
def test_freezing_unfreezing_and_new_groups_follow_torch_adamw_on_one_replica(mode):
    ours = run_with_changes(lambda params: FlexDeMo(params, **from_knobs({"lr": 3e-3, **MODES[mode]})))[2]
    theirs = run_with_changes(lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0))[2]
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert all(torch.equal(a[n], b[n]) for n in a), step


@pytest.mark.parametrize("mode", MODES)
def test_the_exchange_replans_when_the_trainable_set_changes(mode):
    """On the emulated wire: a parameter unfrozen at step 4 trains from then on; one frozen at step 10 stays
    exactly where the re-plan left it (its steps before the freeze land in that step's final round; no later
    landing moves it); a group added at step 6 trains."""
    _, _, history = run_with_changes(
        lambda params: FlexDeMo(params, **from_knobs({"lr": 3e-3, "replicator": "none", **MODES[mode]})))
    frozen, unfrozen = "0.bias", "2.weight"
    assert all(torch.equal(history[step][unfrozen], history[0][unfrozen]) for step in range(4))
    assert not torch.equal(history[-1][unfrozen], history[3][unfrozen])
    assert all(torch.equal(history[step][frozen], history[10][frozen]) for step in range(11, 24))
    assert not torch.equal(history[9][frozen], history[0][frozen])
    assert torch.equal(history[5]["extra"], torch.zeros(8)) and not torch.equal(history[-1]["extra"], torch.zeros(8))


@pytest.mark.parametrize("tensors", [1, 2, 3])
def test_fewer_trainable_tensors_than_fragments_train(tensors):
    """A linear probe or an embedding-only fine-tune: the rounds run in fewer fragments (a warning says how many),
    none empty, and every trainable tensor trains past many landings and drift checks."""
    model = mlp()
    trainable = [p for p in model.parameters()][-tensors:]
    for p in model.parameters():
        p.requires_grad_(any(p is q for q in trainable))
    opt = FlexDeMo(trainable, lr=3e-3, compression=CompressionPolicy(replicator="none"),
                   guards=GuardPolicy(drift_check_every=3))
    start = [p.detach().clone() for p in trainable]
    with pytest.warns(UserWarning, match=rf"outer_fragments=4 with {tensors} trainable tensor\(s\); the rounds run "
                                         rf"in {2 if tensors > 1 else 1} fragment"):
        for step in range(120):
            train_step(model, opt, step)
    assert all(not torch.equal(a, b) for a, b in zip(start, trainable))


def test_finish_lands_the_exchange_in_flight_and_leaves_the_anchor_as_the_parameters():
    """On the emulated wire, mid-round with one fragment's exchange in flight: after ``finish()`` nothing is in
    flight, and the consensus the Trainer evaluates and saves is the parameters themselves."""
    model = mlp()
    opt = FlexDeMo(model.parameters(), lr=3e-3, compression=CompressionPolicy(replicator="none"))
    for step in range(5):
        train_step(model, opt, step)
    opt.finish()
    after = [p.detach().clone() for p in model.parameters()]
    with opt.consensus_parameters():
        assert all(torch.equal(a, p) for a, p in zip(after, model.parameters()))
    assert all(torch.equal(a, opt.state[p]["anchor"]) for a, p in zip(after, model.parameters()))
    assert "pending_update" not in opt.state_dict()["state"][0]
    train_step(model, opt, 5)  # and training goes on
    assert not all(torch.equal(a, p) for a, p in zip(after, model.parameters()))


def test_finish_refuses_an_unknown_wire():
    opt = FlexDeMo(mlp().parameters())
    with pytest.raises(ValueError, match="invalid final='bf16'; accepted: 'compressed' | 'dense'"):
        opt.finish(final="bf16")
