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


def _stack(p: torch.Tensor) -> Stack:
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    state = progress_scale.new_state(adamw_state({}, p), p)
    return Stack(index=0, layout=BlockLayout.for_shape(tuple(p.shape), 8), group=group, params=[p], states=[state])


@pytest.mark.parametrize("nodes", [2, 8])
def test_the_extra_progress_is_the_nodes_batch_step_less_the_nodes_own(nodes):
    """Three blocks of elements, expected gradient 0, 0.3 and 1 under unit noise: after 1,500 steps the extra progress
    of one more step, per block, is (f - 1) times the step AdamW took, f = sqrt((mu^2 + 1) / (mu^2 + 1 / R))."""
    torch.manual_seed(0)
    n = 1024
    mu = torch.cat([torch.zeros(n), torch.full((n,), 0.3), torch.ones(n)])
    p = torch.zeros(3 * n, requires_grad=True)
    stack = _stack(p)
    for _ in range(1500):
        p.grad = mu + torch.randn(3 * n)
        with torch.no_grad():
            before = p.detach().clone()
            adamw_step([stack])
            progress_scale.restart([stack])
            progress_scale.accumulate([stack], nodes)
    moved = p.detach() - before
    ratio = stack.states[0][progress_scale.EXTRA] / moved
    for block, m in enumerate((0.0, 0.3, 1.0)):
        expected = math.sqrt((m * m + 1) / (m * m + 1 / nodes))
        got = 1 + ratio[block * n:(block + 1) * n].mean().item()
        assert abs(got - expected) < 0.05 * expected, (m, got, expected)
    assert torch.equal(progress_scale.positions(stack)[0], p.detach() + stack.states[0][progress_scale.EXTRA])


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
    assert set(scaled.new_state({}, p)) == set(progress_scale.KEYS) and scaled.per_node == progress_scale.PER_NODE
