"""The model ``FlexDeMoTrainer`` evaluates, predicts with and saves: the replicas' consensus, on every rank.

With local steps, in the middle of a round, each node's parameters are its own local values; evaluation, prediction
and saved weights see the anchor instead (``FlexDeMo.consensus_parameters``), with FSDP2's modules resharded around
the swap. At the end of training every exchange in flight lands and a final round brings the nodes' last steps in
(``FlexDeMo.finish``), and weights loaded from outside (the best checkpoint) become the consensus. A mixin of
:class:`~hf_flexdemo.trainer.trainer.FlexDeMoTrainer`, on the trainer's own attributes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule


class ConsensusModel:
    """``Trainer``'s evaluation, prediction, saving and end of training on the consensus (the module docstring)."""

    def _adopt_loaded_weights(self, module: torch.nn.Module, incompatible_keys: Any) -> None:
        """The model's load-state-dict hook: what was loaded becomes what the optimizer treats as the consensus."""
        if (optimizer := self.flexdemo_optimizer) is not None:
            optimizer.adopt_parameters()

    def _finalize_training(self, trial, num_train_samples, start_time):
        """Before Trainer's end of training (best model, ``on_train_end``): every exchange in flight lands and a
        final round brings each node's last steps into the consensus (``FlexDeMo.finish``), so ``self.model``
        holds the model trained, the same on every rank; its traffic is logged."""
        if (optimizer := self.flexdemo_optimizer) is not None:
            fsdp_modules = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
            for module in fsdp_modules:  # no forward may see the gathered parameters of before
                module.reshard()
            stats = optimizer.finish()
            traffic = torch.tensor([float(stats["bytes_sent"]), float(stats["bytes_received"])], dtype=torch.float64,
                                   device=self.accelerator.device)
            if dist.is_initialized():
                dist.all_reduce(traffic)
            sent, received = traffic.tolist()
            self.comm_metrics.total_bytes_sent += sent
            self.log({"flexdemo/final_round_bytes_sent": sent, "flexdemo/final_round_bytes_received": received,
                      "flexdemo/total_bytes_sent": self.comm_metrics.total_bytes_sent})
        return super()._finalize_training(trial, num_train_samples, start_time)

    @contextlib.contextmanager
    def _consensus(self) -> Iterator[None]:
        """With local steps, mid-round: the anchor (every node's last consensus), not this node's local values.

        FSDP2 keeps the root module's gathered parameters after a forward (``reshard_after_forward`` is off for
        the root), so the modules are resharded around the swap: no forward sees a stale gathered copy."""
        optimizer = self.flexdemo_optimizer
        if optimizer is None or optimizer.options["local_steps"] == 1:
            yield
            return
        fsdp_modules = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for module in fsdp_modules:
            module.reshard()
        with optimizer.consensus_parameters():
            try:
                yield
            finally:
                for module in fsdp_modules:
                    module.reshard()

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        with self._consensus():
            return super().evaluate(*args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any):
        with self._consensus():
            return super().predict(*args, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        with self._consensus():
            super().save_model(output_dir, _internal_call)
