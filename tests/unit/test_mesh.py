"""What a node is: one rule (``resolve_shard_size``) for the mesh and the Trainer's topology."""

import pytest
import torch.distributed as dist

from hf_flexdemo.optim.mesh import SHARD_SIZE_ENV, build_hybrid_mesh, resolve_shard_size
from hf_flexdemo.trainer.topology import Topology


@pytest.fixture
def launcher_env(monkeypatch):
    for name in SHARD_SIZE_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "explicit", "expected"),
    [
        ({}, None, 8),  # no launcher: one node
        ({"LOCAL_WORLD_SIZE": "4"}, None, 4),  # torchrun --nproc_per_node
        ({"LOCAL_WORLD_SIZE": "4", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}, None, 2),  # accelerate's YAML wins
        ({"LOCAL_WORLD_SIZE": "4", "PARALLELISM_CONFIG_DP_SHARD_SIZE": ""}, None, 4),  # empty means unset
        ({"LOCAL_WORLD_SIZE": "4", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}, 8, 8),  # an explicit value wins
    ],
)
def test_shard_size_precedence(launcher_env, env, explicit, expected):
    for name, value in env.items():
        launcher_env.setenv(name, value)
    assert resolve_shard_size(8, explicit) == expected
    assert Topology.resolve(8, explicit).shard_size == expected


def test_shard_size_that_does_not_divide_the_world_is_refused(launcher_env):
    launcher_env.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"shard_size=3 must divide the world size 8; accepted: \[1, 2, 4, 8\]"):
        resolve_shard_size(8)


def test_mesh_reads_the_same_variables_as_the_topology(launcher_env):
    """accelerate sets both variables; the mesh once read only LOCAL_WORLD_SIZE (2, not a divisor of 1)."""
    launcher_env.setenv("LOCAL_WORLD_SIZE", "2")
    launcher_env.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = build_hybrid_mesh(device_type="cpu")
        assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard") and mesh.shape == (1, 1)
    finally:
        dist.destroy_process_group()
