"""Hostlist expansion (Slurm's semantics) and the fabric model's questions: leaves, nodes under a
switch, uplinks a job crosses, and the slice one agent serves."""

from __future__ import annotations

import pytest

from flopwatch.topology.hostlist import HostlistError, expand
from flopwatch.topology.model import Fabric, Link, TopologyError, find_loop


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("tux[0-3,12]", ["tux0", "tux1", "tux2", "tux3", "tux12"]),
        ("node[001-003]", ["node001", "node002", "node003"]),
        ("n[8-10]", ["n8", "n9", "n10"]),  # width of the low end as written
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("a1,b[1-2] c3\td4", ["a1", "b1", "b2", "c3", "d4"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        # Slurm's recursion takes the prefix's last group first: b varies slowest here.
        ("a[1-2]b[3-4]c[5]", ["a1b3c5", "a2b3c5", "a1b4c5", "a2b4c5"]),
        ("n2,n1,n2", ["n2", "n1", "n2"]),  # order kept, no dedupe, as hostlist_create
        ("", []),
    ],
)
def test_expand_follows_slurm(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("node[01-16", "never closed"),
        ("node01-16]", "without an opening"),
        ("node[16-01]", "backwards"),
        ("node[a-b]", "not a number"),
        ("node[]", "empty brackets"),
        ("n[01-02]-ib", "after the last ']'"),
        ("n[0-99999999]", "more than"),
    ],
)
def test_expand_refuses_malformed(expr: str, says: str) -> None:
    with pytest.raises(HostlistError, match=says):
        expand(expr)


def _fleet() -> Fabric:
    nodes = [f"node{i:03d}" for i in range(1, 33)]
    return Fabric.rail_optimised(nodes, nics_per_node=2, nodes_per_leaf_group=16, spines=2)


def test_rail_optimised_wires_each_rail_to_its_leaf_and_every_spine() -> None:
    fabric = _fleet()
    assert fabric.leaves_of("node017") == ("leaf2-r0", "leaf2-r1")
    assert fabric.uplinks("leaf2-r1") == ("spine1", "spine2")
    assert {s.level for s in fabric.switches.values()} == {"leaf", "spine"}
    assert Link("node017", "mlx5_1", 1, "leaf2-r1", 1) in fabric.links
    assert len(fabric.nodes_under("spine1")) == 32
    assert fabric.nodes_under("leaf1-r0") == {f"node{i:03d}" for i in range(1, 17)}


def test_crosses_only_when_a_job_leaves_its_leaf() -> None:
    fabric = _fleet()
    assert fabric.crosses(["node001", "node016"]) == set()
    spanning = fabric.crosses(["node001", "node017"])
    assert ("leaf1-r0", "spine1") in spanning and ("leaf2-r1", "spine2") in spanning
    assert len(spanning) == 2 * 2 * 2  # two groups x two rails x two spines


def test_crosses_climbs_a_three_tier_tree_only_as_far_as_needed() -> None:
    fabric = Fabric.from_tree(
        {"l1": ["a"], "l2": ["b"], "l3": ["c"]},
        {"s1": ["l1", "l2"], "s2": ["l3"], "core": ["s1", "s2"]},
    )
    assert fabric.switches["core"].level == "core"
    assert fabric.crosses(["a", "b"]) == {("l1", "s1"), ("l2", "s1")}
    assert fabric.crosses(["a", "c"]) == {("l1", "s1"), ("s1", "core"), ("l3", "s2"), ("s2", "core")}


def test_slice_for_keeps_own_leaves_switches_above_and_links() -> None:
    piece = _fleet().slice_for("node003")
    assert set(piece.switches) == {"leaf1-r0", "leaf1-r1", "spine1", "spine2"}
    assert piece.node_switches == {"node003": ("leaf1-r0", "leaf1-r1")}
    assert {link.node for link in piece.links} == {"node003"}
    assert piece.uplinks("leaf1-r0") == ("spine1", "spine2")


def test_loops_and_undefined_switches_are_refused() -> None:
    with pytest.raises(TopologyError, match="loop: s1 -> s2 -> s1"):
        Fabric.from_tree({"l1": ["a"]}, {"s1": ["l1", "s2"], "s2": ["s1"]})
    with pytest.raises(TopologyError, match="'ghost', which is never defined"):
        Fabric.from_tree({"l1": ["a"]}, {"s1": ["l1", "ghost"]})
    assert find_loop({"a": ("b",), "b": ("c",)}) == []
