"""What FlexDeMo is checked against: a deliberately naive DeMo step (one block at a time, dense scatter, dense
IDCT, float64), and the authors' own ``detonation`` package (:func:`import_detonation`)."""

from __future__ import annotations

import math
import sys
import types

import torch


def import_detonation() -> tuple[type, type]:
    """The authors' ``DeToSGD`` and ``DeMoReplicator`` (PyPI ``detonation``), importable without their ``mltiming``.

    ``detonation.repl.demo_replicator`` imports ``mltiming.timing`` (an extra of detonation) and never calls it on
    this path; when ``mltiming`` is missing a stub stands in, which raises if it is called. ``ImportError`` when
    detonation itself is missing.
    """
    try:
        import mltiming  # noqa: F401
    except ModuleNotFoundError:

        def timing(*args, **kwargs):
            raise RuntimeError("detonation called mltiming.timing, which the tests' stub cannot stand in for")

        stub = types.ModuleType("mltiming")
        stub.timing = timing
        sys.modules["mltiming"] = stub
    from detonation import DeMoReplicator, DeToSGD

    return DeToSGD, DeMoReplicator


def _basis(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    d = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d


def _divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _blocks(shape: tuple[int, ...], chunk: int):
    rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
    n1, n2 = _divisor(rows, chunk), _divisor(cols, chunk)
    for i in range(0, rows, n1):
        for j in range(0, cols, n2):
            yield (slice(i, i + n1), slice(j, j + n2)), (n1, n2)


def reference_demo_step(grads, deltas, lr, topk, chunk, decay, value_dtype=torch.float32, consensus="choosers"):
    """DeMo's momentum, compression and exchange for ``len(grads)`` replicas of one parameter; a coefficient of
    ``Q`` is the mean over the replicas that chose it (``consensus="choosers"``) or over all (``"replicas"``).

    Returns the replicas' new momenta (after error feedback) and the decoded update ``Q``.
    """
    shape = grads[0].shape
    as_matrix = (lambda t: t.reshape(1, -1)) if len(shape) == 1 else (lambda t: t.reshape(shape[0], -1))
    deltas = [as_matrix(decay * d.double() + lr * g.double()).clone() for d, g in zip(deltas, grads)]
    q = torch.zeros_like(deltas[0])
    for where, (n1, n2) in _blocks(tuple(shape), chunk):
        d1, d2 = _basis(n1), _basis(n2)
        k = min(topk, n1 * n2)
        total = torch.zeros(n1 * n2, dtype=torch.float64)
        count = torch.zeros(n1 * n2, dtype=torch.float64)
        for delta in deltas:
            coeff = (d1 @ delta[where] @ d2.T).reshape(-1)
            idx = coeff.abs().topk(k).indices
            vals = coeff[idx].to(value_dtype).double()
            sparse = torch.zeros_like(coeff).index_put_((idx,), vals)
            delta[where] -= d1.T @ sparse.view(n1, n2) @ d2
            total.index_add_(0, idx, vals)
            count.index_add_(0, idx, torch.ones_like(vals))
        mean = total / (count.clamp(min=1) if consensus == "choosers" else len(deltas))
        q[where] = d1.T @ mean.view(n1, n2) @ d2
    return [d.view(shape) for d in deltas], q.view(shape)


def reference_update(param, q, lr, update, state, betas=(0.9, 0.999), eps=1e-8):
    """``param`` after FlexDeMo's ``update`` rule on the decoded ``q`` (float64; ``state`` holds AdamW's moments).

    ``"sign"``: ``p - lr * sign(q)``; ``"sgd"``: ``p - q`` (``q`` already carries lr); ``"adamw"``: AdamW
    (no weight decay) fed the gradient estimate ``q / lr``.
    """
    param = param.double()
    if update == "sign":
        return param - lr * torch.sign(q)
    if update == "sgd":
        return param - q
    grad = q / lr
    state["step"] = state.get("step", 0) + 1
    state["m"] = betas[0] * state.get("m", 0.0) + (1 - betas[0]) * grad
    state["v"] = betas[1] * state.get("v", 0.0) + (1 - betas[1]) * grad * grad
    m_hat = state["m"] / (1 - betas[0] ** state["step"])
    v_hat = state["v"] / (1 - betas[1] ** state["step"])
    return param - lr * m_hat / (v_hat.sqrt() + eps)
