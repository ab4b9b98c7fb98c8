"""Slurm's topology.conf (topology/tree and topology/block) read into a Fabric.

Syntax as topology.conf(5) and Slurm's parse_config.c have it: one switch (or block) per line of
space-separated Key=Value pairs, keys case-insensitive; text after an unescaped `#` is a comment;
a line ending in `\\` continues on the next; `\\#` is a literal `#`. Tree lines are
`SwitchName=<name> [Nodes=<hostlist>] [Switches=<hostlist>] [LinkSpeed=<n>]`; block lines are
`BlockName=<name> Nodes=<hostlist>` plus one optional `BlockSizes=<n>[,<n>...]`. A block becomes
a leaf with no uplinks: nodes in it share the fast domain the way nodes under a leaf do.

The running slurmctld says the same through `scontrol show topology` (`parse_show_topology`), so
a cluster whose topology.conf lives only on the controller needs no copy of it. Slurm 22.05
prints one line per switch in topology.conf's order, e.g. (captured from a real slurmctld,
tests/fixtures/topology/scontrol-show-topology.txt):

    SwitchName=leaf1 Level=0 LinkSpeed=400 Nodes=gpu[001-016]
    SwitchName=spine1 Level=1 LinkSpeed=1 Nodes=gpu[001-032] Switches=leaf[1-2]

A switch above others also lists every node below it (`Nodes=`), so only a switch without
`Switches=` gives nodes their leaf; the others' lists are checked against the tree built.
Without a topology plugin it prints nothing and says "No topology information available" on
stderr (exit 0).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flopwatch.topology.hostlist import HostlistError, expand
from flopwatch.topology.model import Fabric, TopologyError, find_loop

TREE_KEYS = {"switchname", "nodes", "switches", "linkspeed"}
BLOCK_KEYS = {"blockname", "nodes"}
MAX_NAME = 64  # topology.conf(5): a SwitchName cannot be longer than 64 characters


@dataclass
class _Parsed:
    leaf_nodes: dict[str, list[str]] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    defined_at: dict[str, int] = field(default_factory=dict)
    kind: str = ""  # "tree" or "block", from the first line that says


def read_topology_conf(path: str | Path, known_nodes: Collection[str] | None = None) -> Fabric:
    """The fabric a topology.conf describes; TopologyError "<file>:<line>: ..." when it is wrong.

    `known_nodes`, when given, is every node that exists: a line naming another is refused."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TopologyError(f"{path}: cannot read the topology file ({error.strerror})") from None
    except UnicodeDecodeError:
        raise TopologyError(f"{path}: not a text file; expected Slurm's topology.conf") from None
    return parse_topology_conf(text, str(path), known_nodes)


def parse_topology_conf(text: str, source: str, known_nodes: Collection[str] | None = None) -> Fabric:
    parsed = _Parsed()
    for number, line in _logical_lines(text):
        _read_line(parsed, source, number, line, known_nodes)
    for upper, kids in parsed.children.items():
        for kid in kids:
            if kid not in parsed.defined_at:
                raise TopologyError(
                    f"{source}:{parsed.defined_at[upper]}: switch {upper} lists switch {kid!r}, "
                    f"which no SwitchName= line defines; expected a line SwitchName={kid} ..."
                )
    _check_loop(parsed, source)
    return Fabric.from_tree(parsed.leaf_nodes, parsed.children)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) with comments cut, continuations joined, escapes removed."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = _strip_escapes("".join(pending)).strip()
        pending = []
        if joined:
            yield start, joined
    if pending:
        joined = _strip_escapes("".join(pending)).strip()
        if joined:
            yield start, joined


def _strip_comment(line: str) -> str:
    backslashes = 0
    for index, char in enumerate(line):
        if char == "#" and backslashes % 2 == 0:
            return line[:index]
        backslashes = backslashes + 1 if char == "\\" else 0
    return line


def _strip_escapes(line: str) -> str:
    out, index = [], 0
    while index < len(line):
        if line[index] == "\\":
            index += 1
        if index < len(line):
            out.append(line[index])
        index += 1
    return "".join(out)


def _pairs(source: str, number: int, line: str) -> list[tuple[str, str]]:
    pairs = []
    for word in line.split():
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise TopologyError(
                f"{source}:{number}: {word!r} is not Key=Value; expected e.g. "
                "SwitchName=leaf1 Nodes=node[001-016]"
            )
        pairs.append((key.lower(), value.strip('"')))
    return pairs


def _read_line(parsed: _Parsed, source: str, number: int, line: str,
               known_nodes: Collection[str] | None) -> None:
    pairs = _pairs(source, number, line)
    first = pairs[0][0]
    if first == "blocksizes" and len(pairs) == 1:
        _check_block_sizes(source, number, pairs[0][1])
        return
    kind = {"switchname": "tree", "blockname": "block"}.get(first)
    if kind is None:
        raise TopologyError(
            f"{source}:{number}: a line starts with {pairs[0][0]}=; expected SwitchName= "
            "(topology/tree), BlockName= or BlockSizes= (topology/block)"
        )
    if parsed.kind and parsed.kind != kind:
        raise TopologyError(f"{source}:{number}: {kind} line in a {parsed.kind} topology; use one plugin's syntax")
    parsed.kind = kind
    allowed = TREE_KEYS if kind == "tree" else BLOCK_KEYS
    values: dict[str, str] = {}
    for key, value in pairs:
        if key not in allowed:
            raise TopologyError(
                f"{source}:{number}: unknown key {key!r}; expected {', '.join(sorted(allowed))}"
            )
        if key in values:
            raise TopologyError(f"{source}:{number}: {key} given twice on one line")
        values[key] = value
    name = values[first]
    _check_name(parsed, source, number, name)
    parsed.defined_at[name] = number
    if "nodes" in values:
        nodes = _hostlist(source, number, values["nodes"])
        _check_known(source, number, nodes, known_nodes)
        parsed.leaf_nodes[name] = nodes
    if "switches" in values:
        parsed.children[name] = _hostlist(source, number, values["switches"])
        if name in parsed.children[name]:
            raise TopologyError(f"{source}:{number}: switch {name} lists itself; expected child switches")
    if "linkspeed" in values and not values["linkspeed"].isdigit():
        raise TopologyError(f"{source}:{number}: LinkSpeed={values['linkspeed']}; expected an integer")
    if "nodes" in values and "switches" in values:
        raise TopologyError(
            f"{source}:{number}: switch {name} has both Nodes= and Switches=; Slurm refuses this, "
            "expected a leaf (Nodes=) or a switch above others (Switches=)"
        )
    if kind == "block" and "nodes" not in values:
        raise TopologyError(f"{source}:{number}: block {name} has no Nodes=; expected Nodes=<hostlist>")


def _check_name(parsed: _Parsed, source: str, number: int, name: str) -> None:
    if len(name) > MAX_NAME:
        raise TopologyError(f"{source}:{number}: name {name[:20]}... is over {MAX_NAME} characters")
    if name in parsed.defined_at:
        raise TopologyError(
            f"{source}:{number}: {name} is already defined on line {parsed.defined_at[name]}; "
            "each switch or block needs a unique name"
        )


def _hostlist(source: str, number: int, expr: str) -> list[str]:
    try:
        return expand(expr)
    except HostlistError as error:
        raise TopologyError(f"{source}:{number}: {error}") from None


def _check_known(source: str, number: int, nodes: list[str], known: Collection[str] | None) -> None:
    if known is None:
        return
    unknown = [n for n in nodes if n not in known]
    if unknown:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise TopologyError(
            f"{source}:{number}: unknown node {unknown[0]}{more}; expected nodes of this cluster "
            "(check the hostlist's range and zero padding)"
        )


def _check_block_sizes(source: str, number: int, value: str) -> None:
    sizes = value.split(",")
    if not all(s.isdigit() and int(s) > 0 for s in sizes):
        raise TopologyError(f"{source}:{number}: BlockSizes={value}; expected positive integers, e.g. 30,120")


def _check_loop(parsed: _Parsed, source: str) -> None:
    """A loop is reported on the line of the switch where it starts.

    Slurm's tree plugin keeps one parent per switch internally (the last line listing it);
    FlopWatch keeps every switch that lists another, since each is a real uplink to watch."""
    parents: dict[str, list[str]] = {}
    for upper, kids in parsed.children.items():
        for kid in kids:
            parents.setdefault(kid, []).append(upper)
    loop = find_loop({s: tuple(p) for s, p in parents.items()})
    if loop:
        raise TopologyError(
            f"{source}:{parsed.defined_at[loop[0]]}: switches form a loop "
            f"({' -> '.join(loop)}); expected a tree, each switch below the one that lists it"
        )


SHOW_KEYS = {"switchname", "level", "linkspeed", "nodes", "switches"}


def parse_show_topology(text: str, source: str = "scontrol show topology") -> Fabric:
    """The fabric `scontrol show topology` prints; TopologyError "<source>:<line>: ..." when the
    output is not what Slurm prints (another version's format, a truncated read)."""
    leaf_nodes: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    listed: dict[str, tuple[int, list[str]]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        values: dict[str, str] = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if not sep or key.lower() not in SHOW_KEYS:
                raise TopologyError(
                    f"{source}:{number}: {word!r} is not one of {', '.join(sorted(SHOW_KEYS))} as Key=Value; "
                    "expected lines like SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=node[01-08]"
                )
            values[key.lower()] = value
        name = values.get("switchname", "")
        if not name or name in leaf_nodes or name in children:
            raise TopologyError(f"{source}:{number}: expected one line per switch starting SwitchName=<name>, "
                                f"got {line.strip()[:80]!r}")
        nodes = _hostlist(source, number, values["nodes"]) if values.get("nodes") else []
        if values.get("switches"):
            children[name] = _hostlist(source, number, values["switches"])
            listed[name] = (number, nodes)
        else:
            leaf_nodes[name] = nodes
    try:
        fabric = Fabric.from_tree(leaf_nodes, children)
    except TopologyError as error:
        raise TopologyError(f"{source}: {error}") from None
    for switch, (number, nodes) in listed.items():
        if set(nodes) != fabric.nodes_under(switch):
            raise TopologyError(f"{source}:{number}: switch {switch} lists {len(nodes)} nodes but "
                                f"{len(fabric.nodes_under(switch))} are below its switches; expected the same")
    return fabric
