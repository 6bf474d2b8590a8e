"""FSDP2 over the ranks of one node against the unsharded model, on the tiny T5: each rank saves to OUT/rank{r}.pt
the full gradients of one backward of its half of a batch under FSDP2, the unsharded model's gradients of the whole
batch, and the warnings that backward raised, without and with the trainer's filter of FSDP2's view warning."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from hf_flexdemo.optim.mesh import build_hybrid_mesh, shard_model
from hf_flexdemo.testing import reverse_task, tiny_t5
from hf_flexdemo.trainer.trainer import ignore_t5_view_warning


def _backward(model: torch.nn.Module, batch: dict[str, torch.Tensor], *, filtered: bool) -> list[str]:
    """One forward and backward; the warnings raised, every one recorded (``filtered``: the trainer's filter on)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if filtered:
            ignore_t5_view_warning()
        model(**batch).loss.backward()
    return [str(w.message) for w in seen]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    mesh = build_hybrid_mesh(device_type="cpu")  # one node: FSDP2 over every rank
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = torch.tensor(reverse_task(8)["input_ids"])
    batch = {"input_ids": ids, "labels": ids.flip(1)}  # 8 labels per example, none masked: halves weigh alike

    reference = tiny_t5()
    reference(**batch).loss.backward()
    expected = {name: p.grad.clone() for name, p in reference.named_parameters()}

    model = shard_model(tiny_t5(), mesh)
    half = {key: value.chunk(world)[rank] for key, value in batch.items()}
    unfiltered = _backward(model, half, filtered=False)  # FSDP2 averages the ranks' gradients: the batch's mean
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    filtered = _backward(model, half, filtered=True)
    torch.save({"grads": grads, "expected": expected, "unfiltered": unfiltered, "filtered": filtered},
               args.out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
