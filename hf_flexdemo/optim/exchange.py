"""The exchange engine: how a mode's stacks cross nodes and land, the same transaction for every mode.

A mode (:mod:`hf_flexdemo.optim.stepwise`, :mod:`hf_flexdemo.optim.local_steps`) hands :class:`ExchangeEngine` the
stacks of local shards to exchange and how to build each one's candidate momentum; the engine runs the transaction:

1. **compress** (:meth:`~ExchangeEngine.launch`): the candidate momentum, the replicator's selection (the kept
   share of each block, :meth:`~ExchangeEngine.kept`) and its error feedback;
2. **start** (:meth:`~ExchangeEngine.launch`): one collective over the replicate group, the non-finite flag (and a
   time budget's measured fraction) riding in it;
3. **wait and decide** (:meth:`~ExchangeEngine.decide`): every exchange in flight finishes, and the step's one host
   sync says skip or not, the same on every rank;
4. **land** (:meth:`~ExchangeEngine.land`): decode the consensus and apply it stack by stack with the mode's rule,
   or **hold** it (:meth:`~ExchangeEngine.hold`) as per-parameter state until a later step lands it
   (:meth:`~ExchangeEngine.take_held`), which is also what ``state_dict`` saves of an exchange in flight.

A skipped exchange (:meth:`~ExchangeEngine.skip`) raises or warns as ``on_nonfinite`` says. The engine also keeps
the traffic of the step being built (:attr:`~ExchangeEngine.stats`) and a budget's current rate.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from ..wire import compression
from ..wire.collectives import CommStats, ReplicateGroup
from ..wire.replicators import Exchange, Replicator
from ..wire.workspace import Workspace
from . import budget, guards
from .plan import Stack, set_rows

# The replica's own gradient moments of momentum="avg" ("adam" adds the second), float32 like delta.
MOMENT_KEYS = ("grad_avg", "grad_avg_sq")
# A held exchange's per-parameter state (see ExchangeEngine.hold), float32 whatever the parameters.
HELD_KEYS = ("pending_delta", "pending_update", *(f"pending_{key}" for key in MOMENT_KEYS))


@dataclass
class Decision:
    """What :meth:`ExchangeEngine.decide` found: the stacks exchanged, their received payloads, whether every rank
    skips, and on the skip path whether this rank's own values were the non-finite ones."""

    stacks: list[Stack]
    received: list[Any]
    skip: bool
    own_nonfinite: bool


class ExchangeEngine:
    """The exchanges of one optimizer (see the module docstring).

    Args:
        replicator: the way of exchanging (:mod:`hf_flexdemo.wire.replicators`).
        replicate: the replicas of this rank's shards on the other nodes.
        shard_group: this node's ranks, over which the skip decision is made job-wide (``None``: this rank alone).
        device: the parameters' device; every tensor the engine creates lives there.
        options: the optimizer-wide knobs (``on_nonfinite`` and the budget's are read).
    """

    def __init__(self, replicator: Replicator, *, replicate: ReplicateGroup, shard_group: dist.ProcessGroup | None,
                 device: torch.device, options: dict[str, Any]) -> None:
        self.replicator, self.replicate, self.shard_group, self.device = replicator, replicate, shard_group, device
        self.options = options
        self.workspace = Workspace()
        self.stats = CommStats()  # the step being built (backward hooks count into it too)
        self.skipped_steps = 0
        self.launched_at = 0  # the optimizer step that launched the exchanges in flight
        # A budget's current rate (None: each group's compression_rate / compression_topk).
        self.rate: float | None = None
        self._exchanges: list[Exchange] = []
        self._flags: list[Tensor] = []  # this rank's own non-finite flags
        self._held: dict[str, Any] | None = None
        self._timing = torch.full((1,), -1.0, device=device)  # the last step's waited fraction (a time budget)
        self._last_step_end: float | None = None

    @property
    def in_flight(self) -> bool:
        """Whether exchanges were launched and not yet decided."""
        return bool(self._exchanges)

    @property
    def held(self) -> dict[str, Any] | None:
        """The held exchange's decision (``skip``, ``own_nonfinite``, the stacks' ``lrs``, the launching ``step``),
        or ``None``; plain values, saved in ``state_dict``."""
        return self._held

    def restore_held(self, held: dict[str, Any] | None) -> None:
        """Take back a held decision from a ``state_dict`` (its per-parameter state is loaded with the rest)."""
        self._held = held

    def reset(self, replicator: Replicator) -> None:
        """Exchange on ``replicator`` from now on, with nothing in flight or held (the optimizer was rebuilt)."""
        self.replicator, self._exchanges, self._flags, self._held = replicator, [], [], None

    def kept(self, stack: Stack) -> int:
        """Coefficients per block that ``stack`` sends: a budget's rate, else its group's rate or top-k."""
        if not self.replicator.compresses:
            return 0
        if self.rate is not None:
            return compression.kept_per_block(stack.layout.block_numel, self.rate, None)
        return compression.kept_per_block(stack.layout.block_numel, stack.group["compression_rate"],
                                          stack.group["compression_topk"])

    def launch(self, stacks: list[Stack], *, step: int, momentum: Callable[[Stack], Tensor] = Stack.new_momentum,
               timed: bool = False) -> None:
        """Compress and start: every stack's new ``momentum`` and payload, then their one collective, the
        non-finite flag (and with ``timed`` the time budget's measured fraction) riding in it. Non-finite values
        are zeroed before they are encoded."""
        replicator, payloads, self.launched_at = self.replicator, [], step
        with record_function("FlexDeMo::compress"):
            for stack in stacks:
                stack.momentum, stack.lr = momentum(stack), stack.group["lr"]
                payloads.append(replicator.select(stack, k=self.kept(stack), step=step, workspace=self.workspace))
            flag = guards.nonfinite(payloads, self.device)
            for values in payloads:
                torch.nan_to_num_(values, nan=0.0, posinf=0.0, neginf=0.0)
            for stack in stacks:
                replicator.encode(stack, feedback=stack.group["compression_feedback"], workspace=self.workspace)
        with record_function("FlexDeMo::exchange"):
            trailer = [flag.reshape(1), *([self._timing] if timed else [])]
            self._exchanges.append(replicator.start(stacks, trailer, self.stats))
        self._flags.append(flag)

    def decide(self) -> Decision:
        """Wait for every exchange in flight and decide: skip or not, the same on every rank (the flag OR-ed over
        the replicate group by the payloads, over the node by one all-reduce), the step's one host sync. A time
        budget's next rate is chosen with it."""
        stacks, received, flags, timings = [], [], [], []
        for exchange in self._exchanges:
            stacks += exchange.stacks
            got, trailer = self.replicator.finish(exchange)
            received += got
            flags.append((trailer[0] > 0).any())
            if len(trailer) > 1:
                timings.append(trailer[1].float().mean())
        verdict = torch.stack(flags).any().to(torch.float32).reshape(1)
        if timings:
            verdict = torch.cat([verdict, timings[0].reshape(1)])
        with record_function("FlexDeMo::exchange"):
            verdict = guards.max_in_group(verdict, self.shard_group, self.stats)
        skip, measured = verdict.tolist() if timings else (verdict.item(), None)
        own_nonfinite = bool(torch.stack(self._flags).any()) if skip > 0 else False  # a second sync, skip path only
        self._exchanges, self._flags = [], []
        if measured is not None:
            options = self.options
            self.rate = budget.next_rate(self.rate, measured, options["budget_fraction"], options["budget_min_rate"],
                                         options["budget_max_rate"])
        return Decision(stacks, received, skip > 0, own_nonfinite)

    def decode(self, stack: Stack, received: Any) -> Tensor:
        """The consensus ``Q`` of ``stack`` from what it received, bit-identical on every replica."""
        with record_function("FlexDeMo::decode"):
            return self.replicator.decode(stack, received, workspace=self.workspace)

    def land(self, rule: Callable[[Stack, Tensor], None] | None = None) -> bool:
        """Decide, then decode and apply stack by stack: commit the candidate momentum and call ``rule(stack, Q)``
        (default: the group's update). Whether the exchange was skipped (its candidates are then dropped)."""
        decision = self.decide()
        if decision.skip:
            self.skip(self.launched_at, decision.own_nonfinite)
            for stack in decision.stacks:
                stack.discard()
            return True
        for stack, payload in zip(decision.stacks, decision.received):
            q = self.decode(stack, payload)
            with record_function("FlexDeMo::apply"):
                stack.commit(spent=self.replicator.spends_momentum)
                if rule is None:
                    stack.apply(q, stack.lr, self.workspace)
                else:
                    rule(stack, q)
        return False

    def hold(self) -> None:
        """Decide, and keep the decoded consensus and the candidate momentum as per-parameter state
        (:data:`HELD_KEYS`) until a later step takes them (:meth:`take_held`)."""
        launched_at = self.launched_at
        decision = self.decide()
        for stack, payload in zip(decision.stacks, decision.received):
            if not decision.skip:
                set_rows(stack.states, "pending_update", self.decode(stack, payload).clone().unbind(0))
            for key, rows in stack.candidate().items():
                set_rows(stack.states, f"pending_{key}", rows)
        self._held = {"skip": decision.skip, "own_nonfinite": decision.own_nonfinite,
                      "lrs": [stack.lr for stack in decision.stacks], "step": launched_at}

    def take_held(self) -> dict[str, Any]:
        """The held decision, now the caller's to land; the exchange in flight is held first."""
        if self.in_flight:
            self.hold()
        held, self._held = self._held, None
        return held

    @staticmethod
    def drop_held_state(stacks: list[Stack]) -> None:
        """Forget a held exchange's per-parameter state once it is applied or skipped."""
        for state in (state for stack in stacks for state in stack.states):
            for key in HELD_KEYS:
                state.pop(key, None)

    def discard(self, stacks: list[Stack]) -> None:
        """Drop what is in flight or held (weights loaded from outside replace what it would have moved)."""
        if self.in_flight:
            for stack in self.decide().stacks:
                stack.discard()
        if self._held is not None:
            self._held = None
            self.drop_held_state(stacks)

    def skip(self, step: int, own_nonfinite: bool) -> None:
        """A non-finite value on some rank at ``step``: raise (``on_nonfinite="raise"``) or warn and count it."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        message = (f"FlexDeMo: non-finite gradient at step {step} (on rank {rank}: "
                   f"{'non-finite' if own_nonfinite else 'finite'})")
        if self.options["on_nonfinite"] == "raise":
            raise FloatingPointError(message + " (on_nonfinite='raise').")
        warnings.warn(message + "; every rank skips this step (on_nonfinite='skip').", stacklevel=5)
        self.skipped_steps += 1

    @contextmanager
    def using(self, replicator: Replicator | None) -> Iterator[None]:
        """Inside the block the exchanges run on ``replicator`` (``None``: the engine's own)."""
        if replicator is None:
            yield
            return
        own, self.replicator = self.replicator, replicator
        try:
            yield
        finally:
            self.replicator = own

    def close_step(self, dense_bytes: int) -> dict[str, int]:
        """The traffic of the step just built (``dense_bytes``: AdamW-HSDP's, for the ratio); the next starts at 0."""
        self.stats.dense_bytes = dense_bytes
        stats, self.stats = self.stats.as_dict(), CommStats()
        return stats

    def time_step(self) -> None:
        """A time budget: measure the step's waited fraction, which rides in the next payload (:meth:`launch`)."""
        now = time.perf_counter()
        waited = self.replicate.timer.settle()
        if self._last_step_end is not None:
            self._timing.fill_(waited / max(now - self._last_step_end, 1e-9))
        self._last_step_end = now
