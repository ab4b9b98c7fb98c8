"""The package's shape (CONTRIBUTING.md): no function over 80 lines, no module over 500 lines.

Read from the source with ast, so it costs nothing to run. The only exemption by design is a
declarative data table (a module or function that is one literal), listed in DATA_TABLES with why.
PENDING_SPLIT names code over the limits that is known and waits for a split in its own area: an
entry fails the test once it is no longer needed, so the list can only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "flopwatch"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500

#: "path" or "path:function" -> why it is data, not code.
DATA_TABLES: dict[str, str] = {}

#: "path" or "path:function" -> what is pending; remove the entry with the split.
PENDING_SPLIT: dict[str, str] = {
}


def oversized() -> dict[str, int]:
    """'path' -> lines for each module over the limit, 'path:function' -> lines for each function."""
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        source = path.read_text()
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            found[name] = lines
        for node in ast.walk(ast.parse(source, name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found[f"{name}:{node.name}"] = length
    return found


#: Measured once, at collection (CPython 3.11's parser can fail after other tests' deep recursion).
FOUND = oversized()


def test_no_long_function_and_no_long_module():
    over = {key: lines for key, lines in FOUND.items() if key not in DATA_TABLES and key not in PENDING_SPLIT}
    assert not over, (f"over {MAX_FUNCTION_LINES} lines a function or {MAX_MODULE_LINES} a module (split it into "
                      "named pieces, or list a pure data table in DATA_TABLES):\n"
                      + "\n".join(f"  {key}: {lines} lines" for key, lines in sorted(over.items())))


def test_exemptions_are_still_needed():
    stale = sorted(key for key in (*DATA_TABLES, *PENDING_SPLIT) if key not in FOUND)
    assert not stale, f"within the limits now; remove from tests/test_code_shape.py: {stale}"


def test_the_measure_counts_what_it_should():
    """A function of 81 lines is over, one of 80 is not (the walk itself can fail)."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    tree = ast.parse(f"def short():\n{body}\n\ndef long():\n{body}\n    y = 0\n")
    lengths = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert lengths == {"short": 80, "long": 81}
