"""Collectives on the replicate group (the ranks holding the same shard on other nodes).

A payload (one exchange bucket's, or the whole step's) travels in one collective: the tensors are
packed into a single byte buffer, gathered (or, for values only, summed), and unpacked per replica.
Byte counts follow the ring algorithms gloo and NCCL use: an all-gather puts ``(R - 1) * payload``
bytes on each rank's link, an all-reduce ``2 * (R - 1) / R * buffer``.

Collectives are issued with ``async_op=True`` and return a :class:`Pending`; its ``wait()`` is what
the step is exposed to. Timing measures that wait: on CUDA a pair of events brackets it on the current
stream (read once they have completed, never by a sync inside the step); on CPU (gloo) the host clock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class CommStats:
    """Inter-node traffic of one optimizer step, as seen by this rank.

    ``collectives`` counts the collectives on the replicate group (those that cross nodes);
    ``node_collectives`` those inside the node (the non-finite flag).
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    dense_bytes: int = 0
    collectives: int = 0
    node_collectives: int = 0
    coefficients: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


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


def all_gather_into(output: Tensor, tensor: Tensor, group: dist.ProcessGroup | None, async_op: bool = False):
    """``all_gather_single`` where torch has it (it deprecates ``all_gather_into_tensor``), else the older name."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)


def pack(tensors: list[Tensor]) -> Tensor:
    """One contiguous byte buffer holding ``tensors`` back to back."""
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def unpack(buffers: Tensor, like: list[Tensor]) -> list[Tensor]:
    """Split ``(R, bytes)`` packed rows into ``(R, *shape)`` tensors shaped and typed like ``like``."""
    out, offset = [], 0
    for tensor in like:
        size = tensor.numel() * tensor.element_size()
        piece = buffers[:, offset : offset + size].reshape(-1).clone()  # a fresh, aligned copy
        out.append(piece.view(tensor.dtype).view(buffers.shape[0], *tensor.shape))
        offset += size
    return out


class _Timer:
    """Seconds the step waited for collectives, without a host sync on CUDA (events are read lazily)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._settled = 0.0  # part of ``seconds`` already returned by ``settle``
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def measure(self, device: torch.device) -> Iterator[None]:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            begin = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - begin

    def _read(self) -> None:
        self.seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000.0
        self._events.clear()

    def settle(self) -> float:
        """Seconds measured since the last ``settle``. Call it only after a host sync that followed the
        measured waits (the step's skip decision): the events have completed, so reading them does not block."""
        self._read()
        seconds, self._settled = self.seconds - self._settled, self.seconds
        return seconds

    def pop(self) -> float:
        """Seconds measured since the last call (synchronises on the last CUDA event, if any)."""
        if self._events:
            self._events[-1][1].synchronize()
        self._read()
        seconds, self.seconds, self._settled = self.seconds, 0.0, 0.0
        return seconds


class Pending:
    """An issued collective; :meth:`wait` returns its result (timed and explained on failure)."""

    def __init__(self, work: dist.Work | None, result: Tensor, timer: _Timer, what: str,
                 group: dist.ProcessGroup | None) -> None:
        self.work, self.result, self.timer, self.what, self.group = work, result, timer, what, group

    def wait(self) -> Tensor:
        if self.work is not None:
            with self.timer.measure(self.result.device), explained(self.what, self.group):
                self.work.wait()
            self.work = None
        return self.result


class ReplicateGroup:
    """The inter-node process group of one rank, with byte and time accounting."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)  # this replica's row in a gathered payload
        self.timer = _Timer()

    def all_gather(self, buffer: Tensor, stats: CommStats, what: str = "all-gather of the momentum payload") -> Pending:
        """Start gathering every replica's 1-D ``buffer`` (same size everywhere): rows of an ``(R, n)`` tensor."""
        if self.size == 1:
            return Pending(None, buffer.unsqueeze(0), self.timer, what, self.group)
        gathered = buffer.new_empty(self.size * buffer.numel())
        with explained(what, self.group):
            work = all_gather_into(gathered, buffer, self.group, async_op=True)
        self._count(stats, (self.size - 1) * buffer.numel() * buffer.element_size())
        return Pending(work, gathered.view(self.size, -1), self.timer, what, self.group)

    def all_to_all(self, chunks: list[Tensor], sizes: list[int], stats: CommStats) -> Pending:
        """Start sending 1-D ``chunks[j]`` to replica ``j`` and receiving ``sizes[i]`` elements from each replica ``i``
        (this replica's own chunk included, which crosses no link): the received chunks back to back."""
        what = "all-to-all of the momentum payload"
        if self.size == 1:
            return Pending(None, chunks[0], self.timer, what, self.group)
        received = chunks[0].new_empty(sum(sizes))
        with explained(what, self.group):
            work = dist.all_to_all_single(received, torch.cat(chunks), sizes, [c.numel() for c in chunks],
                                          group=self.group, async_op=True)
        size = chunks[0].element_size()
        others = [j for j in range(self.size) if j != self.rank]
        self._count(stats, sum(chunks[j].numel() for j in others) * size, sum(sizes[j] for j in others) * size)
        return Pending(work, received, self.timer, what, self.group)

    def all_reduce(self, buffer: Tensor, stats: CommStats) -> Pending:
        """Start summing ``buffer`` over the replicas, in place."""
        what = "all-reduce of the momentum payload"
        if self.size == 1:
            return Pending(None, buffer, self.timer, what, self.group)
        with explained(what, self.group):
            work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self._count(stats, dense_allreduce_bytes(buffer.numel(), self.size, buffer.element_size()))
        return Pending(work, buffer, self.timer, what, self.group)

    def broadcast(self, buffer: Tensor, stats: CommStats) -> Pending:
        """Start sending replica 0's 1-D ``buffer`` to every replica, in place. Each of the ``R - 1`` others receives
        the whole buffer, whatever the algorithm: counted as ``(R - 1) / R`` of it sent and received per rank."""
        what = "broadcast of replica 0's parameters"
        if self.size == 1:
            return Pending(None, buffer, self.timer, what, self.group)
        with explained(what, self.group):
            work = dist.broadcast(buffer, src=dist.get_global_rank(self.group, 0), group=self.group, async_op=True)
        self._count(stats, (self.size - 1) * buffer.numel() * buffer.element_size() // self.size)
        return Pending(work, buffer, self.timer, what, self.group)

    def all_reduce_max(self, buffer: Tensor, stats: CommStats) -> Tensor:
        """The element-wise maximum of a small ``buffer`` over the replicas (waited for, in place)."""
        if self.size == 1:
            return buffer
        with explained("all-reduce of the drift check's verdict", self.group):
            dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=self.group)
        self._count(stats, dense_allreduce_bytes(buffer.numel(), self.size, buffer.element_size()))
        return buffer

    @staticmethod
    def _count(stats: CommStats, sent: int, received: int | None = None) -> None:
        """One collective; ring algorithms receive as many bytes as they send (``received=None``)."""
        stats.collectives += 1
        stats.bytes_sent += sent
        stats.bytes_received += sent if received is None else received
