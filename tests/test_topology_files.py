"""Slurm's topology.conf (tree and block) and the rails YAML read into a Fabric; malformed files
refused with file, line and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwatch.topology.model import Link, TopologyError
from flopwatch.topology.rails import read_rails
from flopwatch.topology.slurm import parse_topology_conf, read_topology_conf

FIXTURES = Path(__file__).parent / "fixtures" / "topology"
GPUS = [f"gpu{i:03d}" for i in range(1, 65)]


def test_tree_conf_reads_leaves_spines_and_core() -> None:
    fabric = read_topology_conf(FIXTURES / "topology.conf", known_nodes=GPUS)
    assert fabric.leaves_of("gpu001") == ("leaf1",)
    assert fabric.leaves_of("gpu041") == ("leaf3",)  # leaf3's list holds two ranges
    assert fabric.leaves_of("gpu064") == ("leaf4",)  # the continued line
    assert fabric.nodes_under("leaf4") == {f"gpu{i:03d}" for i in range(49, 65)}
    assert {n: s.level for n, s in fabric.switches.items()} == {
        "leaf1": "leaf", "leaf2": "leaf", "leaf3": "leaf", "leaf4": "leaf",
        "spine1": "spine", "spine2": "spine", "core": "core",
    }
    assert fabric.uplinks("leaf3") == ("spine2",)
    assert fabric.crosses(["gpu001", "gpu020"]) == {("leaf1", "spine1"), ("leaf2", "spine1")}
    assert len(fabric.nodes_under("core")) == 64


def test_block_conf_makes_each_block_a_leaf() -> None:
    fabric = read_topology_conf(FIXTURES / "block.conf")
    assert fabric.leaves_of("gb19") == ("nvl2",)
    assert fabric.switches["nvl1"].level == "leaf" and fabric.uplinks("nvl1") == ()


def test_rails_refine_the_conf_per_nic() -> None:
    conf = read_topology_conf(FIXTURES / "topology.conf")
    fabric = read_rails(FIXTURES / "rails.yml", conf)
    assert fabric.leaves_of("gpu005") == ("g1-r0", "g1-r1", "g1-r2", "g1-r3")
    assert fabric.leaves_of("gpu040") == ("leaf3",)  # not in the rails: the conf's leaf stays
    assert fabric.uplinks("g2-r3") == ("ib-spine1", "ib-spine2")
    assert Link("gpu017", "mlx5_2", 1, "g2-r2", 2) in fabric.links
    assert len(fabric.links) == 32 * 4
    assert fabric.crosses(["gpu001", "gpu016"]) == set()
    assert ("g1-r0", "ib-spine2") in fabric.crosses(["gpu001", "gpu017"])
    assert "leaf1" in fabric.switches  # emptied by the rails, still defined under spine1


def test_rails_alone_need_no_conf() -> None:
    fabric = read_rails(FIXTURES / "rails.yml")
    assert fabric.switches["ib-spine1"].level == "spine"
    assert fabric.slice_for("gpu017").links[0] == Link("gpu017", "mlx5_0", 1, "g2-r0", 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Switches=s[1,3]\n",
         "conf:2: switch s2 lists switch 's3', which no SwitchName= line defines"),
        ("SwitchName=a Switches=b\nSwitchName=b Switches=c\nSwitchName=c Switches=a\n",
         "switches form a loop"),
        ("SwitchName=s1 Nodes=n[1-2\n", "conf:1: 'n[1-2': '[' is never closed"),
        ("# header\nSwitchName=s1 Nodes=n1\nSwitchName=s1 Nodes=n2\n",
         "conf:3: s1 is already defined on line 2"),
        ("SwitchName=s1 Nodes=n1 Speed=9\n", "conf:1: unknown key 'speed'"),
        ("SwitchName=s1 Nodes=n1 Switches=s2\nSwitchName=s2 Nodes=n2\n",
         "conf:1: switch s1 has both Nodes= and Switches="),
        ("Nodes=n1\n", "conf:1: a line starts with nodes=; expected SwitchName="),
        ("SwitchName=s1 Nodes\n", "conf:1: 'Nodes' is not Key=Value"),
        ("SwitchName=s1 Nodes=n1\nBlockName=b1 Nodes=n2\n", "conf:2: block line in a tree topology"),
        ("BlockName=b1 Nodes=n[1-2]\nBlockSizes=2,x\n", "conf:2: BlockSizes=2,x; expected positive"),
    ],
)
def test_malformed_conf_is_refused_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_topology_conf(text, "conf")


def test_loop_is_reported_on_a_line_of_the_loop() -> None:
    text = "SwitchName=l1 Nodes=n1\nSwitchName=a Switches=l1,b\nSwitchName=b Switches=a\n"
    with pytest.raises(TopologyError, match=r"^conf:[23]: switches form a loop \((a|b) -> "):
        parse_topology_conf(text, "conf")


def test_unknown_node_is_refused() -> None:
    with pytest.raises(TopologyError, match=r"topology.conf:5: unknown node gpu001 and 15 more"):
        read_topology_conf(FIXTURES / "topology.conf", known_nodes=["gpu017"])


def test_comments_escapes_and_continuations_as_slurm_reads_them() -> None:
    text = "SwitchName=s\\#1 \\\n  Nodes=n[1-2] # a comment\n\n"
    fabric = parse_topology_conf(text, "conf")
    assert fabric.leaves_of("n2") == ("s#1",)


def test_unreadable_conf_says_so(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read the topology file"):
        read_topology_conf(tmp_path / "missing.conf")
    with pytest.raises(TopologyError, match=r"rails file .*missing\.yml: cannot read it \(No such file"):
        read_rails(tmp_path / "missing.yml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rails:\n  - nodes: n[1-2]\n    devices: [mlx5_0, mlx5_1]\n    leaves: [l0]\n",
         "rails.yml:4: 1 leaves for 2 devices"),
        ("rails:\n  - nodes: n[1-2]\n    devices: [mlx5_0]\n", "rails.yml:2: no leaves: here"),
        ("rails:\n  - nodes: n[1-2]\n    devices: [d]\n    leaves: [l]\n    prot: 1\n",
         "rails.yml:5: unknown key 'prot'"),
        ("rails:\n  - nodes: n[2-1]\n    devices: [d]\n    leaves: [l]\n", "rails.yml:2: .*backwards"),
        ("rails:\n  - nodes: n1\n    devices: [d]\n    leaves: [l]\nspines:\n  - name: s\n    leaves: x\n",
         "rails.yml:7: leaf x is in no rails: entry"),
        ("rails: [\n", "rails.yml:2: not valid YAML"),
        ("spines: []\n", "rails.yml:1: no rails: list"),
        ("rails:\n  - nodes: n1\n    devices: [d]\n    leaves: [l]\n    port: 0\n",
         "rails.yml:5: port: '0'"),
    ],
)
def test_malformed_rails_are_refused_with_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rails.yml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=message):
        read_rails(path)


def test_rails_node_unknown_to_the_conf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rails.yml"
    path.write_text("rails:\n  - nodes: gpu[064-065]\n    devices: [d]\n    leaves: [l]\n")
    conf = read_topology_conf(FIXTURES / "topology.conf")
    with pytest.raises(TopologyError, match=r"rails\.yml:2: unknown node gpu065"):
        read_rails(path, conf)
