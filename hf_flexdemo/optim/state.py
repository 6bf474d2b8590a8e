"""FlexDeMo's ``state_dict`` and ``load_state_dict``: torch's, plus what resumes a run exactly.

The optimizer-wide options as resolved, the step counters, a budget's rate and an exchange held for a later step
travel in the ``"flexdemo"`` entry, and the mode adds its own (:meth:`~hf_flexdemo.optim.mode.Mode.save`), so the
``state_dict`` alone resumes a run bit for bit, also with an exchange in flight. A mixin of
:class:`~hf_flexdemo.optim.optimizer.FlexDeMo`, on the optimizer's own attributes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .. import knobs
from ..knobs import OPTIMIZER_WIDE
from ..wire.replicators import leader, owner
from . import local_steps
from .exchange import HELD_KEYS, MOMENT_KEYS

logger = logging.getLogger(__name__)

# What keeps its dtype whatever the parameters' (torch's load_state_dict casts all state to it): float32, and
# replicator="owner"'s encoded result, bytes.
FLOAT32_KEYS = ("delta", *MOMENT_KEYS, *HELD_KEYS, *local_steps.FLOAT32_KEYS, leader.SCALE, owner.FEEDBACK)
STATE_DTYPES: dict[str, torch.dtype] = {**dict.fromkeys(FLOAT32_KEYS, torch.float32), owner.RESULT: torch.uint8}


class StateDictMixin:
    """``state_dict``/``load_state_dict`` of :class:`~hf_flexdemo.optim.optimizer.FlexDeMo`."""

    def state_dict(self) -> dict[str, Any]:
        """Torch's ``state_dict`` plus the optimizer-wide options, the step counters and the budget's rate.

        An exchange in flight (``overlap="delayed"``, streamed local steps) is waited for and decoded first: the
        candidate momentum and the consensus still to apply are per-parameter state (``pending_delta``,
        ``pending_update``), so a resumed run applies exactly what the uninterrupted one would.
        """
        if self.exchange.in_flight:
            self._refuse_in_flight("state_dict")
            self.exchange.hold()
        state = super().state_dict()
        state["flexdemo"] = {"options": dict(self.options), "steps": self.steps, "skipped_steps": self.skipped_steps,
                             "rate": self.exchange.rate, "pending": self.exchange.held,
                             "outer_lr_follows_nodes": self.outer_lr_follows_nodes}
        self.mode.save(state)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, with the saved options; keep the momentum in float32 (torch casts it to the
        parameter's dtype)."""
        counters = state_dict.get("flexdemo") or {}
        missing = sorted(set(OPTIMIZER_WIDE) - set(counters.get("options") or {}))
        if missing:
            raise ValueError(f"FlexDeMo: this state_dict lacks the options {missing}: it was not saved by this "
                             "version of FlexDeMo (its 'flexdemo' entry holds every optimizer-wide knob). Resume "
                             "from a checkpoint written by this version, or load the model weights alone.")
        super().load_state_dict(state_dict)
        self.options = {key: counters["options"][key] for key in OPTIMIZER_WIDE}
        self._follow_nodes(counters.get("outer_lr_follows_nodes", False))
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved_state in state_dict["state"].items():
            for key, dtype in STATE_DTYPES.items():
                if key in saved_state:
                    self.state[params[index]][key] = saved_state[key].to(device=self.device, dtype=dtype, copy=True)
        self.steps = counters["steps"]
        self.exchange.skipped_steps = counters["skipped_steps"]
        self.exchange.rate = counters["rate"]
        self._reset()  # on the loaded options and state
        self.exchange.restore_held(counters["pending"])
        self.mode.load(state_dict)

    def _follow_nodes(self, follows: bool) -> None:
        """A checkpoint whose outer step was the default (``outer_lr=None``) resolves it again on the nodes it resumes
        on: ``sqrt(R / 2)`` of the new ``R``, where the saved value was the old ``R``'s. Checkpoints written before the
        flag was saved keep their value."""
        self.outer_lr_follows_nodes = follows
        if not follows or self.options["local_steps"] == 1:
            return
        resolved = knobs.resolve_outer_lr(None, self.replicate.size, self.options["replicator"])
        if resolved != self.options["outer_lr"]:
            logger.info("FlexDeMo: outer_lr follows the nodes: %g in the checkpoint, %g on %d node(s) now.",
                        self.options["outer_lr"], resolved, self.replicate.size)
        self.options["outer_lr"] = resolved

    def _refuse_in_flight(self, what: str) -> None:
        if self.options["overlap"] != "delayed":
            raise RuntimeError(f"FlexDeMo: {what}() while this step's exchange is in flight (after backward, before "
                               "step()); call it after optimizer.step().")
