"""bench/rule_samples.py: every rule expression is measured once per file, per GPU and second of
its group's interval; bad input is one line with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import usage_error

from bench import rule_samples


def test_samples_are_summed_per_file_per_gpu_and_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "flopwatch-a.yml").write_text(
        "groups:\n- name: fast\n  interval: 5s\n  rules:\n  - {record: r1, expr: up}\n  - {record: r2, expr: up * 2}\n"
        "- name: slow\n  interval: 1m\n  rules:\n  - {alert: A, expr: up == 0}\n")
    (tmp_path / "flopwatch-b.yml").write_text("groups:\n- name: b\n  rules:\n  - {record: r3, expr: vector(1)}\n")
    read = {"up": 100, "up * 2": 300, "up == 0": 600, "vector(1)": 30}
    monkeypatch.setattr(rule_samples, "samples_read", lambda url, expr, at: read[expr])
    figures = rule_samples.per_file("http://127.0.0.1:1", rule_samples.rule_files(tmp_path), gpus=10, at=0.0)
    assert figures == pytest.approx({"flopwatch-a.yml": (100 + 300) / 5 / 10 + 600 / 60 / 10,
                                     "flopwatch-b.yml": 30 / 15 / 10})   # no interval: Prometheus's 15 s


def test_each_evaluation_is_counted_once_and_rules_rank_by_cost_per_interval_and_gpu() -> None:
    seen: dict = {}
    def answer(last_a: str, time_a: float, last_b: str) -> list[dict]:
        return [{"name": "fast", "rules": [{"name": "r1", "lastEvaluation": last_a, "evaluationTime": time_a},
                                           {"name": "r1", "lastEvaluation": last_b, "evaluationTime": 0.004}]},
                {"name": "slow", "rules": [{"name": "A", "lastEvaluation": "", "evaluationTime": 9.0}]}]
    rule_samples.count_new_evaluations(seen, answer("t1", 0.010, "t1"))
    rule_samples.count_new_evaluations(seen, answer("t1", 0.010, "t1"))     # polled again: no new evaluation
    rule_samples.count_new_evaluations(seen, answer("t2", 0.030, "t1"))
    assert {key: durations for key, (_, durations) in seen.items()} == {
        ("fast", "r1", 0): [0.010, 0.030], ("fast", "r1", 1): [0.004]}     # never evaluated: not counted
    rows = rule_samples.costliest({key: durations for key, (_, durations) in seen.items()},
                                  {"fast": 5.0, "slow": 60.0}, gpus=500, top=5)
    assert [(row["index"], row["evaluations"]) for row in rows] == [(0, 2), (1, 1)]
    assert rows[0]["mean_ms"] == pytest.approx(20.0)
    assert rows[0]["seconds_per_second_per_1000_gpus"] == pytest.approx(0.020 / 5 * 1000 / 500)
    assert len(rule_samples.costliest({key: d for key, (_, d) in seen.items()}, {"fast": 5.0}, 500, top=1)) == 1


@pytest.mark.parametrize(("argv", "says"), [
    (["--eval-seconds", "-1"], "--eval-seconds must be at least 0"),
    (["--rules", "/nonexistent"], "no rule files (flopwatch-*.yml) in /nonexistent"),
    (["--nodes", "0"], "--nodes must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert says in usage_error(rule_samples.main, argv, monkeypatch, capsys)
