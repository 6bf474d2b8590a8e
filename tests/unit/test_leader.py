"""``replicator="leader"`` on R replicas simulated in one process (their all-reduce a sum of the buffers each
started): the first exchange sends nothing, the next is the replicas' exact mean at the positions the leader chose
from its error feedback, each replica's error feedback keeps exactly what it did not send, and every replica
decodes the same bits and agrees on the same next positions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_flexdemo.optim.plan import Stack
from hf_flexdemo.wire import compression, quantize
from hf_flexdemo.wire.collectives import CommStats, Pending
from hf_flexdemo.wire.dct import BlockLayout
from hf_flexdemo.wire.replicators import exchange_bytes
from hf_flexdemo.wire.replicators.leader import LeaderReplicator
from hf_flexdemo.wire.workspace import Workspace

SHAPE, CHUNK, PARAMS = (16, 24), 8, 2


class Bus:
    """What the simulated replicas' all-reduce sums."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []


class SimulatedGroup:
    """Replica ``rank`` of ``size``: ``all_reduce`` returns the sum of every replica's buffer (all started first)."""

    def __init__(self, bus: Bus, rank: int, size: int) -> None:
        self.bus, self.rank, self.size = bus, rank, size

    def all_reduce(self, buffer: torch.Tensor, stats: CommStats) -> Pending:
        self.bus.buffers.append(buffer)
        stats.collectives += 1
        total = torch.zeros_like(buffer)
        bus = self.bus

        class Summed:
            def wait(self) -> torch.Tensor:
                return total.copy_(torch.stack(bus.buffers).sum(0))

        return Summed()


def _stack(momentum: torch.Tensor) -> Stack:
    stack = Stack(3, BlockLayout.for_shape(SHAPE, CHUNK, "none"), {})
    stack.states = [{} for _ in range(PARAMS)]
    stack.momentum = momentum.clone()
    return stack


def _exchange(replicators, stacks, *, k: int, step: int):
    """One exchange of every replica: select, encode, start; then finish and decode on each."""
    workspaces = [Workspace() for _ in replicators]
    sent = []
    for replicator, stack, workspace in zip(replicators, stacks, workspaces):
        before = stack.momentum.clone()
        replicator.select(stack, k=k, step=step, workspace=workspace)
        replicator.encode(stack, feedback=1.0, workspace=workspace)
        sent.append(before - stack.momentum)
    exchanges = [r.start([s], [torch.zeros(1)], CommStats()) for r, s in zip(replicators, stacks)]
    decoded = []
    for replicator, stack, exchange, workspace in zip(replicators, stacks, exchanges, workspaces):
        (received,), trailer = replicator.finish(exchange)
        assert trailer[0].item() == 0  # the flag: no replica was non-finite
        decoded.append(replicator.decode(stack, received, workspace=workspace).clone())
    return sent, decoded


@pytest.mark.parametrize("replicas", [2, 3, 8])
@pytest.mark.parametrize("value_dtype", ["int2", "int4"])
@pytest.mark.parametrize("rate", [0.25, 1 / 16])  # bitmasks and packed indices
def test_the_consensus_is_the_exact_mean_at_the_leaders_positions(replicas, value_dtype, rate):
    bus = Bus()
    replicators = [LeaderReplicator(SimulatedGroup(bus, r, replicas), value_dtype=value_dtype, consensus="replicas",
                                    seed=5) for r in range(replicas)]
    g = torch.Generator().manual_seed(replicas)
    stacks = [_stack(torch.randn(PARAMS, *SHAPE, generator=g)) for _ in range(replicas)]
    layout = stacks[0].layout
    k = compression.kept_per_block(layout.block_numel, rate, None)
    initial = [s.momentum.clone() for s in stacks]

    sent, decoded = _exchange(replicators, stacks, k=k, step=7)  # no positions agreed yet: scale 0
    assert all(not s.any() for s in sent) and all(not q.any() for q in decoded)
    assert all(torch.equal(s.momentum, m) for s, m in zip(stacks, initial))  # everything kept for later
    leader = replicators[0].leader(7, stacks[0])
    want = compression.select_topk(initial[leader], layout, k, torch.empty_like(initial[leader]))
    agreed = replicators[0].agreed(stacks[0], k)
    assert torch.equal(agreed[0].sort(1).values, want.sort(1).values)  # the leader's top k, in every replica
    for replicator, stack in zip(replicators, stacks):
        mine = replicator.agreed(stack, k)
        assert torch.equal(mine[0], agreed[0]) and torch.equal(mine[1], agreed[1])
    values = compression.gather(initial[leader], layout, agreed[0])[1]
    assert torch.equal(agreed[1], quantize.scale_of(values, quantize.WIDTHS[value_dtype]).float())

    bus.buffers.clear()
    momenta = [s.momentum.clone() for s in stacks]
    _, decoded = _exchange(replicators, stacks, k=k, step=8)
    flat, bits, own = layout.flat_positions(PARAMS, agreed[0]).view(-1), quantize.WIDTHS[value_dtype], []
    for before, after in zip(momenta, stacks):
        codes = quantize.codes_at(before.bfloat16().view(-1)[flat].view(agreed[0].shape), agreed[1], bits)
        levels = quantize.levels(codes, agreed[1], bits).view(-1)
        own.append(torch.zeros_like(before).view(-1).index_put_((flat,), levels).view_as(before))
        # only the agreed positions travel, at the agreed scale; error feedback keeps exactly what was not sent
        assert torch.equal(after.momentum, before - own[-1])
    mean = torch.stack(own).double().mean(0)
    torch.testing.assert_close(decoded[0].double(), mean, rtol=1e-6, atol=1e-7)
    assert all(torch.equal(q, decoded[0]) for q in decoded)  # the same bits on every replica
    assert decoded[0].view(-1)[flat].abs().sum() > 0


def test_bytes_are_flat_in_the_number_of_nodes():
    """The all-gather's bytes per rank grow with R - 1; the leader's grow with the width of a sum (log R)."""
    shapes, per = [(1024, 1024)], {}
    for replicas in (2, 4, 8, 16, 64):
        per[replicas] = {name: exchange_bytes(name, shapes, replicas, rate=0.25, topk=None, chunk=32,
                                              value_dtype="int2") for name in ("demo", "leader")}
    assert per[64]["demo"] > 60 * per[2]["demo"]
    assert per[64]["leader"] < 4 * per[2]["leader"]
    assert per[8]["leader"] < 0.4 * per[8]["demo"]


def test_the_documented_bits_per_element_are_the_formula():
    """docs/how-it-works.md quotes the bits per element per exchange at 1/4 of 32 x 32 in int2 (a 1024 x 1024 shard)."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "how-it-works.md").read_text()
    text = " ".join(docs.split("`replicator=\"leader\"` keeps", 1)[1].split("\n* ", 1)[0].split())

    def bits(name: str, replicas: int) -> float:
        return exchange_bytes(name, [(1024, 1024)], replicas, rate=0.25, topk=None, chunk=32,
                              value_dtype="int2") * 8 / 2**20

    quoted = [f"{bits('leader', 2):.2f} bits per element per exchange at 2 nodes",
              f"(the all-gather: {bits('demo', 2):.2f})",
              f"{bits('leader', 4):.2f} at 4 ({bits('demo', 4):.2f})", f"{bits('leader', 8):.2f} at 8",
              f"({bits('demo', 8):.3g})", f"{bits('leader', 64):.2g} at 64 ({bits('demo', 64):.2g})"]
    for phrase in quoted:
        assert phrase in text, phrase
