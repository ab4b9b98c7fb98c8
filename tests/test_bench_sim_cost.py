"""bench/sim_cost.py: its figures add up, and bad input is one line with exit code 2."""

from __future__ import annotations

import pytest
from helpers import usage_error

from bench import sim_cost


def test_tick_cost_splits_the_simulators_cpu_into_advance_and_render() -> None:
    figures = sim_cost.tick_cost(nodes=2, ticks=2)
    assert figures["gpus"] == 16 and figures["ticks"] == 2
    assert figures["sim_cores"] == pytest.approx(figures["advance_cores"] + figures["render_cores"], rel=1e-3)
    assert figures["reference_sim_cores"] == pytest.approx(
        figures["advance_cores"] + figures["reference_render_cores"], rel=1e-3)
    assert figures["reference_over_sim"] == pytest.approx(
        figures["reference_sim_cores"] / figures["sim_cores"], abs=0.006)
    assert figures["sim_ms_per_node_tick"] == pytest.approx(1e3 * figures["sim_cores"] * 5.0 / 2, rel=1e-3)


@pytest.mark.parametrize(("argv", "says"), [
    (["--nodes", "ten"], "--nodes: expected node counts separated by commas, got 'ten'"),
    (["--nodes", "0"], "--nodes: give at least one fleet size of 1 node or more"),
    (["--against", "/nonexistent"], "--against: /nonexistent holds no flopwatch/sim/serve.py"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert says in usage_error(sim_cost.main, argv, monkeypatch, capsys)


def test_a_value_template_gives_back_its_exposition_and_its_values() -> None:
    body = (b'# HELP m A 100% share.\n# TYPE m gauge\nm{gpu="0",k="a b"} 0.25\nm{gpu="1",k="x"} 1e-05\n'
            b"plain 3.0\n")
    text, values = sim_cost.value_template(body)
    assert values == (0.25, 1e-05, 3.0)
    assert (text % values).encode() == body
    assert (text % (0.5, 2.0, 3.0)).encode() == body.replace(b"0.25", b"0.5").replace(b"1e-05", b"2.0")


def test_the_floor_is_measured_beside_the_ticks_on_the_same_fleet() -> None:
    figures = sim_cost.format_floor(nodes=2, ticks=2)
    assert figures["nodes"] == 2 and figures["format_floor_cores"] > 0
    assert figures["tick_over_floor"] == pytest.approx(figures["tick_cores"] / figures["format_floor_cores"], rel=0.01)
    assert figures["series_compared"] > 500
    assert 0 < figures["values_unchanged_after_ticks_share"] < 1   # counters move, info series do not


def test_against_another_tree_says_whether_it_renders_the_same_bytes(tmp_path) -> None:
    """A copy of this tree renders what this one does; a copy whose simulated hosts report other
    memory does not, and the comparison says so beside the figures."""
    import shutil
    from pathlib import Path

    root = Path(sim_cost.__file__).resolve().parents[1]
    ignore = shutil.ignore_patterns("__pycache__")
    for name, change in (("same", None), ("other", ("0.35 if node.job_id", "0.36 if node.job_id"))):
        tree = tmp_path / name
        for package in ("flopwatch", "bench"):
            shutil.copytree(root / package, tree / package, ignore=ignore)
        if change is not None:
            node = tree / "flopwatch" / "sim" / "node.py"
            assert change[0] in node.read_text()
            node.write_text(node.read_text().replace(*change))
        figures = sim_cost.against_tree(nodes=2, ticks=1, tree=tree, rounds=1)
        assert figures["same_expositions"] is (change is None), name
