"""The fabric as a tree of switches above nodes: what rules need to name a switch or an uplink.

Built from Slurm's topology.conf (slurm.py), refined per NIC rail by a YAML (rails.py), or
generated for simulations (`Fabric.rail_optimised`). Levels count from the bottom: a switch with
nodes is a leaf, the switches above leaves are spines, anything higher is core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LEVELS = ("leaf", "spine", "core")


class TopologyError(ValueError):
    """A topology file is wrong. Message: "<file>:<line>: what was wrong; what was expected"."""


@dataclass(frozen=True)
class Switch:
    name: str
    level: str  # "leaf" | "spine" | "core"


@dataclass(frozen=True)
class Link:
    """One NIC port and the leaf it plugs into (known from a rails YAML)."""

    node: str
    device: str
    port: int
    switch: str
    rail: int | None


@dataclass
class Fabric:
    switches: dict[str, Switch]
    parents: dict[str, tuple[str, ...]]  # switch -> its upper switches (uplinks)
    node_switches: dict[str, tuple[str, ...]]  # node -> leaves it plugs into
    links: list[Link] = field(default_factory=list)
    _children: dict[str, tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        children: dict[str, list[str]] = {}
        for kid, uppers in self.parents.items():
            for upper in uppers:
                children.setdefault(upper, []).append(kid)
        self._children = {s: tuple(kids) for s, kids in children.items()}

    @classmethod
    def from_tree(
        cls,
        leaf_nodes: Mapping[str, Sequence[str]],
        children: Mapping[str, Sequence[str]],
        links: Iterable[Link] = (),
    ) -> Fabric:
        """A fabric from leaf -> nodes and switch -> child switches; levels are computed.

        Raises TopologyError (without a file position: parsers add it) on a loop or a child
        switch that is never defined."""
        names = set(leaf_nodes) | set(children)
        parents: dict[str, list[str]] = {}
        for upper, kids in children.items():
            for kid in kids:
                if kid not in names:
                    raise TopologyError(f"switch {upper} lists {kid!r}, which is never defined")
                parents.setdefault(kid, []).append(upper)
        loop = find_loop({s: tuple(p) for s, p in parents.items()})
        if loop:
            raise TopologyError(f"switches form a loop: {' -> '.join(loop)}")
        heights = _heights(names, children)
        switches = {s: Switch(s, _level(heights[s], s in leaf_nodes)) for s in sorted(names)}
        node_switches: dict[str, list[str]] = {}
        for leaf, nodes in leaf_nodes.items():
            for node in nodes:
                node_switches.setdefault(node, []).append(leaf)
        return cls(
            switches=switches,
            parents={s: tuple(p) for s, p in parents.items()},
            node_switches={n: tuple(leaves) for n, leaves in node_switches.items()},
            links=list(links),
        )

    def leaves_of(self, node: str) -> tuple[str, ...]:
        return self.node_switches.get(node, ())

    def uplinks(self, switch: str) -> tuple[str, ...]:
        return self.parents.get(switch, ())

    def nodes_under(self, switch: str) -> set[str]:
        """Nodes below `switch`, transitively (a spine: every node under its leaves)."""
        below = self._switches_below(switch)
        return {n for n, leaves in self.node_switches.items() if below.intersection(leaves)}

    def crosses(self, nodes: Iterable[str]) -> set[tuple[str, str]]:
        """The (lower, upper) switch links that traffic among `nodes` uses.

        From each of their leaves, traffic climbs until a switch has all the nodes below it;
        a job inside one leaf (or one rail group, per rail) crosses nothing."""
        wanted = set(nodes)
        frontier = {leaf for node in wanted for leaf in self.leaves_of(node)}
        used: set[tuple[str, str]] = set()
        seen: set[str] = set()
        while frontier:
            switch = frontier.pop()
            if switch in seen or wanted <= self.nodes_under(switch):
                continue
            seen.add(switch)
            for upper in self.uplinks(switch):
                used.add((switch, upper))
                frontier.add(upper)
        return used

    def slice_for(self, node: str) -> Fabric:
        """What one agent serves: its leaves, every switch above them, its own links."""
        keep: set[str] = set()
        pending = list(self.leaves_of(node))
        while pending:
            switch = pending.pop()
            if switch not in keep:
                keep.add(switch)
                pending.extend(self.uplinks(switch))
        return Fabric(
            switches={s: self.switches[s] for s in sorted(keep)},
            parents={s: self.parents[s] for s in sorted(keep) if s in self.parents},
            node_switches={node: self.leaves_of(node)} if node in self.node_switches else {},
            links=[link for link in self.links if link.node == node],
        )

    def _switches_below(self, switch: str) -> set[str]:
        below: set[str] = set()
        pending = [switch]
        while pending:
            current = pending.pop()
            if current not in below:
                below.add(current)
                pending.extend(self._children.get(current, ()))
        return below

    @classmethod
    def rail_optimised(
        cls,
        nodes: list[str],
        nics_per_node: int,
        nodes_per_leaf_group: int,
        spines: int,
        devices: list[str] | None = None,
        rail_spines: bool = False,
    ) -> Fabric:
        """A rail-optimised two-tier fabric for simulations and tests.

        Nodes are cut into groups of `nodes_per_leaf_group`; group g has one leaf per rail,
        `leaf<g>-r<r>` (g from 1), into which NIC r (port 1) of every node of the group plugs;
        every leaf has an uplink to every spine `spine1..spine<spines>`; with `rail_spines`, each
        rail has spines of its own (`spine<s>-r<r>`, a spine plane per rail) that only its leaves
        uplink to."""
        devices = devices or [f"mlx5_{r}" for r in range(nics_per_node)]
        if len(devices) != nics_per_node:
            raise ValueError(f"{len(devices)} device names for {nics_per_node} NICs per node")
        leaf_nodes: dict[str, list[str]] = {}
        links: list[Link] = []
        for index, node in enumerate(nodes):
            group = index // nodes_per_leaf_group + 1
            for rail, device in enumerate(devices):
                leaf = f"leaf{group}-r{rail}"
                leaf_nodes.setdefault(leaf, []).append(node)
                links.append(Link(node, device, 1, leaf, rail))
        if rail_spines:
            children = {f"spine{s}-r{rail}": [leaf for leaf in leaf_nodes if leaf.endswith(f"-r{rail}")]
                        for rail in range(nics_per_node) for s in range(1, spines + 1)}
        else:
            children = {f"spine{s}": list(leaf_nodes) for s in range(1, spines + 1)}
        return cls.from_tree(leaf_nodes, children, links)


def find_loop(parents: Mapping[str, Sequence[str]]) -> list[str]:
    """A cycle in switch -> parents as a path that ends where it starts, or [] if none."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for start in parents:
        if state.get(start):
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            switch, index = stack.pop()
            if index == 0:
                state[switch] = 1
                path.append(switch)
            uppers = parents.get(switch, ())
            if index < len(uppers):
                stack.append((switch, index + 1))
                upper = uppers[index]
                if state.get(upper) == 1:
                    return [*path[path.index(upper):], upper]
                if not state.get(upper):
                    stack.append((upper, 0))
            else:
                state[switch] = 2
                path.pop()
    return []


def _level(height: int, has_nodes: bool) -> str:
    """A switch with nodes is a leaf; above, one level per tier (core caps the names)."""
    if has_nodes:
        return "leaf"
    return LEVELS[min(max(height, 1), len(LEVELS) - 1)]


def _heights(names: set[str], children: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Distance from the bottom: 0 for a switch without child switches (acyclic input)."""
    heights: dict[str, int] = {}

    def height(switch: str) -> int:
        if switch not in heights:
            kids = children.get(switch, ())
            heights[switch] = 1 + max(height(k) for k in kids) if kids else 0
        return heights[switch]

    for name in names:
        height(name)
    return heights
