"""The README's layout table names every top-level folder and every package under flopwatch/, so a
newcomer finds where each capability lives (CONTRIBUTING.md sends them there)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def layout_rows() -> set[str]:
    """The paths in the first column of README.md's layout table (`a/`, `b/` on one row count each)."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| path | what |"):]
    table = table[:table.index("\n\n")]
    return {path for row in table.splitlines()[2:] for path in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def tracked_folders() -> set[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {f"{name.split('/')[0]}/" for name in files if "/" in name}


def test_every_top_level_folder_has_a_row() -> None:
    assert tracked_folders() - layout_rows() == set(), "README.md's layout table: add a row for each"


def test_every_package_under_flopwatch_has_a_row() -> None:
    packages = {f"{init.parent.relative_to(ROOT)}/" for init in (ROOT / "flopwatch").rglob("__init__.py")}
    assert packages - layout_rows() == set(), "README.md's layout table: add a row for each"
