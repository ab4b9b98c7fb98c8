"""The rails YAML: which leaf each NIC of each node plugs into, and which spines each leaf uplinks
to — what a rail-optimised fabric has and Slurm's topology.conf cannot say.

```yaml
rails:                          # one entry per group of nodes cabled alike
  - nodes: node[001-016]        # a Slurm hostlist
    devices: [mlx5_0, mlx5_1]   # the node's RDMA devices, in rail order (rail = position)
    leaves: leaf1-r[0-1]        # one leaf per device, same order (a list or a hostlist)
    port: 1                     # optional: the device port cabled (default 1)
spines:
  - name: spine[1-4]            # a hostlist: several spines wired alike
    leaves: leaf[1-2]-r[0-1]
  - name: core1                 # a third tier: a spine's own uplinks
    switches: spine[1-4]
```
Errors name the file, the line and what was expected, as topology.conf's do.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from flopwatch import yamlfile
from flopwatch.topology.hostlist import HostlistError, expand
from flopwatch.topology.model import Fabric, Link, TopologyError

RAIL_KEYS = {"nodes", "devices", "leaves", "port"}
SPINE_KEYS = {"name", "leaves", "switches"}


def read_rails(path: str | Path, fabric: Fabric | None = None,
               known_nodes: Collection[str] | None = None) -> Fabric:
    """`fabric` (from topology.conf) refined by the rails file at `path`.

    Nodes the rails name plug into the rails' leaves instead of the conf's; switches and uplinks
    of both are kept. With a conf, a node it does not know is refused (as with `known_nodes`)."""
    path = Path(path)
    try:
        root = yamlfile.compose(path, "rails file")
    except yamlfile.YamlFileError as error:
        raise TopologyError(str(error)) from None
    reader = _Reader(str(path))
    if fabric is not None:
        known_nodes = set(fabric.node_switches) if known_nodes is None else known_nodes
    defined = set(fabric.switches) if fabric is not None else set()
    leaf_nodes, children, links = reader.read(root, known_nodes, defined)
    if fabric is not None:
        leaf_nodes, children = _merge(fabric, leaf_nodes, children)
    try:
        return Fabric.from_tree(leaf_nodes, children, links)
    except TopologyError as error:
        raise TopologyError(f"{path}: {error}") from None


def _merge(fabric: Fabric, leaf_nodes: dict[str, list[str]],
           children: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    railed = {n for nodes in leaf_nodes.values() for n in nodes}
    merged_leaves = {leaf: list(nodes) for leaf, nodes in leaf_nodes.items()}
    for node, leaves in fabric.node_switches.items():
        if node not in railed:
            for leaf in leaves:
                merged_leaves.setdefault(leaf, []).append(node)
    merged_children = {upper: list(kids) for upper, kids in children.items()}
    for kid, uppers in fabric.parents.items():
        for upper in uppers:
            kids = merged_children.setdefault(upper, [])
            if kid not in kids:
                kids.append(kid)
    for name in fabric.switches:
        if name not in merged_children:
            merged_leaves.setdefault(name, [])  # a conf leaf whose nodes all moved stays defined
    return merged_leaves, merged_children


class _Reader:
    """Walks the composed YAML so every complaint carries the line it is about."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: yaml.Node, what: str) -> TopologyError:
        return TopologyError(f"{self.source}:{node.start_mark.line + 1}: {what}")

    def read(self, root: yaml.Node | None, known: Collection[str] | None, defined: set[str]
             ) -> tuple[dict[str, list[str]], dict[str, list[str]], list[Link]]:
        if not isinstance(root, yaml.MappingNode):
            raise TopologyError(f"{self.source}:1: expected a mapping with rails: and spines:")
        top = self.mapping(root, {"rails", "spines"})
        if "rails" not in top:
            raise self.fail(root, "no rails: list; expected rails: [{nodes, devices, leaves}, ...]")
        leaf_nodes: dict[str, list[str]] = {}
        links: list[Link] = []
        for entry in self.sequence(top["rails"], "rails"):
            self.rail_group(entry, known, leaf_nodes, links)
        children: dict[str, list[str]] = {}
        if "spines" in top:
            for entry in self.sequence(top["spines"], "spines"):
                self.spine(entry, set(leaf_nodes) | defined, children)
        return leaf_nodes, children, links

    def rail_group(self, entry: yaml.Node, known: Collection[str] | None,
                   leaf_nodes: dict[str, list[str]], links: list[Link]) -> None:
        fields = self.mapping(entry, RAIL_KEYS, required=("nodes", "devices", "leaves"))
        nodes = self.names(fields["nodes"], "nodes")
        devices = self.names(fields["devices"], "devices")
        leaves = self.names(fields["leaves"], "leaves")
        port = self.port(fields.get("port"))
        if len(devices) != len(leaves):
            raise self.fail(
                fields["leaves"],
                f"{len(leaves)} leaves for {len(devices)} devices; expected one leaf per device, in order",
            )
        if known is not None:
            unknown = [n for n in nodes if n not in known]
            if unknown:
                raise self.fail(fields["nodes"], f"unknown node {unknown[0]}; expected nodes of this cluster")
        for rail, (device, leaf) in enumerate(zip(devices, leaves, strict=True)):
            leaf_nodes.setdefault(leaf, []).extend(nodes)
            links.extend(Link(node, device, port, leaf, rail) for node in nodes)

    def spine(self, entry: yaml.Node, leaves: set[str], children: dict[str, list[str]]) -> None:
        fields = self.mapping(entry, SPINE_KEYS, required=("name",))
        below: list[str] = []
        if "leaves" in fields:
            below = self.names(fields["leaves"], "leaves")
            missing = [leaf for leaf in below if leaf not in leaves]
            if missing:
                raise self.fail(fields["leaves"], f"leaf {missing[0]} is in no rails: entry; "
                                "expected leaves the rails list")
        if "switches" in fields:
            below += self.names(fields["switches"], "switches")
        if not below:
            raise self.fail(entry, "a spine without leaves: or switches:; expected what it uplinks")
        for name in self.names(fields["name"], "name"):
            children.setdefault(name, []).extend(below)

    def mapping(self, node: yaml.Node, allowed: set[str], required: tuple[str, ...] = ()
                ) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"expected a mapping with {', '.join(sorted(allowed))}")
        fields: dict[str, yaml.Node] = {}
        for key, value in node.value:
            name = str(key.value)
            if name not in allowed:
                raise self.fail(key, f"unknown key {name!r}; expected {', '.join(sorted(allowed))}")
            fields[name] = value
        for name in required:
            if name not in fields:
                raise self.fail(node, f"no {name}: here; expected {', '.join(required)}")
        return fields

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"{what}: must be a list")
        return list(node.value)

    def names(self, node: yaml.Node, what: str) -> list[str]:
        """A list of names or one hostlist expression."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        names: list[str] = []
        for item in items:
            if not isinstance(item, yaml.ScalarNode) or not str(item.value).strip():
                raise self.fail(item, f"{what}: expected names or a hostlist such as node[001-016]")
            try:
                names.extend(expand(str(item.value)))
            except HostlistError as error:
                raise self.fail(item, str(error)) from None
        if not names:
            raise self.fail(node, f"{what}: is empty")
        return names

    def port(self, node: Any) -> int:
        if node is None:
            return 1
        text = str(node.value)
        if not isinstance(node, yaml.ScalarNode) or not text.isdigit() or int(text) < 1:
            raise self.fail(node, f"port: {text!r}; expected a port number from 1")
        return int(text)
