"""Alert state over evaluation steps, as Prometheus's rules/alerting.go keeps it."""

from __future__ import annotations

from flopwatch.detect.alerts import AlertTracker

A = (("alertname", "X"), ("gpu", "1"))
B = (("alertname", "X"), ("gpu", "2"))


def run(tracker, presence):
    for step, labels in enumerate(presence):
        tracker.step(float(step * 5), [(label_set, 1.0) for label_set in labels])
    return [(e.labels["gpu"], e.active_at, e.fired_at, e.resolved_at) for e in tracker.episodes]


def test_fires_after_for_and_resolves_at_the_first_missing_step():
    assert run(AlertTracker("X", hold=10), [[A], [A], [A], [A], [], [A]]) == [("1", 0.0, 10.0, 20.0)]


def test_a_gap_before_firing_restarts_pending():
    assert run(AlertTracker("X", hold=10), [[A], [A], [], [A], [A], [A]]) == [("1", 15.0, 25.0, None)]


def test_zero_for_fires_at_the_first_step_and_label_sets_are_separate():
    assert run(AlertTracker("X"), [[A, B], [B], []]) == [("1", 0.0, 0.0, 5.0), ("2", 0.0, 0.0, 10.0)]


def test_keep_firing_for_bridges_short_gaps():
    tracker = AlertTracker("X", hold=0, keep_firing=10)
    assert run(tracker, [[A], [], [A], [], [], [], [A]]) == [("1", 0.0, 0.0, 25.0), ("1", 30.0, 30.0, None)]
