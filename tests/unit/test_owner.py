"""``replicator="owner"`` on R replicas simulated in one process (their all-to-all hands each replica the chunks every
replica addressed to it): the uncompressed wire lands the replicas' exact mean one exchange later, nothing is lost on
a compressed one (what the senders subtracted lands later or waits in an owner's error feedback), every replica
decodes the same bits, a release hands the pipeline back to the senders' error feedback, and the bytes stay flat in R.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_flexdemo import CompressionPolicy, FlexDeMo
from hf_flexdemo.optim.plan import Stack
from hf_flexdemo.optim.reshard import reshard_state_dict
from hf_flexdemo.wire import compression
from hf_flexdemo.wire.collectives import CommStats
from hf_flexdemo.wire.dct import BlockLayout
from hf_flexdemo.wire.replicators import exchange_bytes
from hf_flexdemo.wire.replicators.owner import FEEDBACK, RESULT, OwnerReplicator
from hf_flexdemo.wire.workspace import Workspace

SHAPE, CHUNK, PARAMS = (16, 24), 8, 2  # 2 x 3 blocks of 8 x 8 per parameter: R = 8 leaves owners without blocks


class Bus:
    """What the simulated replicas' all-to-all exchanges: each replica's chunks, addressed by destination."""

    def __init__(self) -> None:
        self.chunks: dict[int, list[torch.Tensor]] = {}


class SimulatedGroup:
    """Replica ``rank`` of ``size``: ``all_to_all`` returns the chunks every replica addressed to it (all started
    first), checking the sizes it expects."""

    def __init__(self, bus: Bus, rank: int, size: int) -> None:
        self.bus, self.rank, self.size = bus, rank, size

    def all_to_all(self, chunks: list[torch.Tensor], sizes: list[int], stats: CommStats):
        self.bus.chunks[self.rank] = chunks
        stats.collectives += 1
        bus, me = self.bus, self.rank

        class Received:
            def wait(self) -> torch.Tensor:
                got = [bus.chunks[i][me] for i in range(len(bus.chunks))]
                assert [g.numel() for g in got] == sizes
                return torch.cat(got)

        return Received()


def _replicas(replicas: int, value_dtype: str, consensus: str = "replicas") -> list[OwnerReplicator]:
    bus = Bus()
    return [OwnerReplicator(SimulatedGroup(bus, r, replicas), value_dtype=value_dtype, consensus=consensus, seed=0)
            for r in range(replicas)]


def _stack(momentum: torch.Tensor) -> Stack:
    stack = Stack(3, BlockLayout.for_shape(SHAPE, CHUNK, "none"), {})
    stack.states = [{} for _ in range(PARAMS)]
    stack.momentum, stack.delta = momentum.clone(), torch.zeros_like(momentum)
    return stack


def _exchange(replicators, stacks, *, k: int):
    """One exchange of every replica: what each sender subtracted, and each replica's decoded ``Q``."""
    workspaces = [Workspace() for _ in replicators]
    sent = []
    for replicator, stack, workspace in zip(replicators, stacks, workspaces):
        before = stack.momentum.clone()
        replicator.select(stack, k=k, step=0, workspace=workspace)
        replicator.encode(stack, feedback=1.0, workspace=workspace)
        sent.append(before - stack.momentum)
    exchanges = [r.start([s], [torch.zeros(1, dtype=torch.uint8)], CommStats()) for r, s in zip(replicators, stacks)]
    decoded = []
    for replicator, stack, exchange, workspace in zip(replicators, stacks, exchanges, workspaces):
        (received,), trailer = replicator.finish(exchange)
        assert trailer[0].shape == (len(replicators), 1) and not trailer[0].any()
        decoded.append(replicator.decode(stack, received, workspace=workspace).clone())
    assert all(torch.equal(q, decoded[0]) for q in decoded)  # the same bits on every replica
    return sent, decoded[0]


def _blocks_to_dense(stack: Stack, blocks: torch.Tensor) -> torch.Tensor:
    """A ``(N, block_numel)`` block-space tensor in the momentum's layout."""
    dense = torch.zeros_like(stack.momentum)
    view = stack.layout.blocks(dense)
    view.copy_(blocks.view(view.shape))
    return dense


def _owner_feedback(stacks) -> torch.Tensor:
    """Every owner's error feedback together (each block has one owner; zeros in the blocks it does not own)."""
    return sum(_blocks_to_dense(s, torch.cat([state[FEEDBACK] for state in s.states])) for s in stacks)


@pytest.mark.parametrize("replicas", [2, 3, 8])
def test_the_uncompressed_wire_lands_the_exact_mean_one_exchange_later(replicas):
    replicators = _replicas(replicas, "float32")
    g = torch.Generator().manual_seed(replicas)
    stacks = [_stack(torch.randn(PARAMS, *SHAPE, generator=g)) for _ in range(replicas)]
    block = stacks[0].layout.block_numel
    previous = None
    for _ in range(3):
        sent, q = _exchange(replicators, stacks, k=block)
        assert all(not s.momentum.any() for s in stacks)  # everything was sent
        if previous is None:
            assert not q.any()  # the first exchange has no results yet
        else:
            assert torch.equal(q, previous)
        total = sent[0].clone()
        for more in sent[1:]:
            total += more  # in replica order, as the owners add
        previous = total / replicas
        assert not _owner_feedback(stacks).any()  # the owners forwarded everything
        for stack in stacks:
            stack.momentum = torch.randn(PARAMS, *SHAPE, generator=g)


@pytest.mark.parametrize("replicas", [2, 3, 8])
@pytest.mark.parametrize("value_dtype", ["int2", "float8"])
@pytest.mark.parametrize("rate", [0.25, 1 / 16])  # bitmasks and packed indices
@pytest.mark.parametrize("consensus", ["replicas", "choosers"])
def test_nothing_is_lost_between_senders_and_owners(replicas, value_dtype, rate, consensus):
    """Each exchange's mean of what the senders subtracted lands with the next, or waits in its owner's feedback."""
    replicators = _replicas(replicas, value_dtype, consensus)
    g = torch.Generator().manual_seed(7 * replicas)
    stacks = [_stack(torch.randn(PARAMS, *SHAPE, generator=g)) for _ in range(replicas)]
    k = compression.kept_per_block(stacks[0].layout.block_numel, rate, None)
    before = torch.zeros_like(stacks[0].momentum)  # the owners' feedback before the exchange that sent ``sent``
    sent, q = _exchange(replicators, stacks, k=k)
    held = _owner_feedback(stacks)  # and after it
    for _ in range(3):
        if consensus == "replicas":
            mean = torch.stack(sent).double().mean(0)
        else:  # over the replicas that chose each value
            chose = torch.stack([s != 0 for s in sent]).sum(0).clamp(min=1)
            mean = torch.stack(sent).double().sum(0) / chose
        for stack in stacks:
            stack.momentum += torch.randn(PARAMS, *SHAPE, generator=g) * 0.1
        sent, q = _exchange(replicators, stacks, k=k)
        torch.testing.assert_close(q.double() + (held - before).double(), mean, rtol=1e-5, atol=1e-6)
        assert q.any() and held.any()
        before, held = held, _owner_feedback(stacks)


@pytest.mark.parametrize("replicas", [2, 8])
def test_a_release_hands_the_pipeline_back_to_the_senders(replicas):
    """The mean over the replicas of what each release adds to its error feedback is what the next exchange would
    land plus what the owners hold back; the owner state is gone."""
    replicators = _replicas(replicas, "int2")
    g = torch.Generator().manual_seed(3)
    stacks = [_stack(torch.randn(PARAMS, *SHAPE, generator=g)) for _ in range(replicas)]
    k = compression.kept_per_block(stacks[0].layout.block_numel, 0.25, None)
    _exchange(replicators, stacks, k=k)
    held = _owner_feedback(stacks)
    # what the next exchange would land: the results, as an exchange on copies of the owner state decodes them
    probe = [_stack(torch.zeros(PARAMS, *SHAPE)) for _ in range(replicas)]
    for copy, stack in zip(probe, stacks):
        copy.states = [{key: value.clone() for key, value in state.items()} for state in stack.states]
    _, landing = _exchange(_replicas(replicas, "int2"), probe, k=k)
    for replicator, stack in zip(replicators, stacks):
        replicator.release(stack, Workspace(), k=k)
        assert not any(key in state for state in stack.states for key in (FEEDBACK, RESULT))
    released = torch.stack([s.delta for s in stacks]).double().mean(0)
    torch.testing.assert_close(released, (landing + held).double(), rtol=1e-5, atol=1e-6)
    assert landing.any() and held.any()


def test_bytes_are_flat_in_the_number_of_nodes():
    """At 2 nodes as the all-gather's; at 8 under twice that on every rank, where the all-gather's are 7 times."""
    shapes = [(1024, 1024), (512, 1024), (1024,)]

    def sent(name: str, replicas: int, rank: int = 0) -> int:
        return exchange_bytes(name, shapes, replicas, rate=0.25, topk=None, chunk=32, value_dtype="int2", rank=rank)

    assert sent("owner", 2, 0) == sent("owner", 2, 1) == sent("demo", 2)
    assert sent("demo", 8) == 7 * sent("demo", 2)
    for rank in range(8):
        assert sent("owner", 2) < sent("owner", 8, rank) <= 2 * sent("owner", 2)


def test_it_needs_local_steps_and_its_checkpoints_keep_their_topology():
    model = torch.nn.Linear(8, 8)
    with pytest.raises(ValueError, match="replicator='owner' lands a consensus one exchange after"):
        FlexDeMo(model.parameters(), lr=1e-3, local_steps=1, compression=CompressionPolicy(replicator="owner"))
    state = {"state": {0: {"delta": torch.zeros(4), FEEDBACK: torch.zeros(1, 4), RESULT: torch.zeros(1, 2)}},
             "param_groups": [{"params": [0]}], "flexdemo": {"options": {"local_steps": 8}}}
    with pytest.raises(ValueError, match="resumes on the topology it was saved on"):
        reshard_state_dict([state, state], old_shard_size=1, rank=0, shard_size=1, replicate_size=1,
                           policy="average")


def test_the_documented_bits_per_element_are_the_formula():
    """docs/how-it-works.md quotes the bits per element per exchange at 1/4 of 32 x 32 in int2 (a 1024 x 1024 shard)."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "how-it-works.md").read_text()
    text = " ".join(docs.split("`replicator=\"owner\"` is flat in R", 1)[1].split("\n* ", 1)[0].split())

    def bits(replicas: int, name: str = "owner") -> str:
        sent = exchange_bytes(name, [(1024, 1024)], replicas, rate=0.25, topk=None, chunk=32, value_dtype="int2")
        return f"{sent * 8 / 2**20:.2f}"

    assert bits(2) == bits(2, "demo")  # "the all-gather's own figure"
    for phrase in (f"{bits(2)} bits per element per exchange at 2 nodes", f"{bits(4)} at 4", f"{bits(8)} at 8",
                   f"{bits(64)} at 64"):
        assert phrase in text, phrase
