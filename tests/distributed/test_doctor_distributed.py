"""``python -m hf_flexdemo.doctor`` under torchrun: the topology, the groups and a measured link."""

import torch
from launch import torchrun


def test_doctor_reports_topology_groups_and_link():
    out = torchrun("-m", 4, ["hf_flexdemo.doctor", "--shard_size", "2", "--megabytes", "1"], timeout=120).stdout
    assert "world 4 = 2 node(s) x 2 process(es); backend gloo" in out
    assert "shard group (one node) ranks [0, 1]" in out and "replicate group ranks [1, 3]" in out
    assert "note: this replicate group stays on one host" in out  # one machine simulating two nodes
    assert "replicate link: latency" in out and "Mbit/s per rank" in out
    assert "node 1 (ranks [2, 3]): device CPU" in out and f"torch {torch.__version__}, CUDA" in out
    assert ", NCCL -" in out and "drift policy: on_drift='auto' (here: 'raise')" in out  # the default, alike
    assert "WARNING: the nodes' hardware" not in out  # one machine: alike
