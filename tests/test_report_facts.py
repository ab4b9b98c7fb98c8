"""Facts, sections and recommendations from query results: sums over buckets, ratios last, and a
note wherever data is missing."""

from __future__ import annotations

import math

import pytest

from flopwatch.promql import Sample
from flopwatch.report import recommend, sections
from flopwatch.report.compute import compute
from flopwatch.report.energy import energy as energy_section
from flopwatch.report.facts import per_group
from flopwatch.report.fetch import Outcome, Results
from flopwatch.report.queries import Query
from flopwatch.report.settings import ReportSettings, Thresholds
from flopwatch.report.window import Grid, Window

NAN = math.nan
T0 = 1_790_000_000.0
WINDOW = Window(T0, T0 + 4 * 3600)
GRID = Grid(WINDOW.end, 3600.0, 4)
PEAK = 1e15
SETTINGS = ReportSettings(price_kwh=0.1, price_gpu_hour=2.0, teams={"alice": "llm"},
                          thresholds=Thresholds(min_gpu_hours=10))


def rng(name: str, series: list[tuple[dict[str, str], list[float]]], grid: Grid = GRID) -> Outcome:
    data = [{"metric": labels, "values": [[grid.first + i * grid.step, str(v)] for i, v in enumerate(values)
                                          if not math.isnan(v)]} for labels, values in series]
    return Outcome(Query(name, name, "e", "range", start=grid.first, end=grid.end, step=grid.step), data)


def vec(name: str, samples: list[tuple[dict[str, str], float]]) -> Outcome:
    return Outcome(Query(name, name, "e"), [Sample(labels, value) for labels, value in samples])


SPACING = 60.0
PER_BUCKET = 3600 / SPACING   # samples per series per bucket


def week_results(gpus: list[float] | None = None, previous: bool = False) -> Results:
    """16 GPUs for 4 hours; job a holds 8 of them at 25% MFU; 'ghost' steps without attribution."""
    a = {"job_id": "a"}
    flops_per_bucket = 0.25 * 8 * PEAK * 3600
    alloc = 8 * 4 * 3600
    slowest = 63.8 / 7           # with seven ranks at 9.0 s: the slowest is 0.1 s above the mean
    ranks = [({**a, "rank": str(r), "node": "n0", "gpu": str(r)}, [slowest if r == 5 else 9.0] * 4) for r in range(8)]
    outcomes = [
        rng("gpus", [({}, gpus or [16] * 4)]), rng("peak", [({}, [16 * PEAK] * 4)]), rng("busy", [({}, [8] * 4)]),
        rng("allocated", [({}, [8] * 4)]), rng("job_gpus", [({**a, "user": "alice"}, [8] * 4)]),
        rng("job_busy", [(a, [6] * 4)]),
        rng("job_flops", [(a, [flops_per_bucket] * 4), ({"job_id": "ghost"}, [2.5e17] * 4)]),
        rng("energy", [({}, [2.5 * 3.6e6] * 4)]), rng("job_energy", [(a, [2 * 3.6e6] * 4)]),
        rng("idle_energy", [({}, [0.5 * 3.6e6] * 4)]),
        rng("straggler_arrivals", ranks), rng("job_steps", [(a, [360] * 4)]),
        vec("gpu_samples", [({}, 16 * 4 * PER_BUCKET)]), vec("peak_samples", [({}, 16 * PEAK * 4 * PER_BUCKET)]),
        vec("alloc_samples", [({**a, "user": "alice"}, 8 * 4 * PER_BUCKET)]),
        vec("job_peak_samples", [(a, 8 * PEAK * 4 * PER_BUCKET)]),
        vec("energy_total", [({}, 10 * 3.6e6)]),
        vec("flops_total", [(a, 4 * flops_per_bucket), ({"job_id": "ghost"}, 1e18)]),
        vec("tokens_total", [(a, 1e9)]), vec("steps_total", [(a, 1000)]),
        vec("phases_total", [({**a, "phase": "data"}, 0.02 * alloc), ({**a, "phase": "compute"}, 0.8 * alloc),
                             ({**a, "phase": "comm"}, 0.1 * alloc), ({**a, "phase": "optimizer"}, 0.03 * alloc)]),
        vec("checkpoint_total", [(a, 0.01 * alloc)]),
    ]
    if previous:
        prev = Grid(WINDOW.start, 3600.0, 4)
        outcomes += [rng("prev_busy", [({}, [4] * 4)], prev),
                     vec("prev_gpu_samples", [({}, 16 * 4 * PER_BUCKET)]),
                     vec("prev_peak_samples", [({}, 16 * PEAK * 4 * PER_BUCKET)]),
                     vec("prev_alloc_samples", [({}, 4 * 4 * PER_BUCKET)]),
                     vec("prev_job_peak_samples", [({}, 4 * PEAK * 4 * PER_BUCKET)]),
                     vec("prev_flops_total", [({}, 0.2 * 4 * PEAK * 4 * 3600)]),
                     vec("prev_energy_total", [({}, 8 * 3.6e6)])]
    return Results({o.query.name: o for o in outcomes})


def test_job_and_cluster_figures():
    facts = compute(week_results(), SETTINGS, WINDOW, GRID, SPACING)
    job = facts.jobs[("", "a")]
    assert (job.user, job.team, job.max_gpus) == ("alice", "llm", 8)
    assert job.gpu_hours == 32 and job.busy_gpu_hours == 24 and job.idle_gpu_hours == 8
    assert job.mfu == pytest.approx(0.25) and job.hfu == pytest.approx(0.25)
    assert job.energy_kwh == pytest.approx(8) and job.tokens_per_kwh == pytest.approx(1e9 / 8)
    assert (job.first, job.last) == (WINDOW.start, WINDOW.end)
    badput = job.badput()
    assert badput == pytest.approx({"data": 0.02, "checkpoint": 0.01, "straggler": 0.01, "restart": 0.04,
                                    "lost_progress": 0.0})    # no rules' results: nothing replayed
    assert job.straggler_wait_s == pytest.approx(0.1 * 8 * 360 * 4)
    assert job.goodput == pytest.approx(0.95 - 0.02 - 0.01)
    cluster = facts.clusters[""]
    assert cluster.gpu_hours == 64 and cluster.allocated_hours == 32 and cluster.unallocated_hours == 32
    assert cluster.fleet_mfu == pytest.approx(0.125 + 1e18 / (16 * PEAK * 4 * 3600))  # the ghost job's FLOPs too
    assert cluster.energy_kwh == pytest.approx(10) and cluster.idle_energy_j == pytest.approx(2 * 3.6e6)
    assert facts.unattributed_jobs == [("", "ghost")]
    assert facts.previous.gpu_hours is None


def test_week_over_week():
    facts = compute(week_results(previous=True), SETTINGS, WINDOW, GRID, SPACING)
    prev = facts.previous
    assert prev.gpu_hours == 64 and prev.allocated_hours == 16 and prev.busy_hours == 16
    assert prev.allocated_mfu == pytest.approx(0.2) and prev.energy_kwh == pytest.approx(8)
    summary = sections.summary(facts, [], [], [], SETTINGS)
    rows = {row["figure"]: row for row in summary.tables[0].rows}
    assert rows["GPU-hours allocated to jobs"]["change"] == "+100.0%"
    assert rows["Energy, kWh"]["change"] == "+25.0%"
    assert rows["Goodput (instrumented jobs)"]["change"] == "n/a"
    assert not summary.notes


def test_missing_data_is_said_in_each_section():
    facts = compute(week_results(gpus=[16, NAN, NAN, 16]), SETTINGS, WINDOW, GRID, SPACING)
    usage = sections.usage(facts, SETTINGS, {"busy": "timeout"})
    text = " ".join(usage.notes)
    assert "No GPU data from this Prometheus from" in text and "(2 h)" in text
    assert "Job ghost (this Prometheus) reported training steps but no GPU held it" in text
    assert "The query for busy failed (timeout)" in text
    mfu = sections.mfu(facts, SETTINGS, {})
    assert any("No GPU reported tensor-pipe activity" in note for note in mfu.notes)
    assert sections.summary(facts, [], [], [], SETTINGS).notes[0].startswith("No data in the window before")


def test_an_empty_week_has_notes_not_zeros():
    facts = compute(Results(), SETTINGS, WINDOW, GRID, SPACING)
    assert facts.fleet_mfu() is None and facts.goodput() is None
    assert sections.usage(facts, SETTINGS, {}).notes == [sections.NO_GPU_DATA]
    assert sections.mfu(facts, SETTINGS, {}).notes[0] == sections.NO_TRAINING
    assert sections.goodput(facts, {}).notes == [sections.NO_TRAINING]
    energy = energy_section(facts, ReportSettings(), {})
    assert any("No GPU energy or power" in n for n in energy.notes)
    assert any("No prices configured" in n for n in energy.notes)


def test_per_user_and_team():
    facts = compute(week_results(), SETTINGS, WINDOW, GRID, SPACING)
    rows = per_group(facts.jobs.values(), "team")
    assert rows == [{"team": "llm", "jobs": 1, "gpu_hours": 32.0, "busy_gpu_hours": 24.0, "mfu": pytest.approx(0.25),
                     "energy_kwh": pytest.approx(8)}]
    usage = sections.usage(facts, SETTINGS, {})
    assert [t.name for t in usage.tables] == ["gpu_hours_by_cluster", "gpu_hours_by_job", "gpu_hours_by_user",
                                              "gpu_hours_by_team"]


def test_recommendations_carry_their_numbers():
    facts = compute(week_results(), SETTINGS, WINDOW, GRID, SPACING)
    items = recommend.recommendations(facts, [], [], SETTINGS).items
    text = "\n".join(items)
    assert "Job a ran at 25% MFU on 8 GPUs for 4 h (32 GPU-hours, about $64.00): below the 30% target" in text
    assert "Job a held GPUs idle for 8 GPU-hours (25% of its allocation, about $16.00)" in text
    assert "The cluster left 50% of its GPU-hours unallocated (32 GPU-hours, about $64.00)" in text
    quiet = recommend.recommendations(facts, [], [], ReportSettings(thresholds=Thresholds(low_mfu=0.1,
                                                                                          idle_share=0.9)))
    assert quiet.items == [] and quiet.notes == ["Nothing crossed a threshold in this window."]
