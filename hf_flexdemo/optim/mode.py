"""What a training mode of :class:`~hf_flexdemo.optim.optimizer.FlexDeMo` is: the part of ``step()`` that varies.

The optimizer builds the plan and dispatches ``step()``, ``finish()``, ``state_dict`` and the consensus view to its
mode, one of:

* :class:`~hf_flexdemo.optim.local_steps.LocalSteps` (``local_steps > 1``, the default): local AdamW steps and a
  round's exchange of the pseudo-gradient;
* :class:`~hf_flexdemo.optim.stepwise.StepWise` (``local_steps=1``): the compressed momentum exchange every step;
* :class:`~hf_flexdemo.optim.one_replica.OneReplica` (a single node): torch's AdamW, nothing exchanged.

A mode exchanges through the optimizer's :class:`~hf_flexdemo.optim.exchange.ExchangeEngine` (``optimizer.exchange``)
and reads the optimizer through its public members only. The defaults below are a mode whose replicas always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torch import Tensor

from .plan import Bucket

if TYPE_CHECKING:
    from ..wire.replicators import Replicator
    from .optimizer import FlexDeMo


class Mode:
    """A training mode (see the module docstring); ``anchors``: whether replicas restart from a per-parameter
    ``state["anchor"]``, the consensus while they differ."""

    anchors = False

    def __init__(self, optimizer: FlexDeMo) -> None:
        self.optimizer = optimizer

    def new_state(self, state: dict[str, Any], p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """``p``'s optimizer state, filled where missing with what the mode keeps."""
        raise NotImplementedError

    def assign(self, params: list[Tensor]) -> Callable[[Tensor], int] | None:
        """Called when the plan is built for the trainable ``params``: each one's fragment (``None``: one)."""
        return None

    def step(self, plan: list[Bucket]) -> None:
        """One optimizer step on ``plan``."""
        raise NotImplementedError

    def observe_micro_batch(self, plan: list[Bucket], *, last: bool) -> None:
        """A micro-batch's gradient was added to the parameters' (``last``: the step's last one)."""

    def end_step(self, plan: list[Bucket]) -> None:
        """After every step (the optimizer's counters already moved on)."""

    def finish(self, plan: list[Bucket], final: Replicator | None) -> None:
        """End of training: land what is in flight and bring every replica to one consensus (``final``: the wire of a
        last round, ``None``: the optimizer's own)."""

    def adopt(self, plan: list[Bucket]) -> None:
        """The parameters were loaded from outside: they become the consensus (the engine already dropped what was
        in flight)."""

    def agreed(self, steps: int) -> bool:
        """Whether every replica's parameters agree between ``step()`` calls, before step ``steps`` (0-based)."""
        return True

    @contextmanager
    def anchored(self) -> Iterator[None]:
        """Inside the block the parameters hold the consensus (they already do where replicas agree)."""
        yield

    def save(self, state: dict[str, Any]) -> None:
        """Add what a resume needs beyond the optimizer's state to ``state`` (a ``state_dict``)."""

    def load(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`save` added."""
