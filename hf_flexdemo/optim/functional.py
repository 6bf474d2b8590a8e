"""FlexDeMo's arithmetic as functions of tensor lists and keyword-only floats, in the shape of
``torch.optim.adam._multi_tensor_adam``: no parameter groups, no state dicts, no collectives.

The optimizer (:mod:`hf_flexdemo.optim.optimizer`) decides what to call with which state; these functions say
what a step computes:

* :func:`entry_scale` and :func:`momentum_step`: how a gradient (or AdamW's direction) enters the momentum;
* :func:`adam_direction`: this replica's AdamW first moment or direction, with the new moments returned as
  candidates (a skipped step must leave the stored moments untouched);
* :func:`sign_step`, :func:`sgd_step`, :func:`rmsprop_step` and torch's ``adamw``: the update from the
  consensus ``Q``; :func:`decay_weights`: decoupled weight decay.

Every function runs ``torch._foreach_*`` kernels over lists (or one kernel over a stacked tensor) and reads
nothing from the device on the host.
"""

from __future__ import annotations

import torch
from torch import Tensor


def entry_scale(momentum: str, *, lr: float, decay: float) -> float:
    """The factor a gradient enters the momentum with: ``lr`` (``momentum="lr"``, DeMo), ``1 - decay``
    (``"ema"``) or 1 (AdamW's moments, ``"avg"``/``"adam"``). ``Q`` divided by it is in gradient units."""
    return {"lr": lr, "ema": 1.0 - decay, "avg": 1.0, "adam": 1.0}[momentum]


def momentum_step(delta: Tensor, entering: list[Tensor], *, out: Tensor, decay: float, scale: float) -> Tensor:
    """``out = decay * delta + scale * entering`` for the ``(P, *shape)`` stacked ``delta`` and its ``P`` rows
    entering; ``delta`` is left as it is (a skipped step keeps it)."""
    torch.mul(delta, decay, out=out)
    torch._foreach_add_(list(out.unbind(0)), entering, alpha=scale)
    return out


def adam_direction(
    grads: list[Tensor], grad_avg: list[Tensor], grad_avg_sq: list[Tensor] | None, *, step: float, beta1: float,
    beta2: float, eps: float,
) -> tuple[list[Tensor], dict[str, list[Tensor]]]:
    """AdamW's bias-corrected ``m`` (``grad_avg_sq=None``: ``momentum="avg"``) or ``m / (sqrt(v) + eps)``
    (``"adam"``) at ``step`` (1-based) for float32 ``grads``, and the new moments (``grad_avg`` and, for the
    direction, ``grad_avg_sq``) as fresh tensors; the given moments are not modified."""
    avg = torch._foreach_lerp(grad_avg, grads, 1.0 - beta1)
    if grad_avg_sq is None:
        return torch._foreach_div(avg, 1.0 - beta1**step), {"grad_avg": avg}
    avg_sq = torch._foreach_mul(grad_avg_sq, beta2)
    torch._foreach_addcmul_(avg_sq, grads, grads, value=1.0 - beta2)
    denominator = torch._foreach_sqrt(avg_sq)
    torch._foreach_div_(denominator, (1.0 - beta2**step) ** 0.5)
    torch._foreach_add_(denominator, eps)
    direction = torch._foreach_div(avg, denominator)
    torch._foreach_div_(direction, 1.0 - beta1**step)
    return direction, {"grad_avg": avg, "grad_avg_sq": avg_sq}


def decay_weights(params: list[Tensor], *, lr: float, weight_decay: float) -> None:
    """Decoupled weight decay: ``p <- p * (1 - lr * weight_decay)``."""
    if weight_decay:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)


def sign_step(params: list[Tensor], q: Tensor, *, lr: float) -> None:
    """DeMo's update ``p <- p - lr * sign(Q)`` (``q``: the ``(P, *shape)`` consensus, signed in place)."""
    q.sign_()
    torch._foreach_add_(params, list(q.unbind(0)), alpha=-lr)


def sgd_step(params: list[Tensor], q: Tensor, *, lr: float, to_gradient: float) -> None:
    """SGD on the consensus in gradient units: ``p <- p - lr * to_gradient * Q``."""
    torch._foreach_add_(params, list(q.unbind(0)), alpha=-lr * to_gradient)


def rmsprop_step(
    params: list[Tensor], q: Tensor, avg_sq: Tensor, denominator: Tensor, *, step: float, lr: float, scale: float,
    beta2: float, eps: float,
) -> None:
    """AdamW without its first moment (the caller applies weight decay), fed ``g = scale * Q`` (``params``: the
    rows of the ``(P, *shape)`` ``Q``; ``avg_sq`` stacked likewise):

    ``v <- beta2 * v + (1 - beta2) * g^2``, ``p <- p - lr * g / (sqrt(v / (1 - beta2^step)) + eps)``.

    The scale and the bias correction are folded into the constants, so besides ``v`` and ``p`` only the
    ``denominator`` buffer is written: five passes over the shard, where torch's AdamW with ``beta1 = 0`` fed a
    scaled copy of ``Q`` makes eight and keeps ``m``, a shard-sized copy of ``g``.
    """
    avg_sq.mul_(beta2).addcmul_(q, q, value=(1.0 - beta2) * scale * scale)
    correction = (1.0 - beta2**step) ** 0.5
    torch.sqrt(avg_sq, out=denominator).add_(eps * correction)
    torch._foreach_addcdiv_(params, list(q.unbind(0)), list(denominator.unbind(0)), value=-lr * scale * correction)
