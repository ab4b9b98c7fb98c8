"""The numbers behind the report, per cluster and per job (report/compute.py fills them in from
the query results).

Every figure counts only the time the samples cover. GPU-hours and the MFU denominator (allocated
GPUs x peak FLOP/s x time) are sample counts per bucket times the measured sample spacing; counters
(FLOPs, tokens, energy, phase seconds) are sums of per-bucket increases, so a bucket without
samples (before the first, after the last, a scrape gap, a Prometheus restart) adds nothing to
either side of a ratio. Ratios are formed last, from those sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from flopwatch.report.window import Grid, Window
from flopwatch.train.wire import ARRIVAL_PHASES

BADPUT_CAUSES = ("data", "checkpoint", "straggler", "restart", "lost_progress")
JOULES_PER_KWH = 3.6e6


def integrate(values: np.ndarray | None, step: float) -> float:
    """Per-bucket rates summed over the buckets x the bucket length (0 without data)."""
    return float(np.nansum(values) * step) if values is not None else 0.0


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None where either is missing or the denominator is 0."""
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
    lost_progress_s: float = 0.0       # step time spent redoing steps after a restart (the rules' record)
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
        return ratio(self.model_flops, self.peak_flop_seconds)

    @property
    def hfu(self) -> float | None:
        return ratio(self.hardware_flops, self.peak_flop_seconds)

    @property
    def telemetry_mfu(self) -> float | None:
        return ratio(self.tensor_gpu_seconds, self.tensor_cover_seconds) if self.tensor_cover_seconds else None

    @property
    def energy_kwh(self) -> float | None:
        return self.energy_j / JOULES_PER_KWH if self.energy_j is not None else None

    @property
    def tokens_per_kwh(self) -> float | None:
        return ratio(self.tokens, self.energy_kwh)

    @property
    def arrival_share(self) -> float:
        """Share of step time spent before the collective (data + compute + other)."""
        total = sum(self.phases.values())
        arrival = sum(self.phases.get(p, 0.0) for p in ARRIVAL_PHASES)
        return arrival / total if total else 1.0

    def badput(self) -> dict[str, float] | None:
        """Fractions of allocated GPU time by cause (the rules' definitions, over the window)."""
        if not self.instrumented or not self.phases or not self.gpu_seconds:
            return None
        stepping = sum(self.phases.values())
        alloc, keep = self.gpu_seconds, 1 - self._replayed_share
        return {
            "data": self.phases.get("data", 0.0) * keep / alloc,
            "checkpoint": self.checkpoint_s / alloc,
            "straggler": self.straggler_wait_s * keep / alloc,
            "restart": max(0.0, 1 - (stepping + self.checkpoint_s) / alloc),
            "lost_progress": stepping * self._replayed_share / alloc,
        }

    @property
    def _replayed_share(self) -> float:
        """Share of the step time that redid steps after a restart (as the rules weight it)."""
        stepping = sum(self.phases.values())
        return min(1.0, self.lost_progress_s / stepping) if stepping else 0.0

    @property
    def goodput(self) -> float | None:
        if not self.instrumented or not self.phases or not self.gpu_seconds:
            return None
        stepping = sum(self.phases.values())
        good = max(0.0, stepping - self.phases.get("data", 0.0) - self.straggler_wait_s)
        return good * (1 - self._replayed_share) / self.gpu_seconds


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
        return (self.gpu_seconds if self.gpu_seconds is not None else integrate(self.gpus, self.step)) / 3600

    @property
    def allocated_hours(self) -> float:
        seconds = self.allocated_seconds if self.allocated_seconds is not None else integrate(self.allocated, self.step)
        return seconds / 3600

    @property
    def busy_hours(self) -> float:
        return integrate(self.busy, self.step) / 3600

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
        return self.peak_seconds if self.peak_seconds is not None else integrate(self.peak, self.step)

    @property
    def fleet_mfu(self) -> float | None:
        """Model FLOPs over every GPU's peak, idle GPUs included."""
        return ratio(self.model_flops, self.peak_flop_seconds)

    @property
    def allocated_mfu(self) -> float | None:
        """Model FLOPs of instrumented jobs over the peak of the GPUs allocated to them."""
        return ratio(self.model_flops, self.instrumented_peak_flop_seconds)

    @property
    def telemetry_mfu(self) -> float | None:
        if self.tensor is None or self.tensor_gpus is None:
            return None
        return ratio(integrate(self.tensor, self.step), integrate(self.tensor_gpus, self.step))

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
        return ratio(flops, self.total("peak_flop_seconds"))

    def allocated_mfu(self) -> float | None:
        return ratio(self.total("model_flops"), self.total("instrumented_peak_flop_seconds"))

    def telemetry_mfu(self) -> float | None:
        num = sum(integrate(c.tensor, c.step) for c in self.clusters.values() if c.tensor is not None)
        den = sum(integrate(c.tensor_gpus, c.step) for c in self.clusters.values() if c.tensor_gpus is not None)
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
                     "busy_gpu_hours": g["busy"] / 3600, "mfu": ratio(g["flops"], g["peak"]),
                     "energy_kwh": g["energy"] / JOULES_PER_KWH if g["has_energy"] else None})
    return rows
