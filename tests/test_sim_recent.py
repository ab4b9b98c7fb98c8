"""The simulator's recent window (RankCounters.recent_window), which stands for the agent's
flopwatch_train_recent_*_seconds gauges in every scenario: the same definition as the intake's
(tests/test_train_intake.py holds the agent to it). Only the simulator's counters are involved; the
job runner is a stand-in carrying the few figures a step's accounting reads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from flopwatch.catalog import train as m
from flopwatch.sim.jobs import PHASES, StepResult
from flopwatch.sim.state import RankCounters

RUNNER = SimpleNamespace(spec=SimpleNamespace(tokens_per_step=1024), flops_per_step=1e12, hw_flops_per_step=1e12,
                         steps=0, replay_steps=0)


def step(counters: RankCounters, end: float, data: list[float], compute: list[float], other: float = 0.05) -> None:
    ranks = counters.ranks
    phases = {name: np.full(ranks, 0.1) for name in PHASES}
    phases["data"], phases["compute"], phases["other"] = np.array(data), np.array(compute), np.full(ranks, other)
    RUNNER.steps += 1
    counters.observe_step(RUNNER, StepResult(start=end - 1.0, wall=1.0, phases=phases), end)


def test_the_window_is_the_last_ten_seconds_of_steps_before_the_latest():
    c = RankCounters(2)
    for i in range(10):                              # steps end at 1..10 s: no step 10 s before the last yet
        step(c, 1.0 + i, data=[0.1, 0.1], compute=[0.6, 0.6])
    assert c.recent_window(10.5) is None
    for i in range(10, 15):                          # rank 1 computes 0.9 s from the step ending at 11 s
        step(c, 1.0 + i, data=[0.1, 0.1], compute=[0.6, 0.9])
    window = c.recent_window(15.2)                   # steps ending at 6..15 s (10 of them): 5 slow
    assert window[0] == pytest.approx([0.75, 0.9])                   # arrival: data + compute + other
    assert window[0, 1] == pytest.approx(0.1 + 0.5 * 0.6 + 0.5 * 0.9 + 0.05)
    assert window[1:, 0] == pytest.approx([0.1, 0.05])               # data, other (RECENT_PHASES order)
    assert m.RECENT_PHASES == ("data", "other")
    assert len(c.recent) == 11                                        # the start and the 10 steps after it


def test_steps_longer_than_the_window_are_measured_over_the_last_two():
    c = RankCounters(1)
    for i, compute in enumerate((1.0, 1.0, 3.0)):
        step(c, 18.0 * (i + 1), data=[0.0], compute=[compute], other=0.0)
    assert c.recent_window(54.0)[0, 0] == pytest.approx(2.0)         # (1 + 3) / 2


def test_a_rank_that_reports_no_step_for_thirty_seconds_has_no_window():
    c = RankCounters(1)
    for i in range(12):
        step(c, float(i), data=[0.1], compute=[0.6])
    assert c.recent_window(11.0 + m.RECENT_STALE_S) is not None
    assert c.recent_window(11.5 + m.RECENT_STALE_S) is None
