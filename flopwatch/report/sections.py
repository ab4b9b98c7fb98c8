"""Each section of the report from the facts and incidents, with a note wherever data is missing.

Sections: summary (with week-over-week changes), GPU-hours, MFU, goodput and stragglers, and the
helpers every section uses (names, costs, failed-query notes). Hardware incidents live in
report/hardware.py, energy and cost in report/energy.py, recommendations in recommend.py.
"""

from __future__ import annotations

import numpy as np

from flopwatch.report.facts import BADPUT_CAUSES, Facts, per_group
from flopwatch.report.format import change, sentence
from flopwatch.report.incidents import Incident, Lemon
from flopwatch.report.model import Chart, Column, Figure, Section, Series, Table
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import format_duration, format_time

NO_GPU_DATA = ("No GPU telemetry (flopwatch_gpu_up) in this window: check that Prometheus scrapes the "
               "FlopWatch agents (or the simulator) and that --prometheus points at it.")
NO_ATTRIBUTION = ("No job attribution (flopwatch_gpu_job_info) in this window, so every GPU counts as "
                  "unallocated: enable the agent's attribution collector (Slurm mapping directory, process "
                  "environments or the kubelet socket).")
NO_TRAINING = ("No training telemetry (flopwatch_train_*) in this window: instrumented MFU and goodput need "
               "jobs that use flopwatch.train; the telemetry-only estimate is shown where GPUs report tensor "
               "activity.")


def cluster_name(name: str) -> str:
    return name or "this Prometheus"


def gpu_cost(hours: float | None, settings: ReportSettings) -> float | None:
    return hours * settings.price_gpu_hour if hours is not None and settings.price_gpu_hour is not None else None


def energy_cost(kwh: float | None, settings: ReportSettings) -> float | None:
    return kwh * settings.price_kwh if kwh is not None and settings.price_kwh is not None else None


def total_cost(gpu_hours: float | None, kwh: float | None, settings: ReportSettings) -> float | None:
    parts = [gpu_cost(gpu_hours, settings), energy_cost(kwh, settings)]
    present = [p for p in parts if p is not None]
    return sum(present) if present else None


def failed_notes(errors: dict[str, str], names: tuple[str, ...]) -> list[str]:
    return [f"The query for {name.replace('_', ' ')} failed ({errors[name]}); figures that need it are missing."
            for name in names if name in errors]


# -- summary ----------------------------------------------------------------------------------------
def summary(facts: Facts, stragglers: list[Incident], hardware: list[Incident], lemons: list[Lemon],
            settings: ReportSettings) -> Section:
    prev = facts.previous
    gpu_hours = facts.total("gpu_hours")
    allocated = facts.total("allocated_hours")
    busy = facts.total("busy_hours")
    kwh = facts.total("energy_kwh")
    tokens = facts.total("tokens")
    hours = facts.window.hours
    prev_kwh = prev.energy_kwh
    rows = [
        ("GPUs (most at once)", sum(c.max_gpus for c in facts.clusters.values()) or None, None, "int"),
        ("GPU-hours available", gpu_hours, prev.gpu_hours, "hours"),
        ("GPU-hours allocated to jobs", allocated, prev.allocated_hours, "hours"),
        ("GPU-hours busy", busy, prev.busy_hours, "hours"),
        ("GPU-hours unallocated", _minus(gpu_hours, allocated), _minus(prev.gpu_hours, prev.allocated_hours),
         "hours"),
        ("Fleet MFU (all GPUs)", facts.fleet_mfu(), prev.fleet_mfu, "pct"),
        ("MFU of allocated GPUs (instrumented jobs)", facts.allocated_mfu(), prev.allocated_mfu, "pct"),
        ("Telemetry-only MFU (all GPUs with tensor activity)", facts.telemetry_mfu(), None, "pct"),
        ("Goodput (instrumented jobs)", facts.goodput(), None, "pct"),
        ("Energy, kWh", kwh, prev_kwh, "kwh"),
        ("Average GPU power, kW", kwh / hours if kwh is not None else None,
         prev_kwh / hours if prev_kwh is not None else None, "float"),
        ("Tokens trained", tokens, prev.tokens, "si"),
        ("Tokens per kWh", tokens / kwh if tokens and kwh else None,
         prev.tokens / prev_kwh if prev.tokens and prev_kwh else None, "si"),
        ("Cost", total_cost(gpu_hours, kwh, settings), total_cost(prev.gpu_hours, prev_kwh, settings), "money"),
        ("Straggler incidents", len(stragglers), None, "int"),
        ("Hardware incidents", len(hardware), None, "int"),
        ("Lemon nodes", len(lemons), None, "int"),
    ]
    table = Table("summary", "This window against the one before", [
        Column("figure", "Figure"), Column("value", "This window", "float"),
        Column("previous", "Window before", "float"), Column("change", "Change"),
    ])
    for label, value, before, kind in rows:
        table.rows.append({"figure": label, "value": value, "previous": before, "change": change(value, before, kind),
                           "_kind": kind})
    section = Section("summary", "Summary", tables=[table])
    section.figures = [
        Figure("GPU-hours allocated", allocated, "hours",
               f"of {gpu_hours:,.0f} available" if gpu_hours else ""),
        Figure("Fleet MFU", facts.fleet_mfu(), "pct", "model FLOPs over every GPU's dense peak"),
        Figure("Goodput", facts.goodput(), "pct", "productive share of allocated GPU time"),
        Figure("Energy (kWh)", kwh, "kwh"),
        Figure("Cost", total_cost(gpu_hours, kwh, settings), "money",
               "" if settings.price_kwh is not None or settings.price_gpu_hour is not None
               else "set --price-kwh / --price-gpu-hour"),
        Figure("Incidents", len(stragglers) + len(hardware), "int",
               f"{len(stragglers)} straggler, {len(hardware)} hardware"),
    ]
    if prev.gpu_hours is None and prev.tokens is None:
        section.notes.append(f"No data in the window before ({format_time(facts.window.previous().start)} to "
                             f"{format_time(facts.window.start)}): no week-over-week changes.")
    return section


def _minus(a: float | None, b: float | None) -> float | None:
    return max(0.0, a - b) if a is not None and b is not None else None


# -- GPU-hours --------------------------------------------------------------------------------------
def usage(facts: Facts, settings: ReportSettings, errors: dict[str, str]) -> Section:
    section = Section("usage", "GPU-hours: allocated, busy and idle",
                      intro="Allocated: a job held the GPU (flopwatch_gpu_job_info). Busy: a kernel ran at least "
                            f"{100 * settings.thresholds.busy_utilization:.0f}% of the time. Idle: nobody held it.")
    clusters = Table("gpu_hours_by_cluster", "Per cluster", [
        Column("cluster", "Cluster"), Column("gpus", "GPUs", "int"), Column("gpu_hours", "GPU-hours", "hours"),
        Column("allocated", "Allocated", "hours"), Column("busy", "Busy", "hours"),
        Column("allocated_idle", "Allocated, idle", "hours"), Column("unallocated", "Unallocated", "hours"),
        Column("allocated_share", "Allocated share", "pct"), Column("idle_cost", "Idle GPU cost", "money"),
    ], empty="no GPU reported in this window")
    for cf in facts.clusters.values():
        if not cf.gpu_hours and not cf.allocated_hours:
            continue
        clusters.rows.append({
            "cluster": cluster_name(cf.cluster), "gpus": cf.max_gpus, "gpu_hours": cf.gpu_hours,
            "allocated": cf.allocated_hours, "busy": cf.busy_hours, "allocated_idle": cf.allocated_idle_hours,
            "unallocated": cf.unallocated_hours,
            "allocated_share": cf.allocated_hours / cf.gpu_hours if cf.gpu_hours else None,
            "idle_cost": gpu_cost(cf.unallocated_hours + cf.allocated_idle_hours, settings),
        })
    jobs = Table("gpu_hours_by_job", "Per job", [
        Column("cluster", "Cluster"), Column("job_id", "Job"), Column("user", "User"), Column("team", "Team"),
        Column("gpus", "GPUs", "int"), Column("first", "From", "time"), Column("last", "To", "time"),
        Column("gpu_hours", "GPU-hours", "hours"), Column("busy", "Busy", "hours"),
        Column("idle", "Allocated, idle", "hours"), Column("cost", "Cost", "money"),
    ], empty="no job held a GPU in this window")
    for job in facts.ranked_jobs():
        jobs.rows.append({
            "cluster": cluster_name(job.cluster), "job_id": job.job_id, "user": job.user, "team": job.team,
            "gpus": job.max_gpus, "first": job.first, "last": job.last, "gpu_hours": job.gpu_hours,
            "busy": job.busy_gpu_hours, "idle": job.idle_gpu_hours,
            "cost": total_cost(job.gpu_hours, job.energy_kwh, settings),
        })
    section.tables = [clusters, jobs]
    users = Table("gpu_hours_by_user", "Per user", _group_columns("user", "User"))
    users.rows = per_group(facts.jobs.values(), "user")
    section.tables.append(users)
    if settings.teams:
        teams = Table("gpu_hours_by_team", "Per team", _group_columns("team", "Team"))
        teams.rows = per_group(facts.jobs.values(), "team")
        section.tables.append(teams)
    section.charts.append(_states_chart(facts))
    if not any(cf.gpu_hours for cf in facts.clusters.values()):
        section.notes.append(NO_GPU_DATA)
    elif not facts.jobs:
        section.notes.append(NO_ATTRIBUTION)
    for cf in facts.clusters.values():
        first = cf.first_seen(facts.grid)
        if first is not None and first > facts.grid.covered_start + 2 * facts.grid.step:
            section.notes.append(f"{sentence(cluster_name(cf.cluster))} first reported GPUs at "
                                 f"{format_time(first)}: its figures cover the time since (a new cluster or a "
                                 "late start of monitoring).")
        for start, end in cf.gaps(facts.grid):
            section.notes.append(f"No GPU data from {cluster_name(cf.cluster)} from {format_time(start)} to "
                                 f"{format_time(end)} ({format_duration(end - start)}): GPU-hours and averages "
                                 "leave that gap out.")
    for cluster, job_id in facts.unattributed_jobs:
        section.notes.append(f"Job {job_id} ({cluster_name(cluster)}) reported training steps but no GPU held it "
                             "(flopwatch_gpu_job_info): its GPU-hours and MFU are unknown.")
    section.notes += failed_notes(errors, ("gpus", "allocated", "busy", "job_gpus", "job_busy"))
    return section


def _group_columns(key: str, title: str) -> list[Column]:
    return [Column(key, title), Column("jobs", "Jobs", "int"), Column("gpu_hours", "GPU-hours", "hours"),
            Column("busy_gpu_hours", "Busy", "hours"), Column("mfu", "MFU", "pct"),
            Column("energy_kwh", "kWh", "kwh")]


def _states_chart(facts: Facts) -> Chart:
    grid = facts.grid
    times = grid.times.tolist()
    busy, idle_alloc, unallocated = np.zeros(grid.n), np.zeros(grid.n), np.zeros(grid.n)
    for cf in facts.clusters.values():
        alloc = np.nan_to_num(cf.allocated)
        alloc_busy = np.minimum(np.nan_to_num(cf.busy), alloc)
        busy += alloc_busy
        idle_alloc += alloc - alloc_busy
        unallocated += np.maximum(np.nan_to_num(cf.gpus) - alloc, 0)
    return Chart("gpu_states", "GPUs by state over time", "area", "int", [
        Series("allocated, busy", times, busy.tolist()),
        Series("allocated, idle", times, idle_alloc.tolist()),
        Series("unallocated", times, unallocated.tolist()),
    ])


# -- MFU --------------------------------------------------------------------------------------------
def mfu(facts: Facts, settings: ReportSettings, errors: dict[str, str]) -> Section:
    section = Section("mfu", "MFU: model FLOPs utilization",
                      intro=f"Achieved model FLOP/s over dense {settings.dtype} peak FLOP/s. Instrumented: from the "
                            "FLOPs training jobs report (flopwatch.train). Telemetry-only: tensor-pipe activity × SM "
                            "clock ÷ max clock, for any job.")
    section.figures = [
        Figure("Fleet MFU", facts.fleet_mfu(), "pct", "all GPUs, idle included"),
        Figure("Allocated MFU", facts.allocated_mfu(), "pct", "GPUs held by instrumented jobs"),
        Figure("Telemetry-only MFU", facts.telemetry_mfu(), "pct", "all GPUs reporting tensor activity"),
    ]
    clusters = Table("mfu_by_cluster", "Per cluster", [
        Column("cluster", "Cluster"), Column("fleet_mfu", "Fleet MFU", "pct"),
        Column("allocated_mfu", "Allocated MFU", "pct"), Column("telemetry_mfu", "Telemetry-only MFU", "pct"),
        Column("model_flops", "Model FLOPs", "si"),
    ])
    for cf in facts.clusters.values():
        clusters.rows.append({"cluster": cluster_name(cf.cluster), "fleet_mfu": cf.fleet_mfu,
                              "allocated_mfu": cf.allocated_mfu, "telemetry_mfu": cf.telemetry_mfu,
                              "model_flops": cf.model_flops})
    jobs = Table("mfu_by_job", "Per job", [
        Column("cluster", "Cluster"), Column("job_id", "Job"), Column("gpus", "GPUs", "int"),
        Column("gpu_hours", "GPU-hours", "hours"), Column("mfu", "MFU (instrumented)", "pct"),
        Column("hfu", "HFU", "pct"), Column("telemetry_mfu", "MFU (telemetry-only)", "pct"),
        Column("tokens", "Tokens", "si"), Column("steps", "Steps", "int"),
    ], empty="no job held a GPU in this window")
    for job in facts.ranked_jobs():
        jobs.rows.append({"cluster": cluster_name(job.cluster), "job_id": job.job_id, "gpus": job.max_gpus,
                          "gpu_hours": job.gpu_hours, "mfu": job.mfu, "hfu": job.hfu,
                          "telemetry_mfu": job.telemetry_mfu, "tokens": job.tokens, "steps": job.steps})
    section.tables = [clusters, jobs]
    section.charts.append(_mfu_chart(facts, settings))
    if not any(j.instrumented for j in facts.jobs.values()):
        section.notes.append(NO_TRAINING)
    if facts.telemetry_mfu() is None:
        section.notes.append("No GPU reported tensor-pipe activity (flopwatch_gpu_tensor_active_ratio needs GPM on "
                             "Hopper or newer, or DCGM profiling): no telemetry-only MFU.")
    if not any(cf.peak_flop_seconds for cf in facts.clusters.values()):
        section.notes.append(f"No {settings.dtype} peak FLOP/s (flopwatch_gpu_peak_dense_flops) in this window: MFU "
                             "needs it (unknown GPU models need gpu.peak_flops in the agent's config).")
    section.notes += failed_notes(errors, ("job_flops", "job_peak_samples", "job_tensor", "flops_total",
                                           "peak_samples"))
    return section


def _mfu_chart(facts: Facts, settings: ReportSettings) -> Chart:
    grid = facts.grid
    times = grid.times.tolist()
    flops, peak, job_peak = np.zeros(grid.n), np.zeros(grid.n), np.zeros(grid.n)
    for cf in facts.clusters.values():
        peak += np.nan_to_num(cf.peak)
    for job in facts.jobs.values():
        if job.flops_series is not None and job.peak_series is not None:
            flops += np.nan_to_num(job.flops_series)
            job_peak += np.nan_to_num(job.peak_series)
    tensor, tensor_gpus = np.zeros(grid.n), np.zeros(grid.n)
    for cf in facts.clusters.values():
        if cf.tensor is not None and cf.tensor_gpus is not None:
            tensor += np.nan_to_num(cf.tensor)
            tensor_gpus += np.nan_to_num(cf.tensor_gpus)
    series = []
    with np.errstate(invalid="ignore", divide="ignore"):
        if flops.any():
            series.append(Series("fleet (all GPUs)", times, np.where(peak > 0, flops / (peak * grid.step),
                                                                       np.nan).tolist()))
            series.append(Series("allocated GPUs", times, np.where(job_peak > 0, flops / (job_peak * grid.step),
                                                                     np.nan).tolist()))
        if tensor_gpus.any():
            series.append(Series("telemetry-only (all GPUs)", times,
                                 np.where(tensor_gpus > 0, tensor / tensor_gpus, np.nan).tolist()))
    for job in [j for j in facts.ranked_jobs() if j.mfu_series is not None][:settings.top_jobs_in_charts]:
        series.append(Series(f"job {job.job_id}", times, job.mfu_series.tolist()))
    return Chart("mfu_trend", "MFU over time: fleet, allocated GPUs and the largest jobs", "line", "pct", series)


# -- goodput ----------------------------------------------------------------------------------------
def goodput(facts: Facts, errors: dict[str, str]) -> Section:
    section = Section("goodput", "Goodput and badput by cause",
                      intro="Goodput: step time less data loading and waiting for stragglers, over allocated GPU "
                            "time, without the steps done again after a restart. Badput causes: data loading, "
                            "checkpoints, straggler waits, restarts (allocated time in neither steps nor checkpoints: "
                            "crashes, hangs, lost GPUs) and lost progress (steps redone after a restart from an older "
                            "checkpoint, where the Prometheus evaluated alerts/flopwatch-goodput.yml).")
    table = Table("goodput_by_job", "Per instrumented job", [
        Column("cluster", "Cluster"), Column("job_id", "Job"), Column("gpu_hours", "GPU-hours", "hours"),
        Column("goodput", "Goodput", "pct"), *[Column(c, f"Badput: {c}", "pct") for c in BADPUT_CAUSES],
        Column("lost_gpu_hours", "GPU-hours lost", "hours"),
    ], empty="no instrumented job in this window")
    lost_by_cause = dict.fromkeys(BADPUT_CAUSES, 0.0)
    for job in facts.ranked_jobs():
        badput = job.badput()
        if badput is None:
            continue
        row = {"cluster": cluster_name(job.cluster), "job_id": job.job_id, "gpu_hours": job.gpu_hours,
               "goodput": job.goodput, **badput,
               "lost_gpu_hours": job.gpu_hours * (1 - (job.goodput or 0.0))}
        table.rows.append(row)
        for cause in BADPUT_CAUSES:
            lost_by_cause[cause] += badput[cause] * job.gpu_hours
    section.tables.append(table)
    section.figures = [Figure("Goodput", facts.goodput(), "pct", "instrumented jobs")]
    if table.rows:
        section.charts.append(Chart("badput_by_cause", "GPU-hours lost by cause", "bar", "hours",
                                    bars=[(cause, lost_by_cause[cause]) for cause in BADPUT_CAUSES]))
    else:
        section.notes.append(NO_TRAINING)
    section.notes += failed_notes(errors, ("phases_total", "checkpoint_total", "straggler_arrivals", "job_steps"))
    return section


# -- stragglers -------------------------------------------------------------------------------------
def stragglers(incidents: list[Incident], method: str, errors: dict[str, str]) -> Section:
    section = Section("stragglers", "Straggler incidents", intro=method)
    table = Table("straggler_incidents", "Incidents", [
        Column("start", "When", "time"), Column("duration", "How long", "duration"), Column("cluster", "Cluster"),
        Column("job_id", "Job"), Column("node", "Node"), Column("gpu", "GPU"), Column("rank", "Rank"),
        Column("cause", "Cause"), Column("slowdown", "Slower than median", "pct"),
        Column("gpu_hours_lost", "GPU-hours lost", "hours"),
    ], empty="no straggler in this window")
    for i in incidents:
        table.rows.append({"start": i.start, "duration": i.seconds, "cluster": cluster_name(i.cluster),
                           "job_id": i.job_id, "node": i.node, "gpu": i.gpu, "rank": ",".join(i.ranks),
                           "cause": i.cause or "not examined",
                           "slowdown": i.score - 1 if i.score is not None else None,
                           "gpu_hours_lost": i.gpu_hours_lost})
    section.tables.append(table)
    lost = [i.gpu_hours_lost for i in incidents if i.gpu_hours_lost is not None]
    section.figures = [Figure("Incidents", len(incidents), "int"),
                       Figure("GPU-hours lost", sum(lost) if lost else None, "hours", "whole jobs waiting")]
    section.notes += failed_notes(errors, ("straggler_arrivals", "straggler_alerts"))
    return section
