"""The report's interruptions and checkpoints section from query results: ETTR, interruptions by
cause, MTBF (the job's own or the cluster's rate at its size), time to restart, and Young/Daly."""

from __future__ import annotations

import math

import pytest

from flopwatch.report import reliability
from flopwatch.report.compute import compute
from tests.test_report_facts import GRID, SETTINGS, SPACING, WINDOW, vec, week_results

A = {"job_id": "a"}


def results(onsets: list[tuple[str, float]], saves: float = 8, save_seconds: float = 240):
    out = week_results()
    for outcome in (
        vec("int_onsets", [({**A, "cause": cause}, n) for cause, n in onsets]),
        vec("int_restart_sum", [(A, 600.0 * sum(n for _, n in onsets))]),
        vec("int_restart_count", [(A, sum(n for _, n in onsets))]),
        vec("int_ettr", [(A, 0.9)]), vec("int_lost", [(A, 0.02)]),
        vec("ckpt_seconds", [(A, save_seconds)]), vec("ckpt_saves", [(A, saves)]),
    ):
        out.outcomes[outcome.query.name] = outcome
    return out


def test_a_job_with_its_own_interruptions_gets_its_own_mtbf_and_young_daly():
    data = results([("gpu_lost", 2), ("none", 1)])
    facts = compute(data, SETTINGS, WINDOW, GRID, SPACING)
    rel = reliability.compute(data, facts, SETTINGS.cluster_label)
    (job,) = rel.jobs
    assert job.interruptions == {"gpu_lost": 2, "none": 1} and job.restart_s == 600
    assert (job.ettr, job.lost_progress) == (0.9, 0.02)
    # 4 hours held, 8 saves of 30 s: every 1,800 s; 3 interruptions: MTBF 4,800 s (its own).
    assert job.save_s == 30 and job.interval_s == 1800
    assert job.mtbf_s == 4800 and job.mtbf_source == "its own"
    assert job.optimal_s == pytest.approx(math.sqrt(2 * 30 * 4800))
    best = math.sqrt(2 * 30 * 4800)
    assert job.gain == pytest.approx((30 / 1800 + 1800 / 9600) - (30 / best + best / 9600))
    section = reliability.section(rel, {})
    figures = {f.label: f.value for f in section.figures}
    assert figures["Interruptions"] == 3 and figures["Per 1,000 GPU-hours"] == pytest.approx(1000 * 3 / 32)
    (advice,) = section.tables[1].rows
    assert advice["optimal"] == pytest.approx(best) and advice["mtbf_source"] == "its own"
    assert "sqrt(2 x C x MTBF)" in section.intro and not section.notes


def test_a_job_with_few_interruptions_uses_the_clusters_rate_at_its_size():
    data = results([("xid", 1)])
    facts = compute(data, SETTINGS, WINDOW, GRID, SPACING)
    (job,) = reliability.compute(data, facts, SETTINGS.cluster_label).jobs
    # One interruption in 32 GPU-hours: 1/32 per GPU-hour; at 8 GPUs, one every 4 hours.
    assert job.mtbf_source == "the cluster's rate" and job.mtbf_s == pytest.approx(4 * 3600)


def test_without_the_rules_results_the_section_says_so_and_gives_no_advice():
    data = week_results()
    facts = compute(data, SETTINGS, WINDOW, GRID, SPACING)
    rel = reliability.compute(data, facts, SETTINGS.cluster_label)
    section = reliability.section(rel, {})
    assert any("no ETTR, interruptions or restart times" in note for note in section.notes)
    assert section.tables[1].rows == [] and rel.jobs[0].mtbf_s is None


def test_queries_read_the_rules_and_rank_zeros_saves():
    from flopwatch.report.queries import QueryBuilder

    exprs = {q.name: q.expr for q in reliability.queries(QueryBuilder(SETTINGS, WINDOW, GRID, SPACING))}
    assert "count_over_time(job_id_cause:flopwatch_interruptions:started[" in exprs["int_onsets"]
    assert 'kind="save", rank="0"' in exprs["ckpt_saves"] and "changes(" in exprs["ckpt_saves"]
    assert set(exprs) == set(reliability.QUERY_NAMES)


def test_lost_progress_is_a_badput_cause_taken_out_of_goodput():
    """The rules say 5% of job a's allocated time redid steps: that share of its step time is
    lost_progress, and data, straggler wait and goodput keep only the rest; all still add up to 1."""
    from tests.test_report_facts import rng

    data = week_results()
    outcome = rng("job_lost_progress", [(A, [0.05] * 4)])
    data.outcomes[outcome.query.name] = outcome
    job = compute(data, SETTINGS, WINDOW, GRID, SPACING).jobs[("", "a")]
    badput = job.badput()
    keep = 1 - 0.05 / 0.95                       # its ranks step 95% of the allocated time
    assert badput["lost_progress"] == pytest.approx(0.05)
    assert badput["data"] == pytest.approx(0.02 * keep) and badput["straggler"] == pytest.approx(0.01 * keep)
    assert job.goodput == pytest.approx((0.95 - 0.02 - 0.01) * keep)
    assert job.goodput + sum(badput.values()) == pytest.approx(1.0)


def test_a_long_checkpoint_save_is_taken_back_from_the_interruptions():
    data = results([("none", 2), ("xid", 1)])
    outcome = vec("int_save_pauses", [(A, 1)])
    data.outcomes[outcome.query.name] = outcome
    facts = compute(data, SETTINGS, WINDOW, GRID, SPACING)
    (job,) = reliability.compute(data, facts, SETTINGS.cluster_label).jobs
    assert job.interruptions == {"none": 1, "xid": 1}
