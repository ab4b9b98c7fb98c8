"""Where each job's step time goes: the share lost to bad workers, stage imbalance and scattered
imbalance (the What-if study's three classes, docs/rules.md), the estimated slowdown, and the
pipeline-stage tickets that fired.

The figures are the recording rules' (`job_id_class:flopwatch_step_time_lost:ratio{class}` and
`job_id:flopwatch_step_time_lost:ratio`), so they exist only where the Prometheus evaluated
alerts/; a backfilled history has none and the section says so. Each is averaged over its
evaluations in a bucket, then over the window weighted by the job's step time in each bucket
(rank-seconds in steps, from the phase counters): a share of step time over a window is lost
seconds over step seconds, not a mean of ratios. A bucket without an evaluation adds nothing to
either; the figures cover the step time of the buckets that have one, and make recommendations
only when that is enough (a tenth of `min_gpu_hours`, as for goodput).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from flopwatch.report.facts import Facts
from flopwatch.report.fetch import Results, job_clusters, with_job_clusters
from flopwatch.report.incidents import runs
from flopwatch.report.model import Column, Figure, Section, Table
from flopwatch.report.sections import cluster_name, failed_notes
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import Grid, format_duration, format_time

CLASSES = ("worker", "stage", "scattered")
CLASS_NAMES = {"worker": "bad workers", "stage": "stage imbalance", "scattered": "scattered imbalance"}
NO_SERIES = ("No share of step time lost (job_id_class:flopwatch_step_time_lost:ratio) in this window: it is "
             "recorded by the rules in alerts/flopwatch-goodput.yml, so it needs a Prometheus that evaluates them "
             "(a backfilled history has none), and jobs that report steps through flopwatch.train.")


@dataclass
class StageTicket:
    """A FlopWatchPipelineImbalance ticket: the stage named, when it fired, how much slower."""

    cluster: str
    job_id: str
    stage: str
    start: float
    end: float
    slower: float | None = None    # the stage's arrival over the fastest stage's, minus 1

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class StepTime:
    cluster: str
    job_id: str
    lost: float | None = None                                   # share of step time, all classes
    by_class: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(CLASSES))
    covered_hours: float = 0.0     # rank-hours in steps the figures cover
    slowest_stage: str = ""        # the stage furthest over the fastest, and by how much
    slowest_by: float | None = None
    tickets: list[StageTicket] = field(default_factory=list)

    @property
    def slowdown(self) -> float | None:
        """The what-if slowdown S: the share lost is 1 - 1/S."""
        return 1 / (1 - self.lost) if self.lost is not None and self.lost < 1 else None

    def lost_hours(self, cls: str) -> float:
        return (self.by_class.get(cls) or 0.0) * self.covered_hours


def _weighted(values: np.ndarray | None, weights: np.ndarray) -> tuple[float | None, float]:
    """The mean of `values` weighted by `weights` over the buckets that have both; and the weight
    those buckets carry."""
    if values is None:
        return None, 0.0
    valid = np.isfinite(values) & np.isfinite(weights) & (weights > 0)
    total = float(weights[valid].sum())
    if not total:
        return None, 0.0
    return float((values[valid] * weights[valid]).sum() / total), total


def compute(results: Results, facts: Facts, label: str) -> dict[tuple[str, str], StepTime]:
    """Per job with any recorded share of step time lost, its figures over the window."""
    grid = facts.grid
    clusters = job_clusters(facts.jobs)
    lost = with_job_clusters(results.matrix("step_lost", grid, label, "job_id"), clusters)
    by_class = with_job_clusters(results.matrix("step_lost_by_class", grid, label, "job_id", "class"), clusters)
    stages = with_job_clusters(results.matrix("stage_imbalance", grid, label, "job_id", "stage"), clusters)
    stepping: dict[tuple[str, str], np.ndarray] = {}
    for (cluster, job_id, _phase), values in results.matrix("job_phases", grid, label, "job_id", "phase").items():
        key = (cluster, job_id)
        stepping[key] = np.nansum([stepping.get(key, np.zeros(grid.n)), values], axis=0)
    out: dict[tuple[str, str], StepTime] = {}
    for key in sorted(set(lost) | {k[:2] for k in by_class}):
        job = facts.jobs.get(key)
        # step time per bucket; without phase counters every bucket weighs its length
        weights = stepping.get(key, np.full(grid.n, grid.step * (job.max_gpus if job else 1)))
        figures = StepTime(*key)
        figures.lost, covered = _weighted(lost.get(key), weights)
        for cls in CLASSES:
            figures.by_class[cls], cover = _weighted(by_class.get((*key, cls)), weights)
            covered = max(covered, cover)
        figures.covered_hours = covered / 3600
        ranked = [(mean, stage) for (c, j, stage), values in stages.items() if (c, j) == key
                  for mean in [_weighted(values, weights)[0]] if mean is not None]
        if len(ranked) >= 2:
            mean, figures.slowest_stage = max(ranked)
            figures.slowest_by = mean - 1
        out[key] = figures
    for ticket in tickets(results, grid, label, stages, stepping, clusters):
        if (ticket.cluster, ticket.job_id) in out:
            out[(ticket.cluster, ticket.job_id)].tickets.append(ticket)
    return out


def tickets(results: Results, grid: Grid, label: str, stages: dict[tuple[str, ...], np.ndarray],
            stepping: dict[tuple[str, str], np.ndarray], clusters: dict[str, str]) -> list[StageTicket]:
    """The FlopWatchPipelineImbalance tickets that fired in the window, one per firing span, with the
    named stage's imbalance over the span."""
    found = []
    fired = with_job_clusters(results.matrix("stage_tickets", grid, label, "job_id", "stage"), clusters)
    for (cluster, job_id, stage), values in fired.items():
        with np.errstate(invalid="ignore"):
            flags = np.isfinite(values) & (values > 0)
        for first, last, _count in runs(flags, max_gap=0):
            span = slice(first, last + 1)
            ratio = stages.get((cluster, job_id, stage))
            weights = stepping.get((cluster, job_id), np.ones(grid.n))
            mean = _weighted(ratio[span], weights[span])[0] if ratio is not None else None
            found.append(StageTicket(cluster, job_id, stage, float(grid.times[first] - grid.step),
                                     float(grid.times[last]), mean - 1 if mean is not None else None))
    return sorted(found, key=lambda t: (t.start, t.cluster, t.job_id, t.stage))


def section(step_times: dict[tuple[str, str], StepTime], errors: dict[str, str]) -> Section:
    """Per job: the share of step time lost by class, the slowdown, the slowest stage; the tickets."""
    section = Section(
        "step_time", "Where the step time goes",
        intro="The share of each job's step time spent waiting for slower ranks, by cause (the recording rules' "
              "estimate, step by step): bad workers (a rank slower than its peers: hardware or host, paged as "
              "stragglers), stage imbalance (a pipeline stage slower than the others: the model's partitioning, a "
              "ticket for the job's owner) and scattered imbalance (the slowest rank changes from step to step: "
              "sequence lengths or data). Estimated slowdown: 1 / (1 - share lost), the step time against one "
              "where every rank keeps its typical pace.")
    table = Table("step_time_by_job", "Per job", [
        Column("cluster", "Cluster"), Column("job_id", "Job"), Column("covered_hours", "Step-hours covered", "hours"),
        *[Column(cls, f"Lost: {CLASS_NAMES[cls]}", "pct") for cls in CLASSES],
        Column("lost", "Lost in all", "pct"), Column("slowdown", "Estimated slowdown", "float"),
        Column("slowest_stage", "Slowest stage"), Column("slowest_by", "Slower than the fastest", "pct"),
        Column("tickets", "Stage tickets", "int"),
    ], empty="no job with a recorded share of step time lost in this window")
    ticket_table = Table("stage_tickets", "Pipeline-stage tickets (FlopWatchPipelineImbalance)", [
        Column("start", "When", "time"), Column("duration", "How long", "duration"), Column("cluster", "Cluster"),
        Column("job_id", "Job"), Column("stage", "Stage"), Column("slower", "Slower than the fastest", "pct"),
    ], empty="no pipeline-stage ticket fired in this window")
    for figures in sorted(step_times.values(), key=lambda f: (-f.covered_hours, f.cluster, f.job_id)):
        table.rows.append({"cluster": cluster_name(figures.cluster), "job_id": figures.job_id,
                           "covered_hours": figures.covered_hours, **figures.by_class, "lost": figures.lost,
                           "slowdown": figures.slowdown, "slowest_stage": figures.slowest_stage,
                           "slowest_by": figures.slowest_by, "tickets": len(figures.tickets)})
        for t in figures.tickets:
            ticket_table.rows.append({"start": t.start, "duration": t.seconds,
                                      "cluster": cluster_name(t.cluster), "job_id": t.job_id,
                                      "stage": t.stage, "slower": t.slower})
    section.tables = [table, ticket_table]
    section.figures = [Figure("Step time lost", _overall(step_times), "pct", "all jobs, weighted by step time"),
                       Figure("Stage tickets", len(ticket_table.rows), "int")]
    if not step_times:
        section.notes.append(NO_SERIES)
    section.notes += failed_notes(errors, ("step_lost", "step_lost_by_class", "stage_imbalance", "stage_tickets"))
    return section


def _overall(step_times: dict[tuple[str, str], StepTime]) -> float | None:
    covered = [(f.lost, f.covered_hours) for f in step_times.values() if f.lost is not None and f.covered_hours]
    hours = sum(h for _, h in covered)
    return sum(v * h for v, h in covered) / hours if hours else None


#: Each class of lost step time: how a recommendation names it, and what its owner can do.
ADVICE = {
    "stage": ("stage imbalance costs", "repartition its layers (move layers out of stage {stage}, count the "
              "embedding and loss layers, or use interleaved virtual stages)"),
    "scattered": ("scattered imbalance (the slowest rank changes from step to step) costs",
                  "pack sequences by length (or bucket batches by sequence length) so every rank gets the same "
                  "work each step"),
    "worker": ("bad workers (ranks slower than their peers) cost",
               "drain or repair the slow GPUs and nodes the straggler incidents name"),
}


def recommendations(step_times: dict[tuple[str, str], StepTime], settings: ReportSettings,
                    enough: Callable[[float, float], bool]) -> list[tuple[float, str]]:
    """One per class of lost step time over `step_time_lost` (the stage's also on a ticket), with
    the GPU-hours at stake; `enough(hours, needed)` says whether the figures cover enough step
    time to act on."""
    t = settings.thresholds
    items: list[tuple[float, str]] = []
    for f in step_times.values():
        share = {cls: f.by_class.get(cls) or 0.0 for cls in CLASSES}
        named = [cls for cls in ("stage", "scattered", "worker")
                 if share[cls] >= t.step_time_lost or (cls == "stage" and f.tickets)]
        if not named or not enough(f.covered_hours, t.min_gpu_hours / 10):
            continue
        slowdown = f"; with all its waiting the job runs {f.slowdown:.2f}x slower than it could" if f.slowdown else ""
        stage, by = _named_stage(f)
        for cls in named:
            what, action = ADVICE[cls]
            head = f"Job {f.job_id}: "
            if cls == "stage":
                slower = f" is {100 * by:.0f}% slower than the fastest stage" if by is not None else " is the slowest"
                ticket = (f", FlopWatchPipelineImbalance ticket for "
                          f"{format_duration(sum(x.seconds for x in f.tickets))} from {format_time(f.tickets[0].start)}"
                          if f.tickets else "")
                head += f"pipeline stage {stage}{slower}{ticket}; "
            items.append((f.lost_hours(cls), f"{head}{what} {100 * share[cls]:.1f}% of its step time, about "
                                             f"{f.lost_hours(cls):,.1f} GPU-hours{slowdown}: "
                                             f"{action.format(stage=stage)}."))
    return items


def waiting_advice(f: StepTime, default: str) -> str:
    """What to do about a job's straggler badput (waiting for slower ranks): slow GPUs only when bad
    workers are most of it; otherwise the imbalance that is."""
    share = {cls: f.by_class.get(cls) or 0.0 for cls in CLASSES}
    largest = max(CLASSES, key=lambda cls: share[cls])
    if largest == "worker" or not share[largest]:
        return default
    return (f"most of the waiting is {CLASS_NAMES[largest]} ({100 * share[largest]:.1f}% of its step time), not "
            "slow GPUs: see where its step time goes")


def _named_stage(f: StepTime) -> tuple[str, float | None]:
    """The stage a recommendation names: the longest ticket's, else the slowest stage."""
    if f.tickets:
        ticket = max(f.tickets, key=lambda t: t.seconds)
        return ticket.stage, ticket.slower if ticket.slower is not None else f.slowest_by
    return f.slowest_stage or "?", f.slowest_by

