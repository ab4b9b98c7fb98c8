"""The package's imports run one way (DESIGN.md, CONTRIBUTING.md): cli -> commands -> detect ->
sim -> exporters/report/dashboards -> catalog, config, stack, train and the other base modules,
with no cycle, and flopwatch.train imports nothing from the agent or prometheus_client.

The imports are read from the source with ast (every module, function-local imports included:
a lazy import still ties two modules together), not by importing anything."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flopwatch"

#: Top to bottom: a module may import its own package and any package of a lower layer; packages
#: of one layer import each other only in the base layer (the last). A new package needs a line here.
#: A dotted entry places one module apart from its package (mixin.names: the alert and record
#: names, plain data the dashboards read too, below the mixin that renders the dashboards;
#: stack.sharded, the two-tier layout on loopback, above the mixin whose topology it starts).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("commands",),
    ("detect", "stack.sharded"),
    ("sim", "mixin", "remediate"),
    ("exporters", "report", "dashboards"),
    ("catalog", "config", "stack", "train", "promql", "topology", "traces", "xid", "hardware", "resources",
     "errors", "logs", "durations", "yamlfile", "mixin.names", "mixin.promql", "__init__"),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:` (never run, so never a cycle)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(name: str) -> Iterator[tuple[str, int]]:
    """(imported flopwatch module, line) for each import in module `name`: `from a import b` is
    module a.b where that is a module, else a."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names if alias.name.startswith("flopwatch"))
        else:
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            if base == "flopwatch" or base.startswith("flopwatch."):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    yield (full if full in MODULES else base), node.lineno


#: Read once, at collection: CPython 3.11's parser can raise SystemError ("AST constructor
#: recursion depth mismatch") when called after another test left deep recursion behind.
IMPORTS = {name: list(imports_of(name)) for name in MODULES}


def _edges() -> dict[str, list[str]]:
    graph = {name: sorted({target for target, _ in IMPORTS[name] if target in MODULES}) for name in MODULES}
    # cli imports each command module by name from its table (importlib): those are imports too
    from flopwatch.cli import SUBCOMMANDS

    graph["flopwatch.cli"] = sorted({*graph["flopwatch.cli"], *(f"flopwatch.commands.{c.name}" for c in SUBCOMMANDS)})
    return graph


GRAPH = _edges()


PLACED_APART = {entry for layer in LAYERS for entry in layer if "." in entry}


def top_package(name: str) -> str:
    """The LAYERS entry of a module: its subpackage of flopwatch, or its own dotted entry."""
    if "." not in name:
        return "__init__"
    within = name.split(".", 1)[1]
    return next((entry for entry in PLACED_APART if within == entry or within.startswith(entry + ".")),
                within.split(".")[0])


def layer_of(package: str) -> int:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise AssertionError(f"flopwatch/{package} is in no layer of tests/test_imports.py LAYERS: add it where it "
                         "belongs (and to CONTRIBUTING.md's architecture)")


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_the_imports_it_must():
    """The walk itself: known edges (a top-level, a function-local and a relative-free from-import)."""
    assert "flopwatch.errors" in GRAPH["flopwatch.cli"]
    assert "flopwatch.commands.agent" in GRAPH["flopwatch.cli"]           # from the subcommand table
    assert "flopwatch.catalog.gpu" in GRAPH["flopwatch.catalog"]           # imported inside a function
    assert "flopwatch.exporters.wiring" in GRAPH["flopwatch.commands.agent"]
    assert "flopwatch.train.wire" in GRAPH["flopwatch.exporters.train_intake"]


def test_cycles_are_found():
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []


def test_no_import_cycle_in_the_package():
    found = cycles(GRAPH)
    assert not found, "import cycles (break each by moving the shared piece down a layer):\n" + \
        "\n".join(" <-> ".join(component) for component in found)


def test_imports_run_down_the_layers():
    wrong = []
    for name, path in MODULES.items():
        source = top_package(name)
        for target, line in IMPORTS[name]:
            if target not in MODULES or top_package(target) == source:
                continue
            above, below = layer_of(source), layer_of(top_package(target))
            if below < above or (below == above and above != len(LAYERS) - 1):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not wrong, "imports against the documented direction:\n" + "\n".join(wrong)


def _absolute_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    return imported + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                       and not node.level]


ABSOLUTE_IMPORTS = {name: _absolute_imports(path) for name, path in MODULES.items()
                    if name.startswith("flopwatch.train")}


@pytest.mark.parametrize("name", sorted(ABSOLUTE_IMPORTS))
def test_the_training_client_imports_nothing_of_the_agent(name):
    """A training job pays only for the client: flopwatch.train imports only flopwatch.train and
    never prometheus_client."""
    imported = ABSOLUTE_IMPORTS[name]
    outside = [m for m in imported if m.startswith("flopwatch") and not m.startswith("flopwatch.train")]
    assert not outside, f"{name} imports {outside}"
    assert not [m for m in imported if m.split(".")[0] == "prometheus_client"], f"{name} imports prometheus_client"
