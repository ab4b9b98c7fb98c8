"""bench/query_cost.py: its queries file is read as names to expressions, anything else refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.query_cost import load_queries

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_queries_file_loads() -> None:
    queries = load_queries(ROOT / "bench" / "queries" / "straggler_rewrite.yml")
    assert {"share_recent_before", "share_recent_after", "host_2m"} <= set(queries)
    assert "flopwatch_train_recent_phase_seconds" in queries["host_median_recent_after"]


@pytest.mark.parametrize("text", ["- a list\n", "name: ''\n", "{}\n", "name: 3\n"])
def test_anything_but_names_to_expressions_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "q.yml"
    path.write_text(text)
    with pytest.raises(ValueError, match="expected a YAML mapping of names to PromQL expressions"):
        load_queries(path)


def test_a_bad_queries_file_is_a_one_line_error_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "q.yml"
    path.write_text("- not a mapping\n")
    done = subprocess.run([sys.executable, "-m", "bench.query_cost", "--queries", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == f"query_cost: {path}: expected a YAML mapping of names to PromQL expressions"
