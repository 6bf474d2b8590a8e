"""``replicator="owner"``: received bytes flat in the number of nodes ``R``, each node still sending its own top-k.

Every block has an owner: block ``b`` of a parameter's shard belongs to node ``b mod R``. An exchange is one
all-to-all. Each node sends each owner that owner's blocks of its payload (its own top ``k`` of every block, encoded
as ``replicator="demo"`` encodes them), and sends every node the *result* of the blocks it owns from the exchange
before. An owner averages the payloads its blocks received, adds what its own error feedback held back, keeps the
top ``k`` of each block and encodes them as a sender would: that is its result, and what it did not forward stays in
its error feedback. So both sides feed back: a sender keeps what it did not send, an owner what it did not forward.

The consensus ``Q`` of an exchange is the owners' results of the exchange before, which every node decodes from the
same bytes: replicas stay bit-identical, and a round's mean lands one exchange after it was sent. The first exchange
has no results yet, so its ``Q`` is zero.

A rank sends each peer its share of that peer's blocks and its own blocks' result, and receives the same from each:
about ``2 (R - 1) / R`` payloads, one at ``R = 2`` (as the all-gather) and 1.75 at ``R = 8``, where the all-gather of
``replicator="demo"`` receives ``R - 1``. Owners of an extra block (``b mod R`` favours the low ranks when ``R`` does
not divide a shard's blocks) send a little more: :meth:`OwnerReplicator.step_bytes` counts rank ``rank``'s.

State, per parameter (:data:`STATE_KEYS`, in ``state_dict``, so a resume is exact): the owner's error feedback
``(blocks, block_numel)`` float32 and its result ``(blocks, payload bytes)`` uint8, zeros in the blocks other nodes own.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .. import compression
from ..collectives import CommStats, pack, unpack
from ..workspace import Workspace
from .base import Exchange, ShardTotals
from .demo import DemoReplicator

if TYPE_CHECKING:
    from ...optim.plan import Stack  # the wire works on the optimizer's stacks; it imports nothing of the core

FEEDBACK, RESULT = STATE_KEYS = ("owner_feedback", "owner_result")


@functools.lru_cache(maxsize=256)
def owned_rows(params: int, num_blocks: int, replicas: int, device: torch.device) -> tuple[Tensor, ...]:
    """Per replica, the rows of a stack's ``(params * num_blocks, ...)`` blocks it owns: block ``b`` of each
    parameter belongs to replica ``b mod replicas``. Built once per shape, from shapes only: no host sync."""
    owner = torch.arange(num_blocks).remainder(replicas).repeat(params)
    return tuple((owner == r).nonzero().view(-1).to(device) for r in range(replicas))


def row_bytes(pieces: list[Tensor]) -> int:
    """Bytes of one block's wire pieces (one row of :func:`to_rows`)."""
    return sum(p[0].numel() * p.element_size() for p in pieces if p.numel())


def to_rows(pieces: list[Tensor]) -> Tensor:
    """``(N, bytes)`` uint8: each block's wire pieces (positions and values, leading dimension ``N``) side by side."""
    count = pieces[0].shape[0]
    return torch.cat([p.reshape(count, -1).view(torch.uint8) for p in pieces if p.numel()], dim=1)


def from_rows(rows: Tensor, like: list[Tensor]) -> list[Tensor]:
    """The pieces of :func:`to_rows`' ``rows``, typed and shaped like ``like`` (any leading row count); a piece without
    bytes (int2's shape marker) is ``like``'s own."""
    pieces, offset = [], 0
    for piece in like:
        if not piece.numel():
            pieces.append(piece)
            continue
        width = piece[0].numel() * piece.element_size()
        part = rows[:, offset:offset + width].reshape(-1).clone()  # a fresh, aligned copy
        pieces.append(part.view(piece.dtype).view(rows.shape[0], *piece.shape[1:]))
        offset += width
    return pieces


class OwnerReplicator(DemoReplicator):
    """The sender's side is ``demo``'s (:meth:`choose`, :meth:`encode`); the exchange and the decode are the owners'."""

    name = "owner"
    lag = 1  # a round's mean lands with the exchange after it

    def _rows(self, stack: Stack) -> tuple[Tensor, ...]:
        return owned_rows(len(stack.states), stack.layout.num_blocks, self.group.size, stack.delta.device)

    def _result(self, stack: Stack, width: int) -> Tensor:
        """``(N, width)``: this replica's results of its blocks (zeros before the first exchange, and elsewhere)."""
        if RESULT not in stack.states[0]:
            count = len(stack.states) * stack.layout.num_blocks
            return torch.zeros((count, width), dtype=torch.uint8, device=stack.delta.device)
        return torch.cat([state[RESULT] for state in stack.states])

    def _template(self, stack: Stack, k: int) -> list[Tensor]:
        """One block's wire pieces at ``k`` per block, for their layout (a result may be read before any selection
        of this run, after a resume)."""
        device = stack.delta.device
        where, _ = compression.encode_positions(torch.arange(k, device=device).view(1, k), stack.layout.block_numel)
        return [where, *compression.encode_values(torch.zeros((1, k), device=device), self.value_dtype)]

    def _sizes(self, stacks: list[Stack], trailer: Tensor) -> list[int]:
        """Bytes received from each replica: its share of this replica's blocks and its own blocks' result."""
        me = self.group.rank
        sizes = [trailer.numel()] * self.group.size
        for stack in stacks:
            width, rows = row_bytes(stack.wire), self._rows(stack)
            for i in range(self.group.size):
                sizes[i] += (rows[me].numel() + rows[i].numel()) * width
        return sizes

    def start(self, stacks: list[Stack], trailer: list[Tensor], stats: CommStats) -> Exchange:
        me, chunks = self.group.rank, [[] for _ in range(self.group.size)]
        for stack in stacks:
            payload, rows = to_rows(stack.wire), self._rows(stack)
            result = self._result(stack, payload.shape[1]).index_select(0, rows[me]).reshape(-1)
            for j, chunk in enumerate(chunks):
                chunk += [payload.index_select(0, rows[j]).reshape(-1), result]
        tail = pack(trailer)
        stats.coefficients += sum(s.values.numel() for s in stacks)
        pending = self.group.all_to_all([torch.cat([*chunk, tail]) for chunk in chunks],
                                        self._sizes(stacks, tail), stats)
        return Exchange(stacks, pending, trailer)

    def finish(self, exchange: Exchange) -> tuple[list[Any], list[Tensor]]:
        """Per stack, per replica ``i``: ``(i's share of this replica's blocks, i's result)``; the trailers' rows."""
        stacks, me = exchange.stacks, self.group.rank
        tail = pack(exchange.like)
        chunks = exchange.pending.wait().split(self._sizes(stacks, tail))
        received: list[list[tuple[Tensor, Tensor]]] = [[] for _ in stacks]
        trailers = []
        for i, chunk in enumerate(chunks):
            offset = 0
            for mine, stack in zip(received, stacks):
                width, rows = row_bytes(stack.wire), self._rows(stack)
                share, result = rows[me].numel() * width, rows[i].numel() * width
                mine.append((chunk[offset:offset + share].view(-1, width),
                            chunk[offset + share:offset + share + result].view(-1, width)))
                offset += share + result
            trailers.append(chunk[offset:])
        return received, unpack(torch.stack(trailers), exchange.like)

    def _read(self, rows: Tensor, like: list[Tensor], block_numel: int, k: int) -> tuple[Tensor, Tensor]:
        """``(indices, values)``, each ``(rows, k)``, of wire rows laid out like this replica's own payload."""
        where, *pieces = from_rows(rows, like)
        return compression.decode_positions(where, block_numel, k), compression.decode_values(pieces).float()

    def decode(self, stack: Stack, received: Any, *, workspace: Workspace) -> Tensor:
        """``Q``: the owners' results of the exchange before; then this replica, as the owner of its blocks, reduces
        the shares they received into its next result."""
        layout, like, (count, k) = stack.layout, stack.wire, stack.values.shape
        rows, dense = self._rows(stack), workspace("dense", stack.momentum).zero_()
        if RESULT in stack.states[0]:
            indices = torch.empty((count, k), dtype=torch.long, device=dense.device)
            values = torch.empty((count, k), dtype=torch.float32, device=dense.device)
            for owned, (_, result) in zip(rows, received):
                got = self._read(result, like, layout.block_numel, k)
                indices.index_copy_(0, owned, got[0])
                values.index_copy_(0, owned, got[1])
            dense.view(-1).index_put_((layout.flat_positions(len(stack.states), indices).view(-1),),
                                      values.view(-1).to(dense.dtype))
        self._reduce(stack, [share for share, _ in received], rows[self.group.rank])
        return self.inverse(stack, dense, workspace)

    def _reduce(self, stack: Stack, shares: list[Tensor], owned: Tensor) -> None:
        """This replica's next result: the top ``k`` of (the mean of the ``shares`` of its ``owned`` blocks + its
        error feedback), encoded as a payload; the error feedback keeps the rest. (A replica that owns none of a
        small stack's blocks keeps zeros.)"""
        layout, like, (count, k), states = stack.layout, stack.wire, stack.values.shape, stack.states
        feedback = (torch.cat([s[FEEDBACK] for s in states]) if FEEDBACK in states[0]
                    else torch.zeros((count, layout.block_numel), device=owned.device))
        result = self._result(stack, row_bytes(like))
        if owned.numel():
            held = feedback.index_select(0, owned).add_(self._mean(shares, like, layout.block_numel, k))
            where, order = compression.encode_positions(held.abs().topk(k, dim=1, sorted=False).indices,
                                                        layout.block_numel)
            pieces = compression.encode_values(held.gather(1, order), self.value_dtype)
            held.scatter_add_(1, order, compression.decode_values(pieces).float().neg())  # not in place: may be a piece
            feedback.index_copy_(0, owned, held)
            result.index_copy_(0, owned, to_rows([where, *pieces]))
        for state, mine, sent in zip(states, feedback.split(layout.num_blocks), result.split(layout.num_blocks)):
            state[FEEDBACK], state[RESULT] = mine, sent

    def _mean(self, shares: list[Tensor], like: list[Tensor], block_numel: int, k: int) -> Tensor:
        """``(owned, block_numel)``: the replicas' ``shares`` of the owned blocks decoded and averaged, over the
        replicas (``consensus="replicas"``) or over those that chose each value (``"choosers"``)."""
        mean = torch.zeros((shares[0].shape[0], block_numel), device=shares[0].device)
        counts = torch.zeros_like(mean) if self.consensus == "choosers" else None
        for share in shares:  # in replica order
            indices, values = self._read(share, like, block_numel, k)
            mean.scatter_add_(1, indices, values)
            if counts is not None:
                counts.scatter_add_(1, indices, torch.ones_like(values))
        return mean.div_(counts.clamp_(min=1) if counts is not None else len(shares))

    def release(self, stack: Stack, workspace: Workspace, *, k: int) -> None:
        """Before a final round on another wire: ``R`` times this owner's result still to land and its error
        feedback join its own error feedback (a mean over the replicas carries them once), and are forgotten."""
        states, layout = stack.states, stack.layout
        if FEEDBACK not in states[0]:
            return
        held = torch.cat([state.pop(FEEDBACK) for state in states])
        if RESULT in states[0]:
            owned = self._rows(stack)[self.group.rank]
            result = torch.cat([state.pop(RESULT) for state in states]).index_select(0, owned)
            indices, values = self._read(result, self._template(stack, k), layout.block_numel, k)
            held.index_copy_(0, owned, held.index_select(0, owned).scatter_add_(1, indices, values))
        dense = workspace("dense", stack.delta).zero_()
        blocks = layout.blocks(dense)
        blocks.copy_(held.view(blocks.shape))
        stack.delta.add_(self.inverse(stack, dense, workspace), alpha=self.group.size)

    @classmethod
    def step_bytes(cls, totals: ShardTotals, replicas: int, *, value_dtype: str, timing: bool, rank: int = 0) -> int:
        """Per shard of ``blocks`` blocks, of which replica ``rank`` owns ``c``: its share of the other owners' blocks
        (``blocks - c``) and ``R - 1`` copies of its result (``c`` each), each block a payload; and the trailer (the
        1-byte flag, + 4 timing bytes) to each peer. Received: the same."""
        total = 0
        for blocks, block_numel, k in totals.blocks:
            owned = len(range(rank, blocks, replicas))
            total += compression.block_payload_bytes(block_numel, k, value_dtype) * (blocks + (replicas - 2) * owned)
        return total + (replicas - 1) * (1 + 4 * int(timing))
