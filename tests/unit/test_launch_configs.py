"""The shipped Accelerate configurations load as Accelerate reads them, and their topology adds up."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "accelerate_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_config_loads_and_its_nodes_times_processes_is_the_world(path):
    config = ClusterConfig.from_yaml_file(path)
    parallel = config.parallelism_config
    nodes, per_node = parallel["parallelism_config_dp_replicate_size"], parallel["parallelism_config_dp_shard_size"]
    assert nodes * per_node == config.num_processes
    assert config.num_machines in (1, nodes)  # one machine simulates the nodes (cpu_2x2), or one per node
    assert config.fsdp_config["fsdp_version"] == 2


def test_the_restarting_config_meets_at_a_c10d_rendezvous():
    config = ClusterConfig.from_yaml_file(next(p for p in CONFIGS if p.name == "2nodes_8gpu_restarts.yaml"))
    assert (config.rdzv_backend, config.same_network) == ("c10d", False)
