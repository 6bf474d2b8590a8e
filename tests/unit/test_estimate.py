"""The link estimate (``hf_flexdemo.wire.estimate``, ``python -m hf_flexdemo.doctor --parameters``): bits per
parameter per step from the wire's byte formula, the mean load and the link that hides each fragment's exchange."""

import subprocess
import sys
from pathlib import Path

import pytest

from hf_flexdemo.wire import compression
from hf_flexdemo.wire.estimate import link_estimate, payload_bits_per_param

# The defaults' payload per 32 x 32 block: a 1024-bit mask, 256 2-bit values and a bfloat16 scale.
BLOCK_BYTES = 1024 // 8 + 256 * 2 // 8 + 2


def test_the_default_block_payload_is_the_bitmask_the_values_and_the_scale():
    assert compression.block_payload_bytes(1024, 256, "int2") == BLOCK_BYTES


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_bits_per_parameter_follow_the_all_gathers_formula(nodes):
    """A round sends every block's payload (and a 1-byte flag per exchange) to each of the R - 1 other nodes, over 8
    local steps; the 4 fragments' exchanges are a quarter of it each."""
    side = 4096
    exchange = (nodes - 1) * (side * side // 1024 * BLOCK_BYTES + 1) * 8 / side**2
    per_step, per_fragment = payload_bits_per_param(nodes)
    assert per_step == pytest.approx(exchange / 8, rel=1e-12)
    assert per_fragment == pytest.approx(exchange / 4, rel=1e-12)


def test_sparse_blocks_send_packed_indices():
    """1/16 of 32 x 32: 64 ten-bit indices (80 bytes) instead of the bitmask; 64 of 64 x 64 (1/64): 96 bytes of 12-bit
    indices, 16 of values and the scale, 0.22 bits per element per round, at H = 8 and 2 nodes 0.028 per step."""
    assert compression.block_payload_bytes(1024, 64, "int2") == 80 + 16 + 2
    per_step, _ = payload_bits_per_param(2, {"compression_rate": 1 / 64, "compression_chunk": 64})
    assert per_step == pytest.approx((114 * 4096 + 1) * 8 / 4096**2 / 8, rel=1e-12)
    assert f"{per_step:.3f}" == "0.028"


def test_one_node_sends_nothing():
    assert payload_bits_per_param(1) == (0.0, 0.0)
    assert link_estimate(1e9, 1.0, 1).needed_mbits == 0.0


def test_the_link_that_hides_the_exchange_carries_a_fragment_within_the_delay():
    """At the defaults a fragment's exchange starts every other step and travels for two (outer_delay resolves to
    local_steps / outer_fragments = 2), so the link that hides it carries the mean load; with outer_delay=1 it has
    one step for two steps' bytes: twice the mean."""
    default = link_estimate(1e9, 1.0, 2)
    assert default.needed_mbits == pytest.approx(default.mean_mbits)
    assert default.mean_mbits == pytest.approx(default.bits_per_param * 1e9 / 1e6)
    hurried = link_estimate(1e9, 1.0, 2, {"outer_delay": 1})
    assert hurried.needed_mbits == pytest.approx(2 * hurried.mean_mbits) and hurried.mean_mbits == default.mean_mbits
    assert link_estimate(1e9, 0.5, 2).needed_mbits == pytest.approx(2 * default.needed_mbits)


def test_a_short_run_takes_rounds_of_4_and_needs_twice_the_link():
    """``local_steps=None`` follows the run's length: under 1,000 steps rounds of 4 (each fragment lands after one
    step), so twice the bits on the same link window; a long or unknown length, rounds of 8."""
    long, unknown = link_estimate(1e9, 1.0, 2, max_steps=1000), link_estimate(1e9, 1.0, 2)
    short = link_estimate(1e9, 1.0, 2, max_steps=999)
    assert long == unknown and short.bits_per_param == pytest.approx(2 * long.bits_per_param, rel=1e-3)
    assert short.needed_mbits == pytest.approx(2 * long.needed_mbits, rel=1e-3)
    assert link_estimate(1e9, 1.0, 2, {"local_steps": 8}, max_steps=300) == long  # a value set is kept


def test_a_long_run_on_a_large_model_takes_rounds_of_16_and_half_the_bits():
    """From 2,000 steps on 8 M parameters or more, ``local_steps=None`` resolves to 16: half a round of 8's bits per
    step, so half the link's mean load. Each of its 4 fragments still lands two steps after it starts
    (``outer_delay=None``, at most 2), so the link that hides it is a round of 8's: the load comes in bursts."""
    eight = link_estimate(8e6, 1.0, 2, max_steps=1999)
    sixteen = link_estimate(8e6, 1.0, 2, max_steps=2000)
    assert sixteen.bits_per_param == pytest.approx(eight.bits_per_param / 2, rel=1e-3)
    assert sixteen.mean_mbits == pytest.approx(eight.mean_mbits / 2, rel=1e-3)
    assert sixteen.needed_mbits == pytest.approx(eight.needed_mbits, rel=1e-3)
    assert link_estimate(7.9e6, 1.0, 2, max_steps=2000).bits_per_param == eight.bits_per_param
    assert link_estimate(8e6, 1.0, 2, {"local_steps": 8}, max_steps=2000) == eight  # a value set is kept


def test_fewer_bits_with_more_local_steps_and_bad_knobs_are_refused():
    assert payload_bits_per_param(2, {"local_steps": 16})[0] == pytest.approx(payload_bits_per_param(2)[0] / 2,
                                                                              rel=1e-3)
    with pytest.raises(ValueError, match="invalid compression_rate=2"):
        link_estimate(1e9, 1.0, 2, {"compression_rate": 2})


def test_the_doctor_prints_the_estimate_without_launching():
    out = subprocess.run([sys.executable, "-m", "hf_flexdemo.doctor", "--parameters", "1e9", "--step_seconds", "1",
                          "--nodes", "2"], capture_output=True, text=True, check=True).stdout
    expected = link_estimate(1e9, 1.0, 2)
    assert out.strip() == expected.describe()
    assert f"{expected.bits_per_param:.3g} bits per parameter per step" in out and "2 nodes" in out


def test_the_estimates_the_docs_quote_are_the_doctors():
    """README.md and docs/multi-node.md quote ``--parameters 1e9 --step_seconds 1`` at 2 and 8 nodes."""
    root = Path(__file__).resolve().parents[2]
    readme = " ".join((root / "README.md").read_text().split())
    multi_node = (root / "docs" / "multi-node.md").read_text()
    two, eight = link_estimate(1e9, 1.0, 2), link_estimate(1e9, 1.0, 8)
    assert (f"{two.bits_per_param:.3g} bits per parameter per step sent and received per node; the link carries "
            f"{two.mean_mbits:,.0f} Mbit/s on average and hides the exchange behind compute from "
            f"{two.needed_mbits:,.0f} Mbit/s per direction (at `--nodes 8`, {eight.mean_mbits:,.0f} and "
            f"{eight.needed_mbits:,.0f} Mbit/s") in readme
    long = link_estimate(1e9, 1.0, 2, max_steps=2000)
    assert (f"`--max_steps 2000`, a long run's rounds of 16 on this size: {long.bits_per_param:.3g} bits, "
            f"{long.mean_mbits:,.0f} Mbit/s on average, hidden from the same {long.needed_mbits:,.0f})") in readme
    for nodes, estimate in ((2, two), (8, eight)):
        assert (f"| {nodes} | {estimate.bits_per_param:.3g} | {estimate.mean_mbits:,.0f}, "
                f"{estimate.needed_mbits:,.0f} |") in multi_node


def test_the_owner_estimates_multi_node_quotes_are_the_doctors():
    """docs/multi-node.md quotes ``--replicator owner`` at 2, 4 and 8 nodes: nearly flat in R."""
    multi_node = (Path(__file__).resolve().parents[2] / "docs" / "multi-node.md").read_text()
    table = multi_node.split('`replicator="owner"`: bits per parameter per step', 1)[1]
    estimates = {nodes: link_estimate(1e9, 1.0, nodes, {"replicator": "owner"}) for nodes in (2, 4, 8)}
    for nodes, estimate in estimates.items():
        assert (f"| {nodes} | {estimate.bits_per_param:.3g} | {estimate.mean_mbits:,.0f}, "
                f"{estimate.needed_mbits:,.0f} |") in table
    assert estimates[2].bits_per_param == link_estimate(1e9, 1.0, 2).bits_per_param
    assert estimates[8].bits_per_param <= 2 * estimates[2].bits_per_param
