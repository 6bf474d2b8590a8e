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


def _observe(scale: progress_scale.Unscaled, stack: Stack, first: torch.Tensor, total: torch.Tensor) -> None:
    """A step of two micro-batches: ``first`` the first one's share of the gradient, ``total`` the step's."""
    p = stack.params[0]
    p.grad = first
    scale.observe([stack], last=False)
    p.grad = total
    scale.observe([stack], last=True)


def _factors(scale: progress_scale.Unscaled, mus: list[torch.Tensor]) -> torch.Tensor:
    """Run AdamW on unit noise around each of ``mus`` in turn (one step each, of two micro-batches whose noise is
    independent: the step's unit noise split); per element, the factor the extra progress of the last step carries:
    1 + extra / the step AdamW took."""
    torch.manual_seed(0)
    split = torch.Generator().manual_seed(1)
    p = torch.zeros(mus[0].numel(), requires_grad=True)
    stack = _stack(p, scale)
    for mu in mus:
        noise, half = torch.randn(mu.numel()), torch.randn(mu.numel(), generator=split)
        with torch.no_grad():
            _observe(scale, stack, (mu + noise + half) / 2, mu + noise)
            before = p.detach().clone()
            adamw_step([stack])
            scale.restart([stack])
            scale.after_inner([stack])
    assert torch.equal(scale.positions(stack)[0], p.detach() + stack.states[0][progress_scale.EXTRA])
    return 1 + stack.states[0][progress_scale.EXTRA] / (p.detach() - before)


@pytest.mark.parametrize(("scaled", "decay", "within"), [(progress_scale.BatchScaled, None, 0.05),
                                                         (progress_scale.BatchScaled, 0.99, 0.08),
                                                         (progress_scale.MicroBatchScaled, None, 0.08)])
@pytest.mark.parametrize("nodes", [2, 8])
def test_the_extra_progress_is_the_nodes_batch_step_less_the_nodes_own(nodes, scaled, decay, within):
    """Three blocks of elements, expected gradient 0, 0.3 and 1 under unit noise: after 1,500 steps the extra progress
    of one more step, per block, is (f - 1) times the step AdamW took, f = sqrt((mu^2 + 1) / (mu^2 + 1 / R)), with the
    estimate's EMAs at AdamW's beta2 or at a decay of their own, from consecutive gradients or from each step's two
    micro-batches. A memory of 100 steps reads the signal with more noise, which the clip at 0 turns into a shorter
    factor where there is none (2.64 for sqrt(8) = 2.83); so do the products of two half batches, four times as
    variable as those of two whole ones (2.67)."""
    n = 1024
    mu = torch.cat([torch.zeros(n), torch.full((n,), 0.3), torch.ones(n)])
    ratio = _factors(scaled(nodes, decay), [mu] * 1500)
    for block, m in enumerate((0.0, 0.3, 1.0)):
        expected = math.sqrt((m * m + 1) / (m * m + 1 / nodes))
        got = ratio[block * n:(block + 1) * n].mean().item()
        assert abs(got - expected) < within * expected, (m, got, expected)


def _signal_read(scale: progress_scale.BatchScaled, curvature: float, steps: int = 3000) -> tuple[float, float]:
    """AdamW (lr 1e-2) at a minimum of curvature ``curvature`` under noise: each step's two micro-batches see the
    expected gradient ``G = curvature * p`` plus noise of variance 2 (1 for the step's mean). The mean over the
    elements of the signal at the weights (an EMA of G^2 at beta2, bias-corrected) and of the estimate's ``s``."""
    torch.manual_seed(0)
    p = torch.zeros(2048, requires_grad=True)
    stack = _stack(p, scale)
    stack.group["lr"] = 1e-2
    signal = torch.zeros(2048)
    for _ in range(steps):
        expected = curvature * p.detach()
        halves = [expected + 2**0.5 * torch.randn(2048) for _ in range(2)]
        with torch.no_grad():
            _observe(scale, stack, halves[0] / 2, (halves[0] + halves[1]) / 2)
            adamw_step([stack])
            scale.after_inner([stack])
        signal.mul_(0.999).add_(expected.square(), alpha=0.001)
    products = steps if isinstance(scale, progress_scale.MicroBatchScaled) else steps - 1
    correction = 1 - 0.999**steps, 1 - 0.999**products
    return (signal / correction[0]).mean().item(), (stack.states[0][progress_scale.LAG] / correction[1]).mean().item()


def test_micro_batches_read_the_signal_at_the_weights_where_consecutive_gradients_read_it_low():
    """Where each step moves the next gradient against the last one's noise (a curved minimum), the products of
    consecutive gradients read the signal at the weights about a quarter low (0.32 for 0.43, measured); the products
    of a step's micro-batches, taken at the same weights, read it (0.427 for 0.428)."""
    signal, consecutive = _signal_read(progress_scale.BatchScaled(8), curvature=100.0)
    same, micro = _signal_read(progress_scale.MicroBatchScaled(8), curvature=100.0)
    assert same == signal and signal > 0.3
    assert abs(micro - signal) < 0.03 * signal, (micro, signal)
    assert consecutive < 0.85 * signal, (consecutive, signal)


def test_a_shard_without_a_gradient_before_the_last_micro_batch_counts_its_first_share_as_0():
    """A parameter that only the step's last micro-batch reaches: the product is 0 (its first micro-batch's gradient
    is 0), not the product with what an earlier step's first micro-batch left in the buffer."""
    p, q = torch.zeros(16, requires_grad=True), torch.zeros(16, requires_grad=True)
    scale = progress_scale.MicroBatchScaled(4)
    stacks = [_stack(p, scale), _stack(q, scale)]
    lag = stacks[1].states[0][progress_scale.LAG]
    for reached in (True, False):  # q's first micro-batch has a gradient in the first step only
        p.grad, q.grad = torch.ones(16), torch.full((16,), 1.0) if reached else None
        scale.observe(stacks, last=False)
        p.grad, q.grad = torch.full((16,), 2.0), torch.full((16,), 2.0)
        before = lag.clone()
        scale.observe(stacks, last=True)
        with torch.no_grad():
            adamw_step(stacks)
        scale.after_inner(stacks)
        product = 0.0 if not reached else 1.0 * (2.0 - 1.0) / (1 / 2 * (1 - 1 / 2))
        torch.testing.assert_close(lag, 0.999 * before + 0.001 * product)


def test_the_micro_batch_estimate_refuses_a_step_it_did_not_observe():
    p = torch.zeros(16, requires_grad=True)
    scale = progress_scale.MicroBatchScaled(4)
    stack = _stack(p, scale)
    with pytest.raises(ValueError, match=r"invalid progress_scale_estimate='micro_batches'.*gradient_accumulation"):
        scale.observe([stack], last=True)  # one micro-batch: no product
    with pytest.raises(ValueError, match=r"a gradient after every micro-batch: none was reduced"):
        scale.observe([stack], last=False)  # no gradient yet (Accelerate's no_sync)
    p.grad = torch.ones(16)
    with torch.no_grad():
        adamw_step([stack])
    with pytest.raises(ValueError, match=r"call FlexDeMo.observe_micro_batch"):
        scale.after_inner([stack])


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


@pytest.mark.parametrize("estimate", ["consecutive", "micro_batches"])
def test_a_node_walking_the_lengthened_path_stands_where_its_own_path_counts_it(estimate):
    """progress_scale_path="lengthened": on the same gradients the node's weights move to where the own path's
    exchange counts the replica (its shard plus the extra progress), and it keeps no extra progress."""
    torch.manual_seed(0)
    scales = [progress_scale.for_option("batch", 4, estimate=estimate, path=path) for path in ("own", "lengthened")]
    params = [torch.zeros(256, requires_grad=True) for _ in scales]
    stacks = [_stack(p, scale) for p, scale in zip(params, scales)]
    assert progress_scale.EXTRA not in stacks[1].states[0]
    mu = torch.linspace(0, 1, 256)
    for _ in range(40):
        first, total = mu / 2 + torch.randn(256), mu + torch.randn(256)
        with torch.no_grad():
            for scale, stack in zip(scales, stacks):
                _observe(scale, stack, first.clone(), total.clone())
                adamw_step([stack])
                scale.after_inner([stack])
    own, walked = (scale.positions(stack)[0] for scale, stack in zip(scales, stacks))
    assert walked is stacks[1].shards()[0] and (walked - params[0]).abs().max() > 1e-3  # it walked further
    torch.testing.assert_close(walked, own, rtol=0, atol=1e-6)
    scales[1].restart([stacks[1]])
    assert torch.equal(scales[1].positions(stacks[1])[0], walked)


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
    micro = progress_scale.for_option("batch", 4, estimate="micro_batches")
    assert isinstance(micro, progress_scale.MicroBatchScaled)
    assert set(micro.new_state({}, p)) == {progress_scale.LAG, progress_scale.SQUARES, progress_scale.EXTRA}
    assert micro.per_node == (progress_scale.LAG, progress_scale.SQUARES)
    assert type(progress_scale.for_option("none", 4, estimate="micro_batches")) is progress_scale.Unscaled
    walker = progress_scale.for_option("batch", 4, path="lengthened")
    assert set(walker.new_state({}, p)) == {progress_scale.PREV, progress_scale.LAG}
