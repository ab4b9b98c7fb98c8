"""The report's facts (report/facts.py) from the first batch of query results.

Per job: what it held (GPU-seconds, the buckets it held GPUs in), how busy and at what peak, and,
for instrumented jobs, the training counters. Per cluster: the fleet's buckets and totals and the
sums over its jobs. Counters are bucket increases plus the first values of series born in the
window; seconds are sample counts x the measured sample spacing (see facts.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from flopwatch.report.facts import JOULES_PER_KWH, ClusterFacts, Facts, JobFacts, Previous, integrate, ratio
from flopwatch.report.fetch import Results, job_clusters, with_job_clusters
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import Grid, Window

JobKey = tuple[str, str]
Totals = dict[tuple[str, ...], float]
Buckets = dict[tuple[str, ...], np.ndarray]


def compute(results: Results, settings: ReportSettings, window: Window, grid: Grid, spacing: float) -> Facts:
    """Per-cluster and per-job facts from the first batch of query results; `spacing` is the
    measured seconds between samples (sample counts x spacing = seconds covered)."""
    jobs, unattributed = job_facts(results, settings, grid, spacing)
    clusters = cluster_facts(results, settings, window, grid, spacing, jobs, unattributed)
    return Facts(window, grid, clusters, jobs, previous(results, settings, window, grid, spacing), unattributed)


# -- query results as per-key sums ------------------------------------------------------------------
def _succeeded(results: Results, name: str) -> bool:
    outcome = results.get(name)
    return outcome is not None and outcome.ok


def _series(matrix: Buckets, key: tuple[str, ...], n: int) -> np.ndarray:
    return matrix.get(key, np.full(n, np.nan))


def _totals(matrix: Buckets, scale: float = 1.0) -> Totals:
    """Per key, the sum over the buckets (x `scale`): what the samples cover in the window."""
    return {key: float(np.nansum(values)) * scale for key, values in matrix.items()}


def _covered(results: Results, name: str, fallback: str, grid: Grid, *keys: str, scale: float = 1.0) -> Totals:
    """Bucket sums of `name`, or the whole-window query `fallback` when the bucket query failed."""
    if _succeeded(results, name):
        return _totals(results.matrix(name, grid, *keys), scale)
    return {key: value * scale for key, value in results.vector(fallback, *keys).items()}


def _counted(results: Results, name: str, fallback: str, grid: Grid, *keys: str) -> Totals:
    """A training counter over the covered time: its buckets' increases plus the first values of
    series that began in the window (born_*: they counted from zero before their first sample)."""
    totals = _covered(results, name, fallback, grid, *keys)
    if _succeeded(results, name):
        born = results.vector(name.replace("job_", "born_", 1), *keys)
        for key, value in born.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


# -- jobs -------------------------------------------------------------------------------------------
def job_facts(results: Results, settings: ReportSettings, grid: Grid,
              spacing: float) -> tuple[dict[JobKey, JobFacts], list[JobKey]]:
    """Every job that held GPUs, and the (cluster, job) keys that reported training steps but
    held no GPU (unattributed)."""
    jobs = _holding_jobs(results, settings, grid, spacing)
    _add_allocation(jobs, results, settings.cluster_label, grid, spacing)
    unattributed = _add_training(jobs, results, settings.cluster_label, grid)
    return jobs, unattributed


def _holding_jobs(results: Results, settings: ReportSettings, grid: Grid, spacing: float) -> dict[JobKey, JobFacts]:
    """Jobs from the attribution series: the GPUs held per bucket, first and last bucket held, and
    GPU-seconds held."""
    label = settings.cluster_label
    jobs: dict[JobKey, JobFacts] = {}

    def job_of(cluster: str, job_id: str, user: str) -> JobFacts:
        job = jobs.get((cluster, job_id))
        if job is None:
            job = jobs[(cluster, job_id)] = JobFacts(cluster, job_id, user, settings.teams.get(user, ""))
            job.gpus_series = np.zeros(grid.n)
        return job

    for (cluster, job_id, user), series in results.matrix("job_gpus", grid, label, "job_id", "user").items():
        job = job_of(cluster, job_id, user)
        job.gpus_series = np.nansum([job.gpus_series, series], axis=0)
        present = np.flatnonzero(np.isfinite(series) & (series > 0))
        if present.size:
            first, last = float(grid.times[present[0]] - grid.step), float(grid.times[present[-1]])
            job.first = first if job.first is None else min(job.first, first)
            job.last = last if job.last is None else max(job.last, last)
    held = _covered(results, "job_cover", "alloc_samples", grid, label, "job_id", "user", scale=spacing)
    for (cluster, job_id, user), seconds in held.items():
        job_of(cluster, job_id, user).gpu_seconds += seconds
    return jobs


def _add_allocation(jobs: dict[JobKey, JobFacts], results: Results, label: str, grid: Grid, spacing: float) -> None:
    """Most GPUs at once, busy and peak GPU-seconds, tensor activity and energy of each job."""
    step = grid.step
    busy = _covered(results, "job_busy_cover", "", grid, label, "job_id", scale=spacing) or \
        {key: integrate(values, step) for key, values in results.matrix("job_busy", grid, label, "job_id").items()}
    peak = _covered(results, "job_peak_cover", "job_peak_samples", grid, label, "job_id", scale=spacing)
    tensor = results.matrix("job_tensor", grid, label, "job_id")
    tensor_gpus = results.matrix("job_tensor_gpus", grid, label, "job_id")
    energy = results.matrix("job_energy", grid, label, "job_id")
    for key, job in jobs.items():
        job.max_gpus = int(np.nanmax(job.gpus_series)) if job.gpus_series is not None and job.gpus_series.size else 0
        job.busy_gpu_seconds = min(busy.get(key, 0.0), job.gpu_seconds)
        job.peak_flop_seconds = peak.get(key, 0.0)
        job.tensor_gpu_seconds = integrate(tensor.get(key), step)
        job.tensor_cover_seconds = integrate(tensor_gpus.get(key), step)
        if key in energy:  # increases per bucket: joules already
            job.energy_j = float(np.nansum(energy[key]))


@dataclass
class _TrainingCounters:
    """The training counters of every instrumented job over the window."""

    flops: Totals
    hw_flops: Totals
    tokens: Totals
    phases: Totals
    checkpoint: Totals
    steps: Totals
    flops_buckets: Buckets
    wait: dict[JobKey, float]

    @classmethod
    def read(cls, results: Results, label: str, grid: Grid, clusters: dict[str, str]) -> _TrainingCounters:
        def buckets(name: str, *keys: str) -> Buckets:
            return results.matrix(name, grid, label, "job_id", *keys)

        return cls(
            flops=_counted(results, "job_flops", "flops_total", grid, label, "job_id"),
            hw_flops=_counted(results, "job_hw_flops", "hw_flops_total", grid, label, "job_id"),
            tokens=_counted(results, "job_tokens", "tokens_total", grid, label, "job_id"),
            phases=_counted(results, "job_phases", "phases_total", grid, label, "job_id", "phase"),
            checkpoint=_counted(results, "job_checkpoint", "checkpoint_total", grid, label, "job_id"),
            steps=results.vector("steps_total", label, "job_id"),
            flops_buckets=buckets("job_flops"),
            wait=straggler_wait(buckets("straggler_arrivals", "rank", "node", "gpu"), buckets("job_steps"),
                                with_job_clusters(buckets("step_lost"), clusters), buckets("job_phases", "phase")),
        )


def _add_training(jobs: dict[JobKey, JobFacts], results: Results, label: str, grid: Grid) -> list[JobKey]:
    """Training counters and the MFU series of instrumented jobs; returns the keys of jobs that
    reported training but held no GPU."""
    clusters = job_clusters(jobs)
    counters = _TrainingCounters.read(results, label, grid, clusters)
    unattributed = []
    for key in sorted(set(counters.flops) | set(counters.steps)):
        job = jobs.get(key)
        if job is None:
            unattributed.append(key)
            continue
        job.model_flops = counters.flops.get(key, 0.0)
        job.hardware_flops = counters.hw_flops.get(key, job.model_flops)
        job.tokens = counters.tokens.get(key)
        job.steps = counters.steps.get(key)
        job.phases = {phase: value for (c, j, phase), value in counters.phases.items() if (c, j) == key}
        job.checkpoint_s = counters.checkpoint.get(key, 0.0)
        job.straggler_wait_s = counters.wait.get(key, 0.0)
        job.lost_progress_s = _lost_progress(results, label, grid, key, job.gpus_series, clusters)
        job.flops_series = counters.flops_buckets.get(key)
        _add_mfu_series(job, grid.step)
    return unattributed


def _lost_progress(results: Results, label: str, grid: Grid, key: JobKey, gpus: np.ndarray | None,
                   clusters: dict[str, str]) -> float:
    """Seconds of steps done again after a restart: the rules' lost-progress share of allocated
    time per bucket x the GPUs held x the bucket (0 where the rules' results are absent)."""
    share = with_job_clusters(results.matrix("job_lost_progress", grid, label, "job_id"), clusters).get(key)
    if share is None or gpus is None:
        return 0.0
    return float(np.nansum(share * gpus) * grid.step)


def _add_mfu_series(job: JobFacts, step: float) -> None:
    """The job's allocated peak per bucket (its GPUs x their mean peak) and MFU per bucket."""
    if job.gpus_series is not None and job.gpu_seconds:
        job.peak_series = job.gpus_series * (job.peak_flop_seconds / job.gpu_seconds)
    if job.flops_series is not None and job.peak_series is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            job.mfu_series = np.where(job.peak_series > 0, job.flops_series / (job.peak_series * step), np.nan)


# -- clusters ---------------------------------------------------------------------------------------
@dataclass
class _FleetQueries:
    """The per-cluster buckets and window totals of the fleet queries."""

    gpus: Buckets
    reporting: Buckets
    allocated: Buckets
    busy: Buckets
    peak: Buckets
    energy: Buckets
    idle_energy: Buckets
    tensor: Buckets
    tensor_gpus: Buckets
    energy_total: Totals
    flops: Totals
    power_avg: Totals
    gpu_seconds: Totals
    peak_seconds: Totals

    @classmethod
    def read(cls, results: Results, label: str, grid: Grid, spacing: float) -> _FleetQueries:
        per_bucket = spacing / grid.step  # samples in a bucket -> GPUs on average over it

        def buckets(name: str) -> Buckets:
            return results.matrix(name, grid, label)

        def averaged(cover: str) -> Buckets:
            return {key: values * per_bucket for key, values in buckets(cover).items()}

        return cls(
            gpus=buckets("gpus"), reporting=averaged("gpu_cover"),
            allocated=averaged("alloc_cover") or buckets("allocated"),
            busy=averaged("busy_cover") or buckets("busy"), peak=averaged("peak_cover") or buckets("peak"),
            energy=buckets("energy"), idle_energy=buckets("idle_energy"),
            tensor=buckets("tensor"), tensor_gpus=buckets("tensor_gpus"),
            energy_total=_covered(results, "energy", "energy_total", grid, label),
            flops=_counted(results, "job_flops", "flops_total", grid, label, "job_id"),
            power_avg=results.vector("power_avg", label),
            gpu_seconds=_covered(results, "gpu_cover", "gpu_samples", grid, label, scale=spacing),
            peak_seconds=_covered(results, "peak_cover", "peak_samples", grid, label, scale=spacing),
        )

    def names(self) -> set[str]:
        return {key[0] for key in (*self.gpus, *self.allocated, *self.energy_total, *self.power_avg,
                                   *self.gpu_seconds)}


def cluster_facts(results: Results, settings: ReportSettings, window: Window, grid: Grid, spacing: float,
                  jobs: dict[JobKey, JobFacts], unattributed: list[JobKey]) -> dict[str, ClusterFacts]:
    """Every cluster seen in the fleet queries or in a job, in name order."""
    fleet = _FleetQueries.read(results, settings.cluster_label, grid, spacing)
    names = sorted(fleet.names() | {j.cluster for j in jobs.values()} | {c for c, _ in unattributed})
    clusters = {}
    for name in names:
        cf = _cluster(name, fleet, grid)
        _add_energy(cf, fleet, window)
        _add_job_sums(cf, [j for j in jobs.values() if j.cluster == name], fleet.flops)
        clusters[name] = cf
    return clusters


def _cluster(name: str, fleet: _FleetQueries, grid: Grid) -> ClusterFacts:
    key = (name,)
    cf = ClusterFacts(
        name, grid.step, _series(fleet.gpus, key, grid.n), _series(fleet.allocated, key, grid.n),
        _series(fleet.busy, key, grid.n), _series(fleet.peak, key, grid.n), energy_series=fleet.energy.get(key),
        tensor=fleet.tensor.get(key), tensor_gpus=fleet.tensor_gpus.get(key), reporting=fleet.reporting.get(key),
    )
    cf.gpu_seconds = fleet.gpu_seconds.get(key)
    cf.peak_seconds = fleet.peak_seconds.get(key)
    return cf


def _add_energy(cf: ClusterFacts, fleet: _FleetQueries, window: Window) -> None:
    """Energy from the counter, else estimated from average power over the covered hours."""
    key = (cf.cluster,)
    if key in fleet.energy_total:
        cf.energy_j = fleet.energy_total[key]
    elif key in fleet.power_avg:
        covered = cf.gpu_seconds / max(cf.max_gpus, 1) if cf.gpu_seconds else window.seconds
        cf.energy_j = fleet.power_avg[key] * covered
        cf.energy_estimated = True
    if key in fleet.idle_energy:
        cf.idle_energy_j = float(np.nansum(fleet.idle_energy[key]))


def _add_job_sums(cf: ClusterFacts, members: list[JobFacts], flops: Totals) -> None:
    """The cluster's sums over its jobs; model FLOPs include unattributed jobs'."""
    cf.allocated_seconds = sum(j.gpu_seconds for j in members)
    cluster_flops = [v for (c, _), v in flops.items() if c == cf.cluster]
    cf.model_flops = float(sum(cluster_flops)) if cluster_flops else None
    tokens = [j.tokens for j in members if j.tokens is not None]
    cf.tokens = float(sum(tokens)) if tokens else None
    cf.allocated_peak_flop_seconds = sum(j.peak_flop_seconds for j in members)
    cf.instrumented_peak_flop_seconds = sum(j.peak_flop_seconds for j in members if j.instrumented)
    cf.allocated_busy_seconds = sum(j.busy_gpu_seconds for j in members)


# -- straggler waits --------------------------------------------------------------------------------
def straggler_wait(arrivals: Buckets, steps: Buckets, lost: Buckets | None = None,
                   phases: Buckets | None = None) -> dict[JobKey, float]:
    """Rank-seconds each job's ranks waited for slower ranks.

    Where the rules recorded the share of step time lost (`job_id:flopwatch_step_time_lost:ratio`:
    waiting beyond the collective's own time, step by step), a bucket's wait is that share of the
    job's rank-seconds in steps. Elsewhere (a history without the rules) it is what the bucket's
    arrivals show: (slowest rank's arrival - mean rank's) per step x ranks x steps, which misses
    the waits of a slowest rank that changes from step to step."""
    by_job: dict[JobKey, list[np.ndarray]] = {}
    for key, values in arrivals.items():
        by_job.setdefault((key[0], key[1]), []).append(values)
    stepping: dict[JobKey, np.ndarray] = {}
    for key, values in (phases or {}).items():
        stepping[key[:2]] = np.nansum([stepping.get(key[:2], np.zeros(values.shape)), values], axis=0)
    out = {}
    for job in set(by_job) | set(lost or {}):
        from_arrivals = _arrival_wait(by_job[job], steps.get(job)) if job in by_job else None
        recorded = (lost or {}).get(job)
        if recorded is not None and job in stepping:
            from_rules = recorded * stepping[job]
            use = np.isfinite(from_rules)
            rest = from_arrivals[~use] if from_arrivals is not None else np.zeros(0)
            out[job] = float(np.nansum(from_rules[use]) + np.nansum(rest))
        elif from_arrivals is not None:
            out[job] = float(np.nansum(from_arrivals))
    return out


def _arrival_wait(rows: list[np.ndarray], job_steps: np.ndarray | None) -> np.ndarray:
    """Per bucket: (slowest rank's arrival - mean rank's) per step x ranks x steps."""
    stack = np.vstack(rows)
    ranks = np.isfinite(stack).sum(axis=0)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # buckets where no rank stepped
        per_step = np.nanmax(stack, axis=0) - np.nanmean(stack, axis=0)
    if job_steps is None:
        job_steps = np.full(stack.shape[1], np.nan)
    return per_step * ranks * job_steps


# -- the window before ------------------------------------------------------------------------------
def previous(results: Results, settings: ReportSettings, window: Window, grid: Grid, spacing: float) -> Previous:
    """The window before, from the prev_* queries (all None when they did not run or found nothing)."""
    label = settings.cluster_label

    def total(name: str) -> float | None:
        values = results.vector(name, label)
        return float(sum(values.values())) if values else None

    def hours(name: str) -> float | None:
        samples = total(name)
        return samples * spacing / 3600 if samples is not None else None

    gpu_hours = hours("prev_gpu_samples")
    flops = total("prev_flops_total")
    if gpu_hours is None and flops is None:
        return Previous()
    busy = results.matrix("prev_busy", Grid(window.previous().end, grid.step, grid.n), label)
    peak_seconds = (total("prev_peak_samples") or 0.0) * spacing
    job_peak_seconds = (total("prev_job_peak_samples") or 0.0) * spacing
    energy = total("prev_energy_total")
    return Previous(
        gpu_hours=gpu_hours, allocated_hours=hours("prev_alloc_samples"),
        busy_hours=sum(integrate(v, grid.step) for v in busy.values()) / 3600 if busy else None,
        fleet_mfu=ratio(flops, peak_seconds), allocated_mfu=ratio(flops, job_peak_seconds),
        energy_kwh=energy / JOULES_PER_KWH if energy is not None else None, tokens=total("prev_tokens_total"),
    )
