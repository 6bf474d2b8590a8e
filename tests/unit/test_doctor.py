"""The doctor's reports from what the ranks gathered: unlike nodes and the drift policy, the NCCL settings (the command
under torchrun: tests/distributed/test_doctor_distributed.py)."""


def test_unlike_nodes_with_an_exact_drift_policy_are_warned_about():
    from hf_flexdemo.doctor import hardware_report

    h100 = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3"}
    a100 = {**h100, "device": "NVIDIA A100-SXM4-80GB"}
    nodes = [[0, 1], [2, 3]]
    lines = hardware_report([h100, h100, a100, a100], nodes, "raise")
    assert lines[:3] == ["node 0 (ranks [0, 1]): device NVIDIA H100 80GB HBM3, torch 2.13.0, CUDA 12.8, NCCL 2.27.3",
                         "node 1 (ranks [2, 3]): device NVIDIA A100-SXM4-80GB, torch 2.13.0, CUDA 12.8, NCCL 2.27.3",
                         "drift policy: on_drift='raise'"]
    assert "WARNING: the nodes' hardware or versions differ and on_drift='raise' is exact" in lines[3]
    assert "Use on_drift='tolerate'" in lines[3]
    assert len(hardware_report([h100, h100, a100, a100], nodes, "tolerate")) == 3  # the mixed-cluster policy
    older = {**h100, "nccl": "2.21.5"}  # versions count too: another NCCL may reduce in another order
    assert "WARNING" in hardware_report([h100, h100, older, older], nodes, "resync")[-1]
    alike = hardware_report([h100] * 4, nodes, "tolerate")
    assert "note: every node runs the same hardware and versions: on_drift='raise'" in alike[-1]
    # the default chooses by the hardware: no warning, no note
    assert hardware_report([h100, h100, a100, a100], nodes, "auto")[2:] == ["drift policy: on_drift='auto' (here: "
                                                                         "'tolerate')"]
    assert hardware_report([h100] * 4, nodes, "auto")[2:] == ["drift policy: on_drift='auto' (here: 'raise')"]


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
