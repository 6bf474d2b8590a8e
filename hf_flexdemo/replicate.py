"""Collectives on the replicate group (the ranks holding the same shard on other nodes).

Every parameter's payload of a step travels in one collective: the tensors are packed into a
single byte buffer, gathered, and unpacked per replica. Byte counts follow the ring algorithms
gloo and NCCL use: an all-gather puts ``(R - 1) * payload`` bytes on each rank's link, an
all-reduce ``2 * (R - 1) / R * buffer``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class CommStats:
    """Inter-node traffic of one optimizer step, as seen by this rank."""

    bytes_sent: int = 0
    bytes_received: int = 0
    dense_bytes: int = 0
    collectives: int = 0
    seconds: float = 0.0
    coefficients: int = 0

    def as_dict(self) -> dict[str, float]:
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "dense_bytes": self.dense_bytes,
            "collectives": self.collectives,
            "seconds": self.seconds,
            "coefficients": self.coefficients,
        }


@contextlib.contextmanager
def explained(what: str, group: dist.ProcessGroup | None) -> Iterator[None]:
    """Re-raise a failed collective saying which collective on which group (global ranks) it was."""
    try:
        yield
    except RuntimeError as err:
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        raise RuntimeError(
            f"FlexDeMo: the {what} over global ranks {ranks} failed on rank {dist.get_rank()}: a peer died "
            f"or stalled past the timeout (TrainingArguments.ddp_timeout). Cause: {err}"
        ) from err


def dense_allreduce_bytes(numel: int, replicas: int, element_size: int = 4) -> int:
    """Bytes one rank sends in a ring all-reduce of ``numel`` elements over ``replicas`` ranks."""
    return 2 * (replicas - 1) * numel * element_size // replicas


class ReplicateGroup:
    """The inter-node process group of one rank, with byte and time accounting."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)

    def all_gather(self, tensors: list[Tensor], stats: CommStats) -> list[Tensor]:
        """Gather every tensor from every replica in one collective: each result is ``(R, *shape)``."""
        if self.size == 1:
            return [t.unsqueeze(0) for t in tensors]
        flat = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
        buffer = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8)
        gathered = buffer.new_empty(self.size * buffer.numel())
        start = time.perf_counter()
        with explained("all-gather of the momentum payload", self.group):
            dist.all_gather_single(gathered, buffer, group=self.group)
        gathered = gathered.view(self.size, -1)
        stats.seconds += time.perf_counter() - start
        stats.collectives += 1
        stats.bytes_sent += (self.size - 1) * buffer.numel()
        stats.bytes_received += (self.size - 1) * buffer.numel()

        out, offset = [], 0
        for tensor, raw in zip(tensors, flat):
            piece = gathered[:, offset : offset + raw.numel()].contiguous()
            out.append(piece.view(tensor.dtype).view(self.size, *tensor.shape))
            offset += raw.numel()
        return out

    def mean(self, tensor: Tensor, stats: CommStats) -> Tensor:
        """Dense average of ``tensor`` over the replicas (in place)."""
        if self.size == 1:
            return tensor
        start = time.perf_counter()
        with explained("all-reduce of the momentum", self.group):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        stats.seconds += time.perf_counter() - start
        stats.collectives += 1
        sent = dense_allreduce_bytes(tensor.numel(), self.size, tensor.element_size())
        stats.bytes_sent += sent
        stats.bytes_received += sent
        return tensor.div_(self.size)
