"""Where the step time goes: the rules' shares of step time lost averaged over the window by step
time, the stage tickets' spans, and recommendations only over the threshold and with enough data."""

from __future__ import annotations

import math

import pytest

from flopwatch.report import steptime
from flopwatch.report.facts import Facts, Previous
from flopwatch.report.fetch import Results
from flopwatch.report.settings import ReportSettings, Thresholds
from flopwatch.report.window import Grid, Window
from tests.test_report_facts import rng

NAN = math.nan
T0 = 1_790_000_000.0
GRID = Grid(T0 + 4 * 3600, 3600.0, 4)
FACTS = Facts(Window(T0, T0 + 4 * 3600), GRID, {}, {}, Previous())
JOB = {"job_id": "pp"}


def results(lost: list[float], phases: list[float] | None, tickets: list[float] | None = None) -> Results:
    outcomes = [rng("step_lost", [(JOB, lost)]),
                rng("step_lost_by_class", [({**JOB, "class": "stage"}, [v * 0.75 for v in lost]),
                                      ({**JOB, "class": "scattered"}, [v * 0.25 for v in lost]),
                                      ({**JOB, "class": "worker"}, [0.0 if math.isfinite(v) else NAN for v in lost])]),
                rng("stage_imbalance", [({**JOB, "stage": "0"}, [1.0] * 4),
                                        ({**JOB, "stage": "1"}, [1.1, 1.2, 1.3, 1.3])])]
    if phases is not None:  # two phases whose sum is the step time per bucket
        outcomes.append(rng("job_phases", [({**JOB, "phase": "compute"}, [p / 2 for p in phases]),
                                           ({**JOB, "phase": "comm"}, [p / 2 for p in phases])]))
    if tickets is not None:
        outcomes.append(rng("stage_tickets", [({**JOB, "stage": "1"}, tickets)]))
    return Results({o.query.name: o for o in outcomes})


def test_shares_are_weighted_by_step_time_over_the_buckets_that_have_them():
    figures = steptime.compute(results([0.1, 0.4, NAN, NAN], [3600, 3 * 3600, 5 * 3600, 0]), FACTS, "cluster")
    job = figures[("", "pp")]
    assert job.lost == pytest.approx((0.1 * 1 + 0.4 * 3) / 4)     # not the mean of the ratios (0.25)
    assert job.by_class["stage"] == pytest.approx(0.75 * job.lost) and job.by_class["worker"] == 0.0
    assert job.covered_hours == pytest.approx(4.0)                # the bucket without a share adds nothing
    assert job.slowdown == pytest.approx(1 / (1 - job.lost))
    # the slowest stage over every bucket it was measured in, weighted alike
    assert (job.slowest_stage, job.slowest_by) == ("1", pytest.approx((1.1 + 3 * 1.2 + 5 * 1.3) / 9 - 1))


def test_without_phase_counters_every_bucket_weighs_its_length():
    job = steptime.compute(results([0.1, 0.4, NAN, NAN], None), FACTS, "cluster")[("", "pp")]
    assert job.lost == pytest.approx(0.25)


def test_tickets_are_firing_spans_naming_the_stage_and_its_imbalance():
    job = steptime.compute(results([0.2] * 4, [3600] * 4, [NAN, 1, 1, NAN]), FACTS, "cluster")[("", "pp")]
    assert len(job.tickets) == 1
    ticket = job.tickets[0]
    assert (ticket.stage, ticket.start, ticket.end) == ("1", GRID.times[0], GRID.times[2])
    assert ticket.slower == pytest.approx(0.25)   # stage 1 over buckets 2-3: (1.2 + 1.3) / 2


def test_a_window_without_the_rules_results_says_why():
    section = steptime.section(steptime.compute(Results({}), FACTS, "cluster"), {})
    assert section.tables[0].rows == [] and steptime.NO_SERIES in section.notes


def test_recommendations_need_the_threshold_and_enough_step_time():
    settings = ReportSettings(thresholds=Thresholds(min_gpu_hours=10, step_time_lost=0.05))
    asked: list[float] = []

    def enough(hours: float, needed: float) -> bool:
        asked.append(needed)
        return hours >= needed

    big = steptime.compute(results([0.4] * 4, [3600] * 4, [NAN, 1, 1, NAN]), FACTS, "cluster")
    texts = [text for _, text in steptime.recommendations(big, settings, enough)]
    assert len(texts) == 2 and asked == [1.0]
    assert texts[0].startswith("Job pp: pipeline stage 1 is 25% slower than the fastest stage, "
                               "FlopWatchPipelineImbalance ticket for 2 h from")
    assert "stage imbalance costs 30.0% of its step time" in texts[0] and "1.67x slower" in texts[0]
    assert "scattered imbalance" in texts[1] and "pack sequences by length" in texts[1]
    small = steptime.compute(results([0.02] * 4, [3600] * 4), FACTS, "cluster")
    assert steptime.recommendations(small, settings, enough) == []          # under 5% each
    short = steptime.compute(results([0.4, NAN, NAN, NAN], [0.5 * 3600] * 4), FACTS, "cluster")
    assert steptime.recommendations(short, settings, enough) == [] and asked[-1] == 1.0   # 0.5 h < 1 h


def test_straggler_badput_advice_names_the_imbalance_behind_it():
    job = steptime.compute(results([0.4] * 4, [3600] * 4), FACTS, "cluster")[("", "pp")]
    assert steptime.waiting_advice(job, "drain GPUs").startswith("most of the waiting is stage imbalance (30.0%")
    job.by_class = {"worker": 0.3, "stage": 0.1, "scattered": 0.0}
    assert steptime.waiting_advice(job, "drain GPUs") == "drain GPUs"
