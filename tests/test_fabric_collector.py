"""The fabric collector serves this node's slice of the topology as info series; the agent's
topology settings read the files and refuse a wrong one in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from flopwatch import config as cfg
from flopwatch.errors import UsageError
from flopwatch.exporters.fabric import FabricCollector, fabric_collectors, read_fabric
from flopwatch.topology.model import Fabric

FIXTURES = Path(__file__).parent / "fixtures" / "topology"


def _samples(collector: FabricCollector) -> dict[str, list[dict[str, str]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, list[dict[str, str]]] = {}
    for family in registry.collect():
        for sample in family.samples:
            assert sample.value == 1
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_rails_node_serves_one_link_per_nic_and_every_uplink_above() -> None:
    fabric = read_fabric(str(FIXTURES / "topology.conf"), str(FIXTURES / "rails.yml"))
    collector = FabricCollector("gpu017", fabric)
    collector.update()
    series = _samples(collector)
    links = series["flopwatch_fabric_link_info"]
    assert {(s["device"], s["switch"], s["rail"]) for s in links} == {
        (f"mlx5_{r}", f"g2-r{r}", str(r)) for r in range(4)
    }
    assert all(s["node"] == "gpu017" and s["level"] == "leaf" and s["port"] == "1" for s in links)
    uplinks = {(s["switch"], s["level"], s["parent"]) for s in series["flopwatch_fabric_switch_info"]}
    assert ("g2-r0", "leaf", "ib-spine2") in uplinks
    assert ("ib-spine1", "spine", "") in uplinks  # top of this node's tree: no parent
    assert not any(s[0].startswith("g1-") for s in uplinks)  # another group's leaves are not ours


def test_conf_only_node_maps_its_scanned_ports_to_its_one_leaf() -> None:
    fabric = read_fabric(str(FIXTURES / "topology.conf"), None)
    ports = [("mlx5_1", "1"), ("mlx5_0", "1")]
    collector = FabricCollector("gpu050", fabric, lambda: ports)
    collector.update()
    series = _samples(collector)
    assert [(s["device"], s["switch"], s["rail"]) for s in series["flopwatch_fabric_link_info"]] == [
        ("mlx5_0", "leaf4", ""), ("mlx5_1", "leaf4", "")]
    assert {(s["switch"], s["parent"]) for s in series["flopwatch_fabric_switch_info"]} == {
        ("leaf4", "spine2"), ("spine2", "core"), ("core", "")}


def test_node_outside_the_topology_serves_nothing() -> None:
    collector = FabricCollector("stranger", Fabric.rail_optimised(["a", "b"], 1, 2, 1), lambda: [("d", "1")])
    collector.update()
    assert _samples(collector) == {}


def test_agent_config_reads_topology_and_refuses_a_broken_file(tmp_path: Path) -> None:
    config_file = tmp_path / "agent.yml"
    config_file.write_text(f"node: gpu003\ntopology:\n  slurm: {FIXTURES / 'topology.conf'}\n"
                           f"  rails: {FIXTURES / 'rails.yml'}\n")
    config = cfg.load(config_file, environ={})
    [collector] = fabric_collectors(config, [])
    assert collector.fabric.leaves_of("gpu003") == ("g1-r0", "g1-r1", "g1-r2", "g1-r3")
    assert fabric_collectors(cfg.load(None, environ={}), []) == []

    broken = tmp_path / "topology.conf"
    broken.write_text("SwitchName=s1 Nodes=n[1-x]\n")
    env = {"FLOPWATCH_TOPOLOGY_SLURM": str(broken)}
    with pytest.raises(UsageError, match=r"^topology error: .*topology.conf:1: .*not a number"):
        fabric_collectors(cfg.load(None, environ=env), [])


def test_built_agent_maps_the_nic_collectors_ports_to_the_conf_leaf() -> None:
    from flopwatch.exporters.wiring import build_agent

    sysfs = Path(__file__).parent / "fixtures" / "sysfs"
    config = cfg.load(None, {"node": "gpu050", "backend": "sim", "nic.sysfs_root": str(sysfs),
                             "topology.slurm": str(FIXTURES / "topology.conf")}, environ={})
    agent = build_agent(config)
    names = [c.name for c in agent.collectors]
    assert names.index("nic") < names.index("fabric")  # the fabric collector reads the NIC's scan
    for collector in agent.collectors:
        if collector.name in ("nic", "fabric"):
            collector.update()
    fabric = next(c for c in agent.collectors if c.name == "fabric")
    links = _samples(fabric)["flopwatch_fabric_link_info"]
    assert {(s["device"], s["port"]) for s in links} >= {("mlx5_0", "1"), ("mlx5_0", "2")}
    assert {s["switch"] for s in links} == {"leaf4"}
    agent.close()
