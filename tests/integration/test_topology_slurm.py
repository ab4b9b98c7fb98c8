"""The fabric read from a real slurmctld (Slurm 22.05 on loopback, flopwatch.stack.slurm) through
`scontrol show topology` is the fabric its topology.conf gives, the captured fixture is still
what Slurm prints, and `flopwatch remediate plan` with no topology file escalates to the switch
that slurmctld's topology names."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flopwatch.remediate.slurm import Slurm
from flopwatch.stack import Alertmanager
from flopwatch.stack.slurm import SlurmCluster
from flopwatch.topology.slurm import parse_show_topology, read_topology_conf

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures" / "topology"
NODES = [f"gpu-{i:03d}" for i in range(1, 9)]
#: Three leaves under two spines under a core (the cluster of scontrol-show-topology-two-spines.txt).
TOPOLOGY = ("SwitchName=leaf1 Nodes=gpu-[001-003]\nSwitchName=leaf2 Nodes=gpu-[004-006]\n"
            "SwitchName=leaf3 Nodes=gpu-[007-008]\nSwitchName=spine1 Switches=leaf[1-3] LinkSpeed=400\n"
            "SwitchName=spine2 Switches=leaf[1-3]\nSwitchName=core Switches=spine[1-2]\n")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    with SlurmCluster(NODES, topology=TOPOLOGY) as running:
        yield running


def test_scontrol_show_topology_gives_the_fabric_of_topology_conf(cluster: SlurmCluster) -> None:
    live = cluster.client("scontrol", "show", "topology")
    assert live == (FIXTURES / "scontrol-show-topology-two-spines.txt").read_text(), "the captured fixture is stale"
    fabric = Slurm(10.0, env=cluster.env).topology()
    assert fabric == read_topology_conf(cluster.topology_path) == parse_show_topology(live)
    assert fabric is not None and fabric.uplinks("leaf1") == ("spine1", "spine2")
    assert fabric.nodes_under("leaf2") == {"gpu-004", "gpu-005", "gpu-006"}


def test_a_cluster_without_a_topology_plugin_gives_no_fabric() -> None:
    with SlurmCluster(["node01", "node02"]) as plain:
        assert Slurm(10.0, env=plain.env).topology() is None


def test_plan_without_a_topology_file_blames_the_leaf_slurmctld_names(cluster: SlurmCluster, tmp_path: Path) -> None:
    """All three of leaf1's nodes losing a GPU: with slurmctld's fabric that is leaf1, paged and
    nothing drained (without a fabric, the three would be drained: the breaker is wide open)."""
    alertmanager = Alertmanager({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}).start()
    try:
        alertmanager.post_alerts([{"labels": {"alertname": "FlopWatchGpuLost", "node": node, "gpu": "0",
                                              "severity": "page"}} for node in NODES[:3]])
        config = tmp_path / "flopwatch.yml"
        config.write_text(yaml.safe_dump({"remediation": {
            "alertmanager": alertmanager.url, "state_dir": str(tmp_path / "state"),
            "breaker": {"max_nodes": 8, "partition_share": 1, "switch_share": 1}}}))
        done = subprocess.run([sys.executable, "-m", "flopwatch", "remediate", "plan", "--config", str(config)],
                              env=cluster.env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        alertmanager.stop()
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [(p["alertname"], p["key"]) for p in plan["pages"]] == [("FlopWatchRemediationSwitchSuspected", "leaf1")]
    assert plan["drains"] == []
    assert "topology from slurmctld: 6 switches, 8 nodes" in done.stderr
