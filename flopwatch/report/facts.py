"""The numbers behind the report, per cluster and per job, from the query results.

Every figure counts only the time the samples cover. GPU-hours and the MFU denominator (allocated
GPUs x peak FLOP/s x time) are sample counts per bucket times the measured sample spacing; counters
(FLOPs, tokens, energy, phase seconds) are sums of per-bucket increases, so a bucket without
samples (before the first, after the last, a scrape gap, a Prometheus restart) adds nothing to
either side of a ratio. Ratios are formed last, from those sums.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from flopwatch.report.fetch import Results
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import Grid, Window

BADPUT_CAUSES = ("data", "checkpoint", "straggler", "restart")
JOULES_PER_KWH = 3.6e6


def _sum(values: np.ndarray | None, step: float) -> float:
    return float(np.nansum(values) * step) if values is not None else 0.0


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


@dataclass
class JobFacts:
    cluster: str
    job_id: str
    user: str = ""
    team: str = ""
    gpu_seconds: float = 0.0           # allocated GPU-seconds (flopwatch_gpu_job_info)
    busy_gpu_seconds: float = 0.0
    peak_flop_seconds: float = 0.0     # allocated GPUs x dense peak x time: the MFU denominator
    max_gpus: int = 0
    first: float | None = None         # first and last bucket the job held GPUs
    last: float | None = None
    model_flops: float | None = None   # None: the job reports no training telemetry
    hardware_flops: float | None = None
    tokens: float | None = None
    steps: float | None = None
    tensor_gpu_seconds: float = 0.0    # telemetry MFU numerator (GPU-seconds at full tensor peak)
    tensor_cover_seconds: float = 0.0  # GPU-seconds that reported tensor activity
    energy_j: float | None = None
    phases: dict[str, float] = field(default_factory=dict)   # rank-seconds per phase
    checkpoint_s: float = 0.0
    straggler_wait_s: float = 0.0
    gpus_series: np.ndarray | None = None    # per bucket: GPUs held, model FLOPs, allocated peak, MFU
    flops_series: np.ndarray | None = None
    peak_series: np.ndarray | None = None
    mfu_series: np.ndarray | None = None

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def busy_gpu_hours(self) -> float:
        return self.busy_gpu_seconds / 3600

    @property
    def idle_gpu_hours(self) -> float:
        return max(0.0, self.gpu_seconds - self.busy_gpu_seconds) / 3600

    @property
    def hours(self) -> float:
        return self.gpu_seconds / self.max_gpus / 3600 if self.max_gpus else 0.0

    @property
    def instrumented(self) -> bool:
        return self.model_flops is not None

    @property
    def mfu(self) -> float | None:
        return _ratio(self.model_flops, self.peak_flop_seconds)

    @property
    def hfu(self) -> float | None:
        return _ratio(self.hardware_flops, self.peak_flop_seconds)

    @property
    def telemetry_mfu(self) -> float | None:
        return _ratio(self.tensor_gpu_seconds, self.tensor_cover_seconds) if self.tensor_cover_seconds else None

    @property
    def energy_kwh(self) -> float | None:
        return self.energy_j / JOULES_PER_KWH if self.energy_j is not None else None

    @property
    def tokens_per_kwh(self) -> float | None:
        return _ratio(self.tokens, self.energy_kwh)

    @property
    def arrival_share(self) -> float:
        """Share of step time spent before the collective (data + compute + other)."""
        total = sum(self.phases.values())
        arrival = sum(self.phases.get(p, 0.0) for p in ("data", "compute", "other"))
        return arrival / total if total else 1.0

    def badput(self) -> dict[str, float] | None:
        """Fractions of allocated GPU time by cause (the rules' definitions, over the window)."""
        if not self.instrumented or not self.phases or not self.gpu_seconds:
            return None
        stepping = sum(self.phases.values())
        alloc = self.gpu_seconds
        return {
            "data": self.phases.get("data", 0.0) / alloc,
            "checkpoint": self.checkpoint_s / alloc,
            "straggler": self.straggler_wait_s / alloc,
            "restart": max(0.0, 1 - (stepping + self.checkpoint_s) / alloc),
        }

    @property
    def goodput(self) -> float | None:
        if not self.instrumented or not self.phases or not self.gpu_seconds:
            return None
        stepping = sum(self.phases.values())
        return max(0.0, stepping - self.phases.get("data", 0.0) - self.straggler_wait_s) / self.gpu_seconds


@dataclass
class ClusterFacts:
    cluster: str
    step: float
    gpus: np.ndarray
    allocated: np.ndarray
    busy: np.ndarray
    peak: np.ndarray
    energy_j: float | None = None
    energy_estimated: bool = False     # from average power, the fleet lacks the energy counter
    energy_series: np.ndarray | None = None
    idle_energy_j: float | None = None
    tensor: np.ndarray | None = None
    tensor_gpus: np.ndarray | None = None
    reporting: np.ndarray | None = None       # GPUs reporting, averaged over each bucket's samples
    gpu_seconds: float | None = None          # from sample counts; None: from the buckets
    peak_seconds: float | None = None
    allocated_seconds: float | None = None
    model_flops: float | None = None
    tokens: float | None = None
    allocated_peak_flop_seconds: float = 0.0
    allocated_busy_seconds: float = 0.0
    instrumented_peak_flop_seconds: float = 0.0

    @property
    def gpu_hours(self) -> float:
        return (self.gpu_seconds if self.gpu_seconds is not None else _sum(self.gpus, self.step)) / 3600

    @property
    def allocated_hours(self) -> float:
        seconds = self.allocated_seconds if self.allocated_seconds is not None else _sum(self.allocated, self.step)
        return seconds / 3600

    @property
    def busy_hours(self) -> float:
        return _sum(self.busy, self.step) / 3600

    @property
    def unallocated_hours(self) -> float:
        return max(0.0, self.gpu_hours - self.allocated_hours)

    @property
    def allocated_idle_hours(self) -> float:
        return max(0.0, self.allocated_hours - self.allocated_busy_seconds / 3600)

    @property
    def max_gpus(self) -> int:
        return int(np.nanmax(self.gpus)) if np.isfinite(self.gpus).any() else 0

    @property
    def covered_hours(self) -> float:
        """Hours of data: the GPU-hours the samples cover over the most GPUs seen at once."""
        return self.gpu_hours / self.max_gpus if self.max_gpus else 0.0

    @property
    def peak_flop_seconds(self) -> float:
        return self.peak_seconds if self.peak_seconds is not None else _sum(self.peak, self.step)

    @property
    def fleet_mfu(self) -> float | None:
        """Model FLOPs over every GPU's peak, idle GPUs included."""
        return _ratio(self.model_flops, self.peak_flop_seconds)

    @property
    def allocated_mfu(self) -> float | None:
        """Model FLOPs of instrumented jobs over the peak of the GPUs allocated to them."""
        return _ratio(self.model_flops, self.instrumented_peak_flop_seconds)

    @property
    def telemetry_mfu(self) -> float | None:
        if self.tensor is None or self.tensor_gpus is None:
            return None
        return _ratio(_sum(self.tensor, self.step), _sum(self.tensor_gpus, self.step))

    @property
    def energy_kwh(self) -> float | None:
        return self.energy_j / JOULES_PER_KWH if self.energy_j is not None else None

    def first_seen(self, grid: Grid) -> float | None:
        seen = np.flatnonzero(np.isfinite(self.gpus) & (self.gpus > 0))
        return float(grid.times[seen[0]] - grid.step) if seen.size else None

    def gaps(self, grid: Grid) -> list[tuple[float, float]]:
        """Spans inside the data where no GPU reported (a scrape outage, a Prometheus restart)."""
        present = np.isfinite(self.gpus) & (self.gpus > 0)
        seen = np.flatnonzero(present)
        if seen.size == 0:
            return []
        gaps, start = [], None
        for i in range(seen[0], seen[-1] + 1):
            if not present[i] and start is None:
                start = i
            elif present[i] and start is not None:
                gaps.append((float(grid.times[start] - grid.step), float(grid.times[i - 1])))
                start = None
        return gaps


@dataclass
class Previous:
    """The week before, for deltas (None where it had no data)."""

    gpu_hours: float | None = None
    allocated_hours: float | None = None
    busy_hours: float | None = None
    fleet_mfu: float | None = None
    allocated_mfu: float | None = None
    energy_kwh: float | None = None
    tokens: float | None = None


@dataclass
class Facts:
    window: Window
    grid: Grid
    clusters: dict[str, ClusterFacts]
    jobs: dict[tuple[str, str], JobFacts]
    previous: Previous
    unattributed_jobs: list[tuple[str, str]] = field(default_factory=list)

    def total(self, attribute: str) -> float | None:
        values = [getattr(c, attribute) for c in self.clusters.values()]
        values = [v for v in values if v is not None]
        return float(sum(values)) if values else None

    def fleet_mfu(self) -> float | None:
        flops = self.total("model_flops")
        return _ratio(flops, self.total("peak_flop_seconds"))

    def allocated_mfu(self) -> float | None:
        return _ratio(self.total("model_flops"), self.total("instrumented_peak_flop_seconds"))

    def telemetry_mfu(self) -> float | None:
        num = sum(_sum(c.tensor, c.step) for c in self.clusters.values() if c.tensor is not None)
        den = sum(_sum(c.tensor_gpus, c.step) for c in self.clusters.values() if c.tensor_gpus is not None)
        return num / den if den else None

    def goodput(self) -> float | None:
        """Good rank-seconds over allocated GPU-seconds of instrumented jobs."""
        good = alloc = 0.0
        for job in self.jobs.values():
            if job.goodput is not None:
                good += job.goodput * job.gpu_seconds
                alloc += job.gpu_seconds
        return good / alloc if alloc else None

    def ranked_jobs(self) -> list[JobFacts]:
        return sorted(self.jobs.values(), key=lambda j: (-j.gpu_seconds, j.cluster, j.job_id))


def _series(matrix: dict[tuple[str, ...], np.ndarray], key: tuple[str, ...], n: int) -> np.ndarray:
    return matrix.get(key, np.full(n, np.nan))


def _totals(matrix: dict[tuple[str, ...], np.ndarray], scale: float = 1.0) -> dict[tuple[str, ...], float]:
    """Per key, the sum over the buckets (x `scale`): what the samples cover in the window."""
    return {key: float(np.nansum(values)) * scale for key, values in matrix.items()}


def _covered(results: Results, name: str, fallback: str, grid: Grid, *keys: str,
             scale: float = 1.0) -> dict[tuple[str, ...], float]:
    """Bucket sums of `name`, or the whole-window query `fallback` when the bucket query failed."""
    if results.get(name) is not None and results.get(name).ok:  # type: ignore[union-attr]
        return _totals(results.matrix(name, grid, *keys), scale)
    return {key: value * scale for key, value in results.vector(fallback, *keys).items()}


def _counted(results: Results, name: str, fallback: str, grid: Grid, *keys: str) -> dict[tuple[str, ...], float]:
    """A training counter over the covered time: its buckets' increases plus the first values of
    series that began in the window (born_*: they counted from zero before their first sample)."""
    totals = _covered(results, name, fallback, grid, *keys)
    if results.get(name) is not None and results.get(name).ok:  # type: ignore[union-attr]
        born = results.vector(name.replace("job_", "born_", 1), *keys)
        for key, value in born.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


def compute(results: Results, settings: ReportSettings, window: Window, grid: Grid, spacing: float) -> Facts:
    """Per-cluster and per-job facts from the first batch of query results; `spacing` is the
    measured seconds between samples (sample counts x spacing = seconds covered)."""
    jobs, unattributed = _jobs(results, settings, grid, spacing)
    clusters = _clusters(results, settings, window, grid, spacing, jobs, unattributed)
    return Facts(window, grid, clusters, jobs, previous(results, settings, window, grid, spacing), unattributed)


def _jobs(results: Results, settings: ReportSettings, grid: Grid,
          spacing: float) -> tuple[dict[tuple[str, str], JobFacts], list[tuple[str, str]]]:
    n, step = grid.n, grid.step
    m = results.matrix
    label = settings.cluster_label
    held = _covered(results, "job_cover", "alloc_samples", grid, label, "job_id", "user", scale=spacing)
    busy = _covered(results, "job_busy_cover", "", grid, label, "job_id", scale=spacing) or \
        {key: _sum(values, step) for key, values in m("job_busy", grid, label, "job_id").items()}
    peak = _covered(results, "job_peak_cover", "job_peak_samples", grid, label, "job_id", scale=spacing)
    flops = _counted(results, "job_flops", "flops_total", grid, label, "job_id")
    hw_flops = _counted(results, "job_hw_flops", "hw_flops_total", grid, label, "job_id")
    tokens = _counted(results, "job_tokens", "tokens_total", grid, label, "job_id")
    phases = _counted(results, "job_phases", "phases_total", grid, label, "job_id", "phase")
    checkpoint = _counted(results, "job_checkpoint", "checkpoint_total", grid, label, "job_id")
    steps_total = results.vector("steps_total", label, "job_id")
    job_tensor = m("job_tensor", grid, label, "job_id")
    job_tensor_gpus = m("job_tensor_gpus", grid, label, "job_id")
    job_energy = m("job_energy", grid, label, "job_id")
    job_flops = m("job_flops", grid, label, "job_id")
    wait = straggler_wait(m("straggler_arrivals", grid, label, "job_id", "rank", "node", "gpu"),
                          m("job_steps", grid, label, "job_id"), m("step_lost", grid, label, "job_id"),
                          m("job_phases", grid, label, "job_id", "phase"))

    jobs: dict[tuple[str, str], JobFacts] = {}

    def job_of(cluster: str, job_id: str, user: str) -> JobFacts:
        job = jobs.get((cluster, job_id))
        if job is None:
            job = jobs[(cluster, job_id)] = JobFacts(cluster, job_id, user, settings.teams.get(user, ""))
            job.gpus_series = np.zeros(n)
        return job

    for (cluster, job_id, user), series in m("job_gpus", grid, label, "job_id", "user").items():
        job = job_of(cluster, job_id, user)
        job.gpus_series = np.nansum([job.gpus_series, series], axis=0)
        present = np.flatnonzero(np.isfinite(series) & (series > 0))
        if present.size:
            first, last = float(grid.times[present[0]] - step), float(grid.times[present[-1]])
            job.first = first if job.first is None else min(job.first, first)
            job.last = last if job.last is None else max(job.last, last)
    for (cluster, job_id, user), seconds in held.items():
        job_of(cluster, job_id, user).gpu_seconds += seconds
    for job in jobs.values():
        key = (job.cluster, job.job_id)
        job.max_gpus = int(np.nanmax(job.gpus_series)) if job.gpus_series is not None and job.gpus_series.size else 0
        job.busy_gpu_seconds = min(busy.get(key, 0.0), job.gpu_seconds)
        job.peak_flop_seconds = peak.get(key, 0.0)
        job.tensor_gpu_seconds = _sum(job_tensor.get(key), step)
        job.tensor_cover_seconds = _sum(job_tensor_gpus.get(key), step)
        if key in job_energy:  # increases per bucket: joules already
            job.energy_j = float(np.nansum(job_energy[key]))

    unattributed = []
    for key in sorted(set(flops) | set(steps_total)):
        job = jobs.get(key)
        if job is None:
            unattributed.append(key)
            continue
        job.model_flops = flops.get(key, 0.0)
        job.hardware_flops = hw_flops.get(key, job.model_flops)
        job.tokens = tokens.get(key)
        job.steps = steps_total.get(key)
        job.phases = {phase: value for (c, j, phase), value in phases.items() if (c, j) == key}
        job.checkpoint_s = checkpoint.get(key, 0.0)
        job.straggler_wait_s = wait.get(key, 0.0)
        job.flops_series = job_flops.get(key)
        if job.gpus_series is not None and job.gpu_seconds:  # the job's GPUs x their mean peak
            job.peak_series = job.gpus_series * (job.peak_flop_seconds / job.gpu_seconds)
        if job.flops_series is not None and job.peak_series is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                job.mfu_series = np.where(job.peak_series > 0, job.flops_series / (job.peak_series * step), np.nan)
    return jobs, unattributed


def _clusters(results: Results, settings: ReportSettings, window: Window, grid: Grid, spacing: float,
              jobs: dict[tuple[str, str], JobFacts], unattributed: list[tuple[str, str]]) -> dict[str, ClusterFacts]:
    n, step = grid.n, grid.step
    m = results.matrix
    label = settings.cluster_label
    per_bucket = spacing / step  # samples in a bucket -> GPUs on average over it
    gpus = m("gpus", grid, label)
    cover = {key: values * per_bucket for key, values in m("gpu_cover", grid, label).items()}
    allocated = {key: values * per_bucket for key, values in m("alloc_cover", grid, label).items()} \
        or m("allocated", grid, label)
    busy = {key: values * per_bucket for key, values in m("busy_cover", grid, label).items()} or m("busy", grid, label)
    peak = {key: values * per_bucket for key, values in m("peak_cover", grid, label).items()} or m("peak", grid, label)
    energy = m("energy", grid, label)
    energy_total = _covered(results, "energy", "energy_total", grid, label)
    flops = _counted(results, "job_flops", "flops_total", grid, label, "job_id")
    power_avg = results.vector("power_avg", label)
    gpu_samples = _covered(results, "gpu_cover", "gpu_samples", grid, label, scale=spacing)
    peak_samples = _covered(results, "peak_cover", "peak_samples", grid, label, scale=spacing)
    idle_energy = m("idle_energy", grid, label)
    tensor = m("tensor", grid, label)
    tensor_gpus = m("tensor_gpus", grid, label)

    clusters: dict[str, ClusterFacts] = {}
    names = sorted({k[0] for k in (*gpus, *allocated, *energy_total, *power_avg, *gpu_samples)}
                   | {j.cluster for j in jobs.values()} | {c for c, _ in unattributed})
    for name in names:
        key = (name,)
        cf = ClusterFacts(
            name, step, _series(gpus, key, n), _series(allocated, key, n), _series(busy, key, n),
            _series(peak, key, n), energy_series=energy.get(key), tensor=tensor.get(key),
            tensor_gpus=tensor_gpus.get(key), reporting=cover.get(key),
        )
        cf.gpu_seconds = gpu_samples.get(key)
        cf.peak_seconds = peak_samples.get(key)
        members = [j for j in jobs.values() if j.cluster == name]
        cf.allocated_seconds = sum(j.gpu_seconds for j in members)
        if key in energy_total:
            cf.energy_j = energy_total[key]
        elif key in power_avg:
            cf.energy_j = power_avg[key] * (cf.gpu_seconds / max(cf.max_gpus, 1) if cf.gpu_seconds else window.seconds)
            cf.energy_estimated = True
        if key in idle_energy:
            cf.idle_energy_j = float(np.nansum(idle_energy[key]))
        instrumented = [j for j in members if j.instrumented]
        cluster_flops = [v for (c, _), v in flops.items() if c == name]  # unattributed jobs' too
        cf.model_flops = float(sum(cluster_flops)) if cluster_flops else None
        tokens = [j.tokens for j in members if j.tokens is not None]
        cf.tokens = float(sum(tokens)) if tokens else None
        cf.allocated_peak_flop_seconds = sum(j.peak_flop_seconds for j in members)
        cf.instrumented_peak_flop_seconds = sum(j.peak_flop_seconds for j in instrumented)
        cf.allocated_busy_seconds = sum(j.busy_gpu_seconds for j in members)
        clusters[name] = cf
    return clusters


def straggler_wait(arrivals: dict[tuple[str, ...], np.ndarray], steps: dict[tuple[str, ...], np.ndarray],
                   lost: dict[tuple[str, ...], np.ndarray] | None = None,
                   phases: dict[tuple[str, ...], np.ndarray] | None = None) -> dict[tuple[str, str], float]:
    """Rank-seconds each job's ranks waited for slower ranks.

    Where the rules recorded the share of step time lost (`job_id:flopwatch_step_time_lost:ratio`:
    waiting beyond the collective's own time, step by step), a bucket's wait is that share of the
    job's rank-seconds in steps. Elsewhere (a history without the rules) it is what the bucket's
    arrivals show: (slowest rank's arrival - mean rank's) per step x ranks x steps, which misses
    the waits of a slowest rank that changes from step to step."""
    by_job: dict[tuple[str, str], list[np.ndarray]] = {}
    for key, values in arrivals.items():
        by_job.setdefault((key[0], key[1]), []).append(values)
    stepping: dict[tuple[str, str], np.ndarray] = {}
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


def previous(results: Results, settings: ReportSettings, window: Window, grid: Grid, spacing: float) -> Previous:
    """The window before, from the prev_* queries (all None when they did not run or found nothing)."""
    prev = window.previous()
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
    busy = results.matrix("prev_busy", Grid(prev.end, grid.step, grid.n), label)
    peak_seconds = (total("prev_peak_samples") or 0.0) * spacing
    job_peak_seconds = (total("prev_job_peak_samples") or 0.0) * spacing
    energy = total("prev_energy_total")
    return Previous(
        gpu_hours=gpu_hours, allocated_hours=hours("prev_alloc_samples"),
        busy_hours=sum(_sum(v, grid.step) for v in busy.values()) / 3600 if busy else None,
        fleet_mfu=_ratio(flops, peak_seconds), allocated_mfu=_ratio(flops, job_peak_seconds),
        energy_kwh=energy / JOULES_PER_KWH if energy is not None else None, tokens=total("prev_tokens_total"),
    )


def per_group(jobs: Iterable[JobFacts], key: str) -> list[dict[str, float | str | None]]:
    """GPU-hours, busy hours, MFU (instrumented jobs) and energy summed per user or team."""
    groups: dict[str, dict[str, float]] = {}
    for job in jobs:
        name = getattr(job, key) or "(unknown)"
        g = groups.setdefault(name, {"gpu_seconds": 0.0, "busy": 0.0, "flops": 0.0, "peak": 0.0, "energy": 0.0,
                                     "jobs": 0.0, "has_energy": 0.0})
        g["jobs"] += 1
        g["gpu_seconds"] += job.gpu_seconds
        g["busy"] += job.busy_gpu_seconds
        if job.instrumented:
            g["flops"] += job.model_flops or 0.0
            g["peak"] += job.peak_flop_seconds
        if job.energy_j is not None:
            g["energy"] += job.energy_j
            g["has_energy"] = 1.0
    rows = []
    for name, g in sorted(groups.items(), key=lambda item: -item[1]["gpu_seconds"]):
        rows.append({key: name, "jobs": int(g["jobs"]), "gpu_hours": g["gpu_seconds"] / 3600,
                     "busy_gpu_hours": g["busy"] / 3600, "mfu": _ratio(g["flops"], g["peak"]),
                     "energy_kwh": g["energy"] / JOULES_PER_KWH if g["has_energy"] else None})
    return rows
