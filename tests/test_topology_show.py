"""`scontrol show topology` output read into the same Fabric as topology.conf, from output captured
from a real slurmctld (tests/fixtures/topology/README.md says how); broken output refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwatch.topology.model import TopologyError
from flopwatch.topology.slurm import parse_show_topology, read_topology_conf

FIXTURES = Path(__file__).parent / "fixtures" / "topology"
SHOW = FIXTURES / "scontrol-show-topology.txt"
TWO_SPINES = FIXTURES / "scontrol-show-topology-two-spines.txt"


def test_show_topology_gives_the_fabric_of_the_conf_it_was_loaded_from() -> None:
    assert parse_show_topology(SHOW.read_text()) == read_topology_conf(FIXTURES / "topology.conf")


def test_upper_switches_node_lists_do_not_make_them_leaves() -> None:
    fabric = parse_show_topology(SHOW.read_text())
    assert fabric.leaves_of("gpu040") == ("leaf3",)  # not also spine2 and core, which list it too
    assert {n: s.level for n, s in fabric.switches.items()} == {
        "leaf1": "leaf", "leaf2": "leaf", "leaf3": "leaf", "leaf4": "leaf",
        "spine1": "spine", "spine2": "spine", "core": "core",
    }
    assert fabric.crosses(["gpu001", "gpu020"]) == {("leaf1", "spine1"), ("leaf2", "spine1")}


def test_every_uplink_of_a_leaf_under_two_spines_is_kept() -> None:
    fabric = parse_show_topology(TWO_SPINES.read_text())
    assert fabric.uplinks("leaf2") == ("spine1", "spine2")
    assert fabric.uplinks("spine2") == ("core",)
    assert fabric.nodes_under("leaf3") == {"gpu-007", "gpu-008"}


@pytest.mark.parametrize(("text", "message"), [
    ("SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=n[1-2]\nBlockName=b1 Nodes=n3\n", ":2: 'BlockName=b1' is not"),
    ("SwitchName=leaf1 Level=0 Nodes=n[1-2]\nSwitchName=leaf1 Level=0 Nodes=n3\n", ":2: expected one line per"),
    ("Level=0 Nodes=n[1-2]\n", ":1: expected one line per switch"),
    ("SwitchName=s Level=1 Nodes=n[1-3] Switches=leaf1\nSwitchName=leaf1 Level=0 Nodes=n[1-2]\n",
     ":1: switch s lists 3 nodes but 2 are below"),
    ("SwitchName=s Level=1 Nodes=n1 Switches=nosuch\n", "lists 'nosuch', which is never defined"),
    ("SwitchName=leaf1 Level=0 Nodes=n[1-\n", ":1:"),
])
def test_output_that_is_not_slurms_is_refused_with_its_line(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=r"^scontrol show topology") as caught:
        parse_show_topology(text)
    assert message in str(caught.value)
