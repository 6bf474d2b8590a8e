"""``progress_scale="batch"`` (hf_flexdemo.optim.progress_scale): the length factor's limits, and on gradients of a
known signal and noise, the factor the extra progress carries is the ratio of AdamW's step on R nodes' mean gradient
to one node's."""

from __future__ import annotations

import math

import pytest
import torch

from hf_flexdemo.optim import progress_scale
from hf_flexdemo.optim.one_replica import adamw_state, adamw_step
from hf_flexdemo.optim.plan import Stack
from hf_flexdemo.wire.dct import BlockLayout


@pytest.mark.parametrize("nodes", [1, 2, 8])
def test_the_length_factor_runs_from_1_for_pure_signal_to_sqrt_r_for_pure_noise(nodes):
    v = torch.tensor([4.0, 4.0, 4.0, 4.0, 4.0, 0.0])
    s = torch.tensor([4.0, 9.0, 0.0, -1.0, 1.0, 0.0])  # s = v, above v, 0, below 0, between; v = 0
    (f,) = progress_scale.length_factors([v], [s], nodes)
    between = math.sqrt(nodes * 4.0 / (4.0 + (nodes - 1) * 1.0))
    torch.testing.assert_close(f, torch.tensor([1.0, 1.0, nodes**0.5, nodes**0.5, between, 1.0]))


def _stack(p: torch.Tensor, scale: progress_scale.Unscaled | None = None) -> Stack:
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    state = (scale or progress_scale.BatchScaled(1)).new_state(adamw_state({}, p), p)
    return Stack(index=0, layout=BlockLayout.for_shape(tuple(p.shape), 8), group=group, params=[p], states=[state])


def _factors(scale: progress_scale.Unscaled, mus: list[torch.Tensor]) -> torch.Tensor:
    """Run AdamW on unit noise around each of ``mus`` in turn (one step each); per element, the factor the extra
    progress of the last step carries: 1 + extra / the step AdamW took."""
    torch.manual_seed(0)
    p = torch.zeros(mus[0].numel(), requires_grad=True)
    stack = _stack(p, scale)
    for mu in mus:
        p.grad = mu + torch.randn(mu.numel())
        with torch.no_grad():
            before = p.detach().clone()
            adamw_step([stack])
            scale.restart([stack])
            scale.after_inner([stack])
    assert torch.equal(scale.positions(stack)[0], p.detach() + stack.states[0][progress_scale.EXTRA])
    return 1 + stack.states[0][progress_scale.EXTRA] / (p.detach() - before)


@pytest.mark.parametrize(("decay", "within"), [(None, 0.05), (0.99, 0.08)])
@pytest.mark.parametrize("nodes", [2, 8])
def test_the_extra_progress_is_the_nodes_batch_step_less_the_nodes_own(nodes, decay, within):
    """Three blocks of elements, expected gradient 0, 0.3 and 1 under unit noise: after 1,500 steps the extra progress
    of one more step, per block, is (f - 1) times the step AdamW took, f = sqrt((mu^2 + 1) / (mu^2 + 1 / R)), with the
    estimate's EMAs at AdamW's beta2 or at a decay of their own. A memory of 100 steps reads the signal with more
    noise, which the clip at 0 turns into a shorter factor where there is none (2.64 for sqrt(8) = 2.83)."""
    n = 1024
    mu = torch.cat([torch.zeros(n), torch.full((n,), 0.3), torch.ones(n)])
    ratio = _factors(progress_scale.BatchScaled(nodes, decay), [mu] * 1500)
    for block, m in enumerate((0.0, 0.3, 1.0)):
        expected = math.sqrt((m * m + 1) / (m * m + 1 / nodes))
        got = ratio[block * n:(block + 1) * n].mean().item()
        assert abs(got - expected) < within * expected, (m, got, expected)


def test_a_decay_of_its_own_follows_a_falling_signal_that_beta2_still_remembers():
    """1,000 steps of signal 1 under unit noise, then 600 of none: with its own decay of 0.99 the factor at 8 nodes is
    back near sqrt(8), the noise's (2.62); at AdamW's beta2 of 0.999 it still reads the signal of the first 1,000 steps
    (1.60)."""
    n = 2048
    mus = [torch.ones(n)] * 1000 + [torch.zeros(n)] * 600
    own = _factors(progress_scale.BatchScaled(8, 0.99), mus).mean().item()
    shared = _factors(progress_scale.BatchScaled(8), mus).mean().item()
    assert abs(own - 8**0.5) < 0.1 * 8**0.5, own
    assert shared < 0.7 * own, (shared, own)


def test_on_one_node_nothing_is_added():
    torch.manual_seed(0)
    p = torch.zeros(64, requires_grad=True)
    stack = _stack(p)
    for _ in range(5):
        p.grad = torch.randn(64)
        with torch.no_grad():
            adamw_step([stack])
            progress_scale.accumulate([stack], 1)
    assert not stack.states[0][progress_scale.EXTRA].any()
    assert stack.states[0][progress_scale.LAG].any()


def test_for_option_gives_a_no_op_for_none_and_the_functions_for_batch():
    p = torch.nn.Parameter(torch.randn(4, 4))
    stack = _stack(p)
    unscaled = progress_scale.for_option("none", 4)
    assert unscaled.new_state({}, p) == {} and unscaled.per_node == ()
    assert unscaled.positions(stack)[0] is stack.shards()[0]
    scaled = progress_scale.for_option("batch", 4)
    assert set(scaled.new_state({}, p)) == {progress_scale.PREV, progress_scale.LAG, progress_scale.EXTRA}
    assert scaled.per_node == progress_scale.PER_NODE
    own = progress_scale.for_option("batch", 4, 0.99)
    assert set(own.new_state({}, p)) == set(progress_scale.KEYS) and own.per_node[-1] == progress_scale.SQUARES
