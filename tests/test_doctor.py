"""``python -m hf_flexdemo.doctor`` under torchrun: the topology, the groups and a measured link."""

import pytest
from launch import torchrun

pytestmark = pytest.mark.multiprocess


def test_doctor_reports_topology_groups_and_link():
    out = torchrun("-m", 4, ["hf_flexdemo.doctor", "--shard_size", "2", "--megabytes", "1"], timeout=120).stdout
    assert "world 4 = 2 node(s) x 2 process(es); backend gloo" in out
    assert "shard group (one node) ranks [0, 1]" in out and "replicate group ranks [1, 3]" in out
    assert "note: this replicate group stays on one host" in out  # one machine simulating two nodes
    assert "replicate link: latency" in out and "Mbit/s per rank" in out
