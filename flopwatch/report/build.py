"""Building a report: probe what the Prometheus holds, run the queries in three batches (the main
figures and the rules' share of step time lost; the straggler detector that suits the data;
per-incident details), compute the sections, then write HTML, Markdown, CSV and (with Chromium)
PDF."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flopwatch.catalog import gpu, train
from flopwatch.promql import PromClient, PromError
from flopwatch.report import fabric, recommend, reliability, render, sections, steptime
from flopwatch.report import incidents as inc
from flopwatch.report.compute import compute
from flopwatch.report.energy import energy as energy_section
from flopwatch.report.facts import Facts
from flopwatch.report.fetch import Fetcher, Progress, Results
from flopwatch.report.hardware import hardware as hardware_section
from flopwatch.report.model import Report, Section
from flopwatch.report.pdf import PdfError, write_pdf
from flopwatch.report.queries import Query, QueryBuilder, probe_queries, quote
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import Grid, Window, format_duration, format_time, grid_for

TITLE = "FlopWatch utilization report"


@dataclass
class Written:
    files: list[Path] = field(default_factory=list)
    pdf_error: str | None = None


def build(prometheus: str, window: Window, settings: ReportSettings, progress: Progress | None = None,
          now: float | None = None) -> Report:
    """Query `prometheus` over `window` and assemble the report (raises fetch.Unreachable)."""
    client = PromClient(prometheus, timeout=settings.timeout)
    fetcher = Fetcher(client, workers=settings.workers, progress=progress)
    fetcher.check()
    probe = fetcher.run(probe_queries(settings, window))
    gpu_samples = probe.scalar("probe_gpu") or 0.0
    train_samples = probe.scalar("probe_train") or 0.0
    report = Report(TITLE, prometheus, window.start, window.end, now if now is not None else time.time(), 0.0,
                    settings.currency)
    if not gpu_samples and not train_samples:
        report.has_data = False
        report.step = window.seconds
        report.notes.append(
            f"There is no data: this Prometheus holds no FlopWatch series (flopwatch_gpu_up, "
            f"flopwatch_train_steps_total) between {format_time(window.start)} and {format_time(window.end)}. "
            "Check the window (--last, --from/--to), that Prometheus scrapes the FlopWatch agents, and that its "
            "retention reaches back that far.")
        return report

    spacing = sample_spacing(client, window) or window.seconds / max(gpu_samples, train_samples)
    grid = grid_for(window, spacing)
    report.step = grid.step
    fetcher.grid = grid
    promql = QueryBuilder(settings, window, grid, spacing)
    first = [*promql.range_queries(), *promql.counter_queries(), *promql.total_queries(window),
             *promql.hardware_candidates(), promql.straggler_arrivals(), *promql.step_time_queries(),
             *reliability.queries(promql), *fabric.queries(promql)]
    if probe.scalar("probe_prev"):
        previous = window.previous()
        first += promql.total_queries(previous, prefix="prev_")
        first += promql.previous_range_queries(Grid(previous.end, grid.step, grid.n))  # busy GPUs
    results = fetcher.run(first)

    alerts = bool(results.scalar("alerts_present"))
    second = [promql.straggler_alerts()] if alerts else []
    candidates = {query.name: [k[0] for k in results.vector(query.name, "node")]
                  for query in promql.hardware_candidates()}
    second += promql.hardware_ranges(candidates)
    if not results.vector("energy_total", settings.cluster_label):
        second.append(promql.power_fallback())
    fetcher.run(second)

    facts = compute(results, settings, window, grid, spacing)
    label = settings.cluster_label
    if alerts:
        stragglers = inc.stragglers_from_alerts(results, grid, label)
    else:
        t = settings.thresholds
        stragglers = inc.stragglers_from_arrivals(results, grid, label, t.straggler_excess, t.straggler_min_buckets)
    hardware = inc.hardware(results, grid, label)
    _details(fetcher, promql, facts, stragglers, hardware, with_cause=not alerts)
    lemons = inc.lemons(stragglers + hardware, settings.thresholds.lemon_occasions)
    step_times = steptime.compute(results, facts, label)

    errors = {name: o.error for name, o in results.outcomes.items() if o.error}
    report.sections = [
        sections.summary(facts, stragglers, hardware, lemons, settings),
        recommend.recommendations(facts, stragglers, lemons, settings, step_times),
        sections.usage(facts, settings, errors),
        sections.mfu(facts, settings, errors),
        sections.goodput(facts, errors),
        reliability.section(reliability.compute(results, facts, label), errors),
        steptime.section(step_times, errors),
        sections.stragglers(stragglers, _method(alerts, grid, settings), errors),
        hardware_section(hardware, lemons, errors, fabric.lemons(results, grid, label)),
        energy_section(facts, settings, errors),
    ]
    _summary_first(report.sections)
    return report


def sample_spacing(client: PromClient, window: Window) -> float | None:
    """Seconds between samples, measured: the median gap between the raw samples of the series
    with the most samples (GPU telemetry, else training), in its fullest bucket of the window.
    Every covered second is a sample count times this, so it must not depend on how much of the
    window the data fills. None when it cannot be measured (the caller estimates)."""
    coarse = grid_for(window, None)
    for name in (gpu.UP.name, train.STEPS.name):
        try:
            top = client.query(f"topk(1, count_over_time({name}[{window.range()}]))", at=window.end)
            if not top:
                continue
            matchers = ", ".join(f"{k}={quote(v)}" for k, v in sorted(top[0].labels.items()) if k != "__name__")
            selector = f"{name}{{{matchers}}}"
            counts = client.query_range(f"count_over_time({selector}[{coarse.range()}])", coarse.first, coarse.end,
                                        coarse.step)
            points = [(float(v), float(t)) for series in counts for t, v in series["values"]]
            if not points:
                continue
            fullest = max(points)[1]
            raw = client._get("/api/v1/query", {"query": f"{selector}[{coarse.range()}]", "time": fullest})
        except PromError:
            return None
        stamps = sorted(float(t) for series in raw.get("result", []) for t, _ in series.get("values", []))
        gaps = np.diff(stamps)
        if gaps.size:
            return float(np.median(gaps))
    return None


def _summary_first(items: list[Section]) -> None:
    """Recommendations come right after the summary: what a reader acts on."""
    order = ["summary", "recommendations"]
    items.sort(key=lambda s: order.index(s.id) if s.id in order else len(order))


def _method(alerts: bool, grid: Grid, settings: ReportSettings) -> str:
    t = settings.thresholds
    if alerts:
        return ("From the FlopWatchStraggler alerts this Prometheus evaluated (its ALERTS series), with the cause "
                "each alert named. Slowdown and GPU-hours lost come from the ranks' own counters over each "
                "incident.")
    return (f"This Prometheus holds no FlopWatchStraggler alerts for the window (a backfilled history has none), so "
            f"the straggler score was evaluated over the raw counters: a rank that reached the gradient collective "
            f"at least {100 * t.straggler_excess:.0f}% (or 5 robust sigmas of its job's ranks, if more) later per "
            f"step than its job's median rank, in jobs of at least 8 ranks, in "
            f"{format_duration(grid.step)} buckets, for at least {t.straggler_min_buckets} buckets. Each cause is "
            "read from the GPU's and node's telemetry over the incident (clock-event reasons, PCIe width, NVLink "
            "and InfiniBand errors, host CPU, data-loading time).")


def _details(fetcher: Fetcher, promql: QueryBuilder, facts: Facts, stragglers: list[inc.Incident],
             hardware: list[inc.Incident], with_cause: bool) -> None:
    """Per-incident queries: the straggler's slowdown (and cause), the job that held a faulty GPU."""
    grid = promql.grid

    def job_gpus(incident: inc.Incident) -> int:
        job = facts.jobs.get((incident.cluster, incident.job_id))
        if job is None or job.gpus_series is None:
            return 0
        window = slice(max(0, grid.index(incident.start + grid.step)), grid.index(incident.end) + 1)
        held = job.gpus_series[window]
        return int(np.nanmax(held)) if held.size and np.isfinite(held).any() else job.max_gpus

    ranked = sorted(stragglers, key=lambda i: -(i.seconds * max(job_gpus(i), 1)))[:inc.DETAIL_LIMIT]
    queries: list[Query] = []
    for n, incident in enumerate(ranked):
        queries.append(promql.straggler_detail(f"detail_{n}", incident.cluster, incident.job_id, incident.ranks[0],
                                               incident.node, incident.gpus[0], incident.start, incident.end))
    located = [i for i in hardware if i.gpus][:inc.DETAIL_LIMIT]
    for n, incident in enumerate(located):
        queries.append(promql.gpu_job(f"owner_{n}", incident.cluster, incident.node, incident.gpus[0],
                                      min(incident.start + grid.step, incident.end)))
    results: Results = fetcher.run(queries)
    for n, incident in enumerate(ranked):
        signals = {k[0]: v for k, v in results.vector(f"detail_{n}", "signal").items()}
        job = facts.jobs.get((incident.cluster, incident.job_id))
        inc.apply_detail(incident, signals, job_gpus(incident), job.arrival_share if job else 1.0, with_cause)
    for n, incident in enumerate(located):
        owners = results.vector(f"owner_{n}", "job_id")
        incident.job_id = ", ".join(sorted(k[0] for k in owners if k[0]))


def write(report: Report, out_dir: Path, pdf: bool = True) -> Written:
    """Every output file; the PDF only when Chromium is there (its absence is said, not fatal)."""
    written = Written(render.write_all(report, out_dir))
    if pdf:
        try:
            written.files.append(write_pdf(out_dir / "report.html", out_dir / "report.pdf"))
        except PdfError as error:
            written.pdf_error = str(error)
    return written
