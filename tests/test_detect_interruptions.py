"""Scoring the rules' interruptions, MTBF and recommended checkpoint interval against the
simulator's truth (flopwatch/detect/interruptions.py), on recorded series written by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flopwatch.detect import interruptions

HOUR = 3600.0


def _series(job_id: str, times: list[float], values: list[float], **labels: str):
    return ({"job_id": job_id, **labels}, np.array(times), np.array(values))


def _truth(count: int, allocated_s: float) -> dict:
    drawn = [{"telemetry_cause": "xid", "restart_seconds": 600.0} for _ in range(count)]
    return {"interruptions": drawn, "allocated_seconds": allocated_s,
            "badput": {"restart": 0.01, "lost_progress": 0.005, "checkpoint": 0.03}}


def _recorded(mtbf: list[float], interval: list[float]) -> dict:
    times = [100 * HOUR, 150 * HOUR, 168 * HOUR][-len(mtbf):]
    return {
        interruptions.ONSETS: [_series("j", [80 * HOUR], [1.0], cause="xid"),
                               _series("j", [110 * HOUR, 160 * HOUR], [1.0, 1.0], cause="xid")],
        interruptions.RESTARTS: [_series("j", [80.2 * HOUR, 110.2 * HOUR], [590.0, 610.0])],
        interruptions.MTBF: [_series("j", times, mtbf)],
        interruptions.INTERVAL: [_series("j", times[-len(interval):], interval)],
    }


def test_mtbf_and_the_interval_are_the_newest_samples_against_the_run_and_young_daly():
    rate_mtbf = 49.5 * HOUR
    recorded = _recorded([80 * HOUR, 60 * HOUR, 57 * HOUR], [4500.0, 4800.0])
    score = interruptions.score_job("j", _truth(3, 168 * HOUR), recorded, (0, 168 * HOUR), (0, 168 * HOUR),
                                    rate_mtbf_s=rate_mtbf, save_s=60.0)
    assert score.counted_exactly and score.causes_right
    assert score.true_mtbf_s == 56 * HOUR                       # the run's: 168 h over 3
    assert score.mtbf_error == pytest.approx(1 / 56)            # 57 h read, the last sample
    assert score.mtbf_rate_error == pytest.approx(57 / 49.5 - 1)
    assert score.young_daly_s == pytest.approx(math.sqrt(2 * 60 * rate_mtbf))
    assert score.interval_error == pytest.approx(abs(4800 / math.sqrt(2 * 60 * rate_mtbf) - 1))


def test_a_sample_after_the_run_or_not_finite_is_not_the_newest():
    recorded = _recorded([60 * HOUR, 57 * HOUR, math.nan], [4600.0, 4700.0, 9e9])
    recorded[interruptions.INTERVAL][0][1][-1] = 200 * HOUR      # after the span
    score = interruptions.score_job("j", _truth(3, 168 * HOUR), recorded, (0, 168 * HOUR), (0, 168 * HOUR),
                                    rate_mtbf_s=49.5 * HOUR, save_s=60.0)
    assert score.rule_mtbf_s == 57 * HOUR and score.rule_interval_s == 4700.0


def test_targets_hold_each_figure_to_the_issue_and_say_what_was_not_recorded():
    recorded = _recorded([57 * HOUR], [4800.0])
    good = interruptions.score_job("j", _truth(3, 168 * HOUR), recorded, (0, 168 * HOUR), (0, 168 * HOUR),
                                   rate_mtbf_s=49.5 * HOUR, save_s=60.0).as_dict()
    rows = {what: (measured, met) for what, measured, met in interruptions.targets([(good, 0.4)])}
    assert all(met is not None for _, met in rows.values())
    counted = next(v for k, v in rows.items() if k.startswith("interruptions counted"))
    assert counted == ("1/1", True)
    mtbf = next(v for k, v in rows.items() if k.startswith("MTBF"))
    assert mtbf[1] is True and "from the scenario's rate" in mtbf[0]
    bad = dict(good, counted_exactly=False, interval_error=0.25, mtbf_error=None)
    rows = {what: (measured, met) for what, measured, met in interruptions.targets([(good, 0.4), (bad, 1.5)])}
    assert next(v for k, v in rows.items() if k.startswith("interruptions counted")) == ("1/2", False)
    assert next(v for k, v in rows.items() if k.startswith("ETTR"))[1] is False
    assert next(v for k, v in rows.items() if k.startswith("recommended"))[1] is False
    assert interruptions.targets([]) == []
