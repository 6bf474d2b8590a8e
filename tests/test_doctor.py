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


def test_nccl_report_names_interface_and_infiniband(monkeypatch):
    import torch

    from hf_flexdemo.doctor import nccl_report

    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    lines = nccl_report()
    assert lines[0].startswith("NCCL 2.27.3: NCCL_SOCKET_IFNAME=-, NCCL_IB_DISABLE=1")
    assert any("InfiniBand is disabled" in line for line in lines)
    assert any("NCCL_SOCKET_IFNAME is unset" in line for line in lines)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("NCCL_IB_DISABLE", "0")
    assert nccl_report() == ["NCCL 2.27.3: NCCL_SOCKET_IFNAME=ib0, NCCL_IB_DISABLE=0, NCCL_IB_HCA=-, NCCL_NET=-, "
                             "NCCL_NET_GDR_LEVEL=-, NCCL_CROSS_NIC=-, NCCL_ALGO=-, NCCL_PROTO=-, NCCL_DEBUG=-"]
