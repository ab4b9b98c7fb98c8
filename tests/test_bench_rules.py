"""Rule files as the detection benchmark reads them: order, pruning, waves and selectors."""

from __future__ import annotations

import pytest

from flopwatch.detect.rules import RuleFileError, load, names_in, selectors

RULES = """
groups:
  - name: late
    interval: 15s
    rules:
      - alert: Slow
        expr: b:score > 1.1
        for: 1m
        keep_firing_for: 30s
        labels: {severity: page, cause: "{{ $labels.reason }}"}
  - name: early
    rules:
      - record: b:score
        expr: a:rate / on (job_id) group_left quantile by (job_id) (0.5, a:rate)
      - record: a:rate
        expr: rate(flopwatch_train_phase_seconds_total{phase="compute", job_id!=""}[1m])
      - record: unused:sum
        expr: sum(flopwatch_gpu_power_watts)
"""


@pytest.fixture
def rules_dir(tmp_path):
    (tmp_path / "one.yml").write_text(RULES)
    (tmp_path / "alertmanager.yml").write_text("route: {receiver: x}\n")
    return tmp_path


def test_rules_are_ordered_after_what_they_read_with_group_intervals(rules_dir):
    rules = load(rules_dir, default_interval=5.0)
    assert [r.name for r in rules.rules] == ["a:rate", "b:score", "Slow", "unused:sum"]
    slow = rules.alerting[0]
    assert (slow.interval, slow.hold, slow.keep_firing) == (15.0, 60.0, 30.0)
    assert rules.recording[0].interval == 5.0
    assert [p.name for p in rules.files] == ["one.yml"]


def test_needed_drops_recording_rules_no_alert_reads_unless_kept(rules_dir):
    rules = load(rules_dir, 5.0)
    assert [r.name for r in rules.needed().rules] == ["a:rate", "b:score", "Slow"]
    assert "unused:sum" in [r.name for r in rules.needed(("unused:sum",)).rules]


def test_levels_put_each_rule_after_the_rules_it_reads(rules_dir):
    waves = load(rules_dir, 5.0).levels()
    assert [[r.name for r in wave] for wave in waves] == [["a:rate", "unused:sum"], ["b:score"], ["Slow"]]


def test_selectors_keep_matchers_and_ignore_names_inside_strings():
    exprs = ['rate(flopwatch_train_phase_seconds_total{phase="compute", job_id!=""}[1m])',
             'label_replace(flopwatch_gpu_up, "x", "flopwatch_gpu_power_watts", "", "")',
             'flopwatch_gpu_clock_event_active{reason=~"sw_.*"} == 1']
    names = {"flopwatch_train_phase_seconds_total", "flopwatch_gpu_up", "flopwatch_gpu_power_watts",
             "flopwatch_gpu_clock_event_active"}
    found = selectors(exprs, names)
    assert not found.wants_name("flopwatch_gpu_power_watts")
    assert found.wants("flopwatch_gpu_up", {"gpu": "1"})
    assert found.wants("flopwatch_train_phase_seconds_total", {"phase": "compute", "job_id": "j"})
    assert not found.wants("flopwatch_train_phase_seconds_total", {"phase": "comm", "job_id": "j"})
    assert found.wants("flopwatch_gpu_clock_event_active", {"reason": "sw_thermal"})
    assert not found.wants("flopwatch_gpu_clock_event_active", {"reason": "idle"})
    assert "flopwatch_gpu_power_watts" not in names_in(exprs[1])


def test_an_unreadable_matcher_keeps_every_series_of_that_name():
    found = selectors(["flopwatch_gpu_up{gpu=~`0|1`}"], {"flopwatch_gpu_up"})
    assert found.wants("flopwatch_gpu_up", {"gpu": "7"})


def test_bad_rule_files_are_one_line_errors(tmp_path):
    with pytest.raises(RuleFileError, match="no rule files"):
        load(tmp_path, 5.0)
    (tmp_path / "x.yml").write_text("groups: [{name: g, rules: [{expr: up}]}]\n")
    with pytest.raises(RuleFileError, match="needs `record` or `alert`"):
        load(tmp_path, 5.0)
    (tmp_path / "x.yml").write_text("groups:\n  - name: g\n    rules:\n      - {record: a, expr: b + 1}\n"
                                    "      - {record: b, expr: a + 1}\n")
    with pytest.raises(RuleFileError, match="depends on itself"):
        load(tmp_path, 5.0)
