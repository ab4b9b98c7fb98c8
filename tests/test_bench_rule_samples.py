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


@pytest.mark.parametrize(("argv", "says"), [
    (["--rules", "/nonexistent"], "no rule files (flopwatch-*.yml) in /nonexistent"),
    (["--nodes", "0"], "--nodes must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert says in usage_error(rule_samples.main, argv, monkeypatch, capsys)
