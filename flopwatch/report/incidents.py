"""Straggler and hardware incidents, and the nodes that keep having them ("lemon nodes").

Stragglers come from the `ALERTS{alertname="FlopWatchStraggler"}` series when the Prometheus
evaluated the rules over the window (the alert's own `cause`), otherwise from the straggler score
evaluated as a range query over raw counters: a rank whose arrival at the gradient collective
(data + compute + other seconds per step) exceeds its job's median rank by the threshold for at
least `straggler_min_buckets` buckets; its cause is then read from the GPU's and node's telemetry
over the incident. Flagged buckets separated by one quiet bucket belong to the same incident.

Hardware incidents: XIDs and uncorrectable ECC errors counted exactly from the counters (a new
series counts from zero), lost GPUs (`flopwatch_gpu_up` 0), NVLink error bursts (> 1/s), InfiniBand
error bursts (> 120/h) and link-downs, PCIe links below their maximum width.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from flopwatch.report.fetch import Results
from flopwatch.report.window import Grid

#: Cause evidence in priority order, as the straggler rules rank it.
CAUSE_ORDER = ("thermal", "power", "hw_slowdown", "pcie", "nvlink", "nic", "host_cpu", "dataloader", "host_stall")
#: Incidents of one node closer than this are one occasion (an XID and the GPU it loses).
OCCASION_GAP_S = 3600.0
DETAIL_LIMIT = 40
KIND_NAMES = {"straggler": "straggler", "xid": "XID", "ecc": "uncorrectable ECC", "gpu_lost": "GPU lost",
              "nvlink": "NVLink errors", "infiniband": "InfiniBand errors", "pcie": "PCIe downgrade"}


@dataclass
class Incident:
    kind: str                 # straggler, xid, ecc, gpu_lost, nvlink, infiniband, pcie
    cluster: str
    node: str
    start: float
    end: float
    gpus: list[str] = field(default_factory=list)
    device: str = ""          # NIC device/port for InfiniBand incidents
    job_id: str = ""
    ranks: list[str] = field(default_factory=list)
    cause: str = ""
    count: float = 0.0        # XIDs / ECC errors / link-downs in the incident
    code: str = ""            # XID code
    detail: str = ""
    score: float | None = None           # straggler: arrival / job median
    gpu_hours_lost: float | None = None  # straggler: the whole job's waiting
    buckets: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def gpu(self) -> str:
        return ",".join(self.gpus)


def runs(flags: np.ndarray, max_gap: int = 1) -> list[tuple[int, int, int]]:
    """(first, last, flagged count) of runs of True, bridging up to `max_gap` False between."""
    out: list[tuple[int, int, int]] = []
    hits = np.flatnonzero(flags)
    if hits.size == 0:
        return out
    first = last = int(hits[0])
    count = 1
    for hit in hits[1:]:
        i = int(hit)
        if i - last - 1 <= max_gap:
            last, count = i, count + 1
        else:
            out.append((first, last, count))
            first = last = i
            count = 1
    out.append((first, last, count))
    return out


def _span(grid: Grid, first: int, last: int) -> tuple[float, float]:
    return float(grid.times[first] - grid.step), float(grid.times[last])


# -- stragglers -----------------------------------------------------------------------------------
def scores(arrivals: dict[tuple[str, ...], np.ndarray]) -> dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]]:
    """Per rank (keys: cluster, job, rank, ...): its arrival over its job's median rank per bucket
    (NaN where fewer than 8 ranks stepped), and the job's robust spread (1.4826 x MAD) per bucket."""
    by_job: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for key in arrivals:
        by_job.setdefault((key[0], key[1]), []).append(key)
    out = {}
    for keys in by_job.values():
        stack = np.vstack([arrivals[k] for k in keys])
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # buckets where no rank stepped
            median = np.nanmedian(stack, axis=0)
            score = stack / median
            spread = 1.4826 * np.nanmedian(np.abs(score - 1), axis=0)
            ranks = np.isfinite(stack).sum(axis=0)
        for key, row in zip(keys, score, strict=True):
            out[key] = (np.where(ranks >= 8, row, np.nan), spread)
    return out


def stragglers_from_arrivals(results: Results, grid: Grid, label: str, excess: float,
                             min_buckets: int) -> list[Incident]:
    """Incidents where a rank's score exceeds 1 + max(excess, 5 robust sigmas of its job's scores)
    for at least `min_buckets` buckets, in jobs with at least 8 ranks stepping."""
    arrivals = results.matrix("straggler_arrivals", grid, label, "job_id", "rank", "node", "gpu")
    found = []
    for (cluster, job_id, rank, node, gpu), (score, spread) in scores(arrivals).items():
        with np.errstate(invalid="ignore"):
            flags = score > 1 + np.maximum(excess, 5 * np.nan_to_num(spread))
        for first, last, count in runs(flags):
            if count < min_buckets:
                continue
            start, end = _span(grid, first, last)
            window = score[first:last + 1]
            found.append(Incident("straggler", cluster, node, start, end, [gpu], job_id=job_id, ranks=[rank],
                                  score=float(np.nanmean(window[window > 1 + excess])), buckets=count))
    return merge_node_incidents(found)


def stragglers_from_alerts(results: Results, grid: Grid, label: str) -> list[Incident]:
    """Incidents from FlopWatchStraggler alerts; the cause is the alert's (the most frequent one)."""
    matrix = results.matrix("straggler_alerts", grid, label, "job_id", "rank", "node", "gpu", "cause")
    by_rank: dict[tuple[str, ...], dict[str, np.ndarray]] = {}
    for (cluster, job_id, rank, node, gpu, cause), values in matrix.items():
        by_rank.setdefault((cluster, job_id, rank, node, gpu), {})[cause] = np.isfinite(values) & (values > 0)
    found = []
    for (cluster, job_id, rank, node, gpu), causes in by_rank.items():
        flags = np.logical_or.reduce(list(causes.values()))
        for first, last, count in runs(flags):
            window = slice(first, last + 1)
            cause = max(sorted(causes), key=lambda c: int(causes[c][window].sum()))
            start, end = _span(grid, first, last)
            found.append(Incident("straggler", cluster, node, start, end, [gpu], job_id=job_id, ranks=[rank],
                                  cause=cause or "unknown", buckets=count))
    return merge_node_incidents(found)


def merge_node_incidents(incidents: list[Incident]) -> list[Incident]:
    """Ranks of one job on one node that straggle at overlapping times are one incident (a node-wide
    cause such as a stalled data loader slows all of its ranks)."""
    merged: list[Incident] = []
    for incident in sorted(incidents, key=lambda i: (i.cluster, i.job_id, i.node, i.start)):
        last = merged[-1] if merged else None
        if (last is not None and (last.cluster, last.job_id, last.node) == (incident.cluster, incident.job_id,
                                                                             incident.node)
                and incident.start < last.end and incident.cause == last.cause):
            last.end = max(last.end, incident.end)
            last.gpus = sorted(set(last.gpus) | set(incident.gpus), key=_natural)
            last.ranks = sorted(set(last.ranks) | set(incident.ranks), key=_natural)
            last.buckets = max(last.buckets, incident.buckets)
            if incident.score is not None:
                last.score = max(last.score or 0.0, incident.score)
        else:
            merged.append(incident)
    return sorted(merged, key=lambda i: (i.start, i.cluster, i.node))


def _natural(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (math.inf, text)  # type: ignore[return-value]


def classify(signals: dict[str, float]) -> str:
    """The cause a straggler's telemetry points at, strongest evidence first."""
    def over(name: str, threshold: float) -> bool:
        value = signals.get(name)
        return value is not None and math.isfinite(value) and value > threshold

    checks = {
        "thermal": over("thermal", 0.5), "power": over("power", 0.5), "hw_slowdown": over("hw_slowdown", 0.5),
        "pcie": over("pcie", 0.5), "nvlink": over("nvlink", 1.0), "nic": over("nic", 120.0),
        "host_cpu": over("host_cpu", 0.9),
    }
    arrival_excess = signals.get("arrival_rank", math.nan) - signals.get("arrival_median", math.nan)
    for cause, phase in (("dataloader", "data"), ("host_stall", "other")):
        excess = signals.get(f"{phase}_rank", math.nan) - signals.get(f"{phase}_median", math.nan)
        checks[cause] = bool(arrival_excess > 0 and excess > 0.5 * arrival_excess)
    return next((cause for cause in CAUSE_ORDER if checks[cause]), "unknown")


def apply_detail(incident: Incident, signals: dict[str, float], job_gpus: int, arrival_share: float,
                 with_cause: bool) -> None:
    """Score, GPU-hours lost and (score path) cause of a straggler from its detail query.

    Every rank of a synchronous job waits for the straggler: with score s and a share a of the step
    spent before the collective, the job runs (s - 1)·a / (1 + (s - 1)·a) slower than it would."""
    rank, median = signals.get("arrival_rank"), signals.get("arrival_median")
    if rank is not None and median and math.isfinite(rank) and math.isfinite(median):
        incident.score = rank / median
    if with_cause:
        incident.cause = classify(signals)
    if incident.score is not None and job_gpus:
        slow = max(0.0, incident.score - 1) * arrival_share
        incident.gpu_hours_lost = job_gpus * incident.seconds / 3600 * slow / (1 + slow)


# -- hardware -------------------------------------------------------------------------------------
def counter_events(values: np.ndarray, times: np.ndarray) -> list[tuple[float, float]]:
    """(bucket end time, increase) of a cumulative counter sampled per bucket; index 0 is the
    baseline before the window. A series absent at the baseline counts from zero (the driver
    reported its first event with it); a drop is a reset (the new value counts)."""
    events = []
    last = values[0] if math.isfinite(values[0]) else None
    for i in range(1, len(values)):
        value = values[i]
        if not math.isfinite(value):
            continue
        increase = value if last is None or value < last else value - last
        if increase > 0:
            events.append((float(times[i]), float(increase)))
        last = value
    return events


def hardware(results: Results, grid: Grid, label: str) -> list[Incident]:
    found: list[Incident] = []
    base = Grid(grid.end, grid.step, grid.n + 1)   # counter queries carry one baseline bucket
    for (cluster, node, gpu, code), values in results.matrix("xid", base, label, "node", "gpu", "xid").items():
        for t, count in counter_events(values, base.times):
            found.append(Incident("xid", cluster, node, t - grid.step, t, [gpu], count=count, code=code))
    for (cluster, node, gpu), values in results.matrix("ecc", base, label, "node", "gpu").items():
        for t, count in counter_events(values, base.times):
            found.append(Incident("ecc", cluster, node, t - grid.step, t, [gpu], count=count))
    for (cluster, node, gpu), values in results.matrix("lost", grid, label, "node", "gpu").items():
        for first, last, count in runs(np.isfinite(values)):
            start, end = _span(grid, first, last)
            found.append(Incident("gpu_lost", cluster, node, start, end, [gpu], buckets=count))
    for (cluster, node, gpu), values in results.matrix("nvlink_bad", grid, label, "node", "gpu").items():
        for first, last, count in runs(np.isfinite(values)):
            start, end = _span(grid, first, last)
            peak = float(np.nanmax(values[first:last + 1]))
            found.append(Incident("nvlink", cluster, node, start, end, [gpu], buckets=count,
                                  detail=f"up to {peak:.1f} errors/s"))
    errors = results.matrix("ib_bad", grid, label, "node", "device", "port")
    downs = results.matrix("ib_down", grid, label, "node", "device", "port")
    for key in sorted(set(errors) | set(downs)):
        cluster, node, device, port = key
        err = errors.get(key, np.full(grid.n, np.nan))
        down = downs.get(key, np.full(grid.n, np.nan))
        for first, last, count in runs(np.isfinite(err) | np.isfinite(down)):
            start, end = _span(grid, first, last)
            window = slice(first, last + 1)
            parts = []
            if np.isfinite(err[window]).any():
                rate = float(np.nanmax(err[window])) * 3600 / grid.step
                parts.append(f"up to {rate:,.0f} errors/h")
            flaps = float(np.nansum(down[window]))
            if flaps > 0:
                parts.append(f"link down {round(flaps):d}x")
            found.append(Incident("infiniband", cluster, node, start, end, device=f"{device}:{port}",
                                  count=round(flaps), buckets=count, detail=", ".join(parts)))
    for (cluster, node, gpu), values in results.matrix("pcie_bad", grid, label, "node", "gpu").items():
        for first, last, count in runs(np.isfinite(values)):
            start, end = _span(grid, first, last)
            found.append(Incident("pcie", cluster, node, start, end, [gpu], buckets=count,
                                  detail="link narrower than its maximum width"))
    return sorted(found, key=lambda i: (i.start, i.cluster, i.node, i.kind))


# -- lemon nodes ----------------------------------------------------------------------------------
@dataclass
class Lemon:
    cluster: str
    node: str
    occasions: int
    kinds: dict[str, int]
    gpus: list[str]
    first: float
    last: float


def occasions(incidents: list[Incident]) -> list[list[Incident]]:
    """Incidents of one node grouped into occasions (closer than OCCASION_GAP_S)."""
    groups: list[list[Incident]] = []
    end = -math.inf
    for incident in sorted(incidents, key=lambda i: i.start):
        if groups and incident.start - end <= OCCASION_GAP_S:
            groups[-1].append(incident)
        else:
            groups.append([incident])
            end = -math.inf
        end = max(end, incident.end)
    return groups


def lemons(incidents: list[Incident], threshold: int) -> list[Lemon]:
    by_node: dict[tuple[str, str], list[Incident]] = {}
    for incident in incidents:
        by_node.setdefault((incident.cluster, incident.node), []).append(incident)
    out = []
    for (cluster, node), items in by_node.items():
        groups = occasions(items)
        if len(groups) < threshold:
            continue
        kinds: dict[str, int] = {}
        for incident in items:
            kinds[incident.kind] = kinds.get(incident.kind, 0) + 1
        gpus = sorted({g for i in items for g in i.gpus}, key=_natural)
        out.append(Lemon(cluster, node, len(groups), kinds, gpus, min(i.start for i in items),
                         max(i.end for i in items)))
    return sorted(out, key=lambda lemon: (-lemon.occasions, lemon.cluster, lemon.node))
