"""bench/rules_ab.py: the order of its windows, what a window's rule CPU counts, and its summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.rules_ab import group_names, order, rule_cores, summary

ROOT = Path(__file__).resolve().parents[1]


def test_windows_alternate_in_mirrored_pairs() -> None:
    assert order(1) == ["reference", "candidate"]
    assert order(3) == ["reference", "candidate", "candidate", "reference", "reference", "candidate"]


def window(cpu: float, wall: float, groups: dict[str, tuple[float, float, float]]) -> dict[str, object]:
    """A measured window as bench/scale_prometheus.py's _window returns it: group -> (interval,
    iterations over the window, missed ones)."""
    first, last = {}, {}
    for name, (interval, done, missed) in groups.items():
        first[("prometheus_rule_group_iterations_total", name)] = 100.0
        last[("prometheus_rule_group_iterations_total", name)] = 100.0 + done
        first[("prometheus_rule_group_iterations_missed_total", name)] = 0.0
        last[("prometheus_rule_group_iterations_missed_total", name)] = missed
        last[("prometheus_rule_group_interval_seconds", name)] = interval
        last[("prometheus_rule_group_rules", name)] = 1.0
    return {"cpu": cpu, "wall": wall, "first": first, "last": last, "durations": {}}


def test_rule_cores_are_over_the_scrape_only_window_per_iteration_run_of_the_groups_loaded() -> None:
    # 0.3 cores in a 100 s window, 0.1 of them scraping: 0.2 for the rules when every iteration ran
    every = window(30.0, 100.0, {"a": (5.0, 20.0, 0.0), "b": (10.0, 10.0, 0.0)})
    assert rule_cores(every, 0.1, {"a", "b"}) == pytest.approx(0.2)
    # half of the iterations skipped: the rules would need twice the cores measured
    starved = window(30.0, 100.0, {"a": (5.0, 20.0, 10.0), "b": (10.0, 10.0, 5.0)})
    assert rule_cores(starved, 0.1, {"a", "b"}) == pytest.approx(0.4)
    # a group the folder before had, left without iterations, must not read as skipped ones
    leftover = window(30.0, 100.0, {"a": (5.0, 20.0, 0.0), "b": (10.0, 10.0, 0.0), "gone": (5.0, 0.0, 0.0)})
    assert rule_cores(leftover, 0.1, {"a", "b"}) == pytest.approx(0.2)
    assert rule_cores(leftover, 0.1, {"a", "b", "gone"}) == pytest.approx(0.2 / (30 / 50))


def test_summary_gives_means_spreads_and_the_candidate_over_the_reference() -> None:
    windows = [{"rules": name, "rule_core_seconds_per_s_per_1000_gpus": value}
               for name, value in zip(order(2), (0.12, 0.10, 0.11, 0.13), strict=True)]
    out = summary(windows)
    assert out["reference_per_window"] == [0.12, 0.13]
    assert out["candidate_per_window"] == [0.10, 0.11]
    assert out["reference_mean"] == 0.125 and out["candidate_mean"] == 0.105
    assert out["reference_spread"] == 0.01
    assert out["candidate_over_reference_per_pair"] == [round(0.10 / 0.12, 3), round(0.11 / 0.13, 3)]
    assert out["candidate_over_reference"] == round(0.105 / 0.125, 3)


def test_group_names_are_read_from_the_folders_rule_files(tmp_path: Path) -> None:
    (tmp_path / "flopwatch-a.yml").write_text("groups:\n  - name: one\n    rules: []\n  - name: two\n    rules: []\n")
    (tmp_path / "other.yml").write_text("groups:\n  - name: not-ours\n    rules: []\n")
    assert group_names(tmp_path) == {"one", "two"}
    assert "flopwatch-stragglers" in group_names(ROOT / "alerts")


def test_a_folder_without_rule_files_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.rules_ab", "--reference", str(ROOT / "alerts"),
                           "--candidate", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert f"--candidate: no rule files (flopwatch-*.yml) in {tmp_path}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_two_folders_are_measured_in_turn_on_a_tiny_fleet(tmp_path: Path) -> None:
    """2 simulated nodes, a real Prometheus (Debian's `prometheus` package or the current build):
    the candidate is the shipped rules without the straggler files, so its windows must count none
    of their groups and the reference's must."""
    import json
    import shutil

    candidate = tmp_path / "candidate"
    candidate.mkdir()
    for path in (ROOT / "alerts").glob("flopwatch-*.yml"):
        if path.name != "flopwatch-stragglers.yml":
            shutil.copy(path, candidate / path.name)
    out = tmp_path / "ab.json"
    done = subprocess.run([sys.executable, "-m", "bench.rules_ab", "--reference", str(ROOT / "alerts"),
                           "--candidate", str(candidate), "--nodes", "2", "--rounds", "1", "--seconds", "6",
                           "--warmup", "4", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["rules_ab"]
    assert [w["rules"] for w in results["windows"]] == ["reference", "candidate"]
    reference, measured = (w["group_busy_ms_per_s"] for w in results["windows"])
    assert "flopwatch-stragglers" in reference and "flopwatch-stragglers-2m" in reference
    assert not any(name.startswith("flopwatch-stragglers") for name in measured)
    assert "flopwatch-goodput" in measured
    assert results["gpus"] == 16 and len(results["reference_per_window"]) == 1
