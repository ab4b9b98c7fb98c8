"""The detection suite's summary: precision, recall, cause accuracy, latency, false alerts per
healthy GPU-hour and per-job errors over every scenario's scores, and the targets each is held to
(docs/detection.md). Scoring one scenario is flopwatch/detect/scoring.py."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from flopwatch.detect import interruptions
from flopwatch.detect.fabric_scoring import FABRIC_KINDS, fabric_targets, page_figures
from flopwatch.detect.scoring import (
    IMBALANCE_ALERT,
    JOB_FIGURES,
    SLOW_RANK_KINDS,
    STRAGGLER_ALERT,
    FaultScore,
    JobScore,
    ScenarioScore,
)


# -- the suite ---------------------------------------------------------------------------------
def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Target:
    what: str
    measured: str
    met: bool | None


def _by_kind(faults: list[FaultScore]) -> dict[str, dict[str, Any]]:
    """Per fault kind: how many, detected, cause right, worst pages, median and max latency."""
    kinds: dict[str, dict[str, Any]] = {}
    for f in faults:
        row = kinds.setdefault(f.kind, {"faults": 0, "detected": 0, "cause_right": 0, "latencies": [],
                                        "max_pages": None})
        row["faults"] += 1
        if f.pages is not None:
            row["max_pages"] = max(row["max_pages"] or 0, f.pages)
        if f.detected:
            row["detected"] += 1
            row["cause_right"] += int(bool(f.cause_right))
            row["latencies"].append(f.latency)
    for row in kinds.values():
        lat = row.pop("latencies")
        row["median_latency_s"] = _percentile(lat, 50)
        row["max_latency_s"] = max(lat) if lat else None
    return kinds


#: The field's best (Mycroft: 90% of slow-rank faults named within 15 s), beside each fault's own target.
FAST_S = 15.0
FAST_SHARE = 0.9


def _within(fault: FaultScore, seconds: float) -> bool:
    return fault.latency is not None and fault.latency <= seconds


def _fast(faults: list[FaultScore]) -> str:
    """'17/22, 90th percentile 20 s': how many were named within FAST_S, and the latency FAST_SHARE
    of them were named within (nearest rank; 'missed' where a fault was never named)."""
    if not faults:
        return "none run"
    latencies = sorted(math.inf if f.latency is None else f.latency for f in faults)
    at = latencies[math.ceil(FAST_SHARE * len(latencies)) - 1]
    return (f"{sum(_within(f, FAST_S) for f in faults)}/{len(faults)}, {FAST_SHARE * 100:.0f}th percentile "
            + ("missed" if math.isinf(at) else f"{at:.0f} s"))


def summarize(scores: list[ScenarioScore]) -> dict[str, Any]:
    """The suite's figures and its targets, met or not, over every scenario's scores."""
    faults = [f for s in scores for f in s.faults]
    episodes = [e for s in scores for e in s.episodes]
    located = [e for e in episodes if e.located]
    detected = [f for f in faults if f.detected]
    with_cause = [f for f in detected if f.cause_right is not None]
    false = [e for e in episodes if not e.true and e.alertname != IMBALANCE_ALERT]
    false_straggler = [e for e in false if e.alertname == STRAGGLER_ALERT]
    gpu_hours = sum(s.gpu_hours for s in scores)
    healthy = sum(s.healthy_gpu_hours for s in scores)
    gpu_days = gpu_hours / 24
    mfu = [m for s in scores for m in s.mfu]
    headline = [f for f in faults if f.ranks >= 1024 and f.slowdown <= 0.05 + 1e-9 and f.kind in SLOW_RANK_KINDS]
    targeted = [f for f in faults if f.latency_target is not None and f.kind not in FABRIC_KINDS]
    kinds = _by_kind(faults)
    precision = _ratio(sum(e.true for e in located), len(located))
    recall = _ratio(len(detected), len(faults))
    cause = _ratio(sum(bool(f.cause_right) for f in with_cause), len(with_cause))
    worst_mfu = max((m.error_pp for m in mfu), default=None)
    head_ok = [f.within_target for f in headline]
    targets = [
        Target("5% slow rank in a 1,024-GPU job named within 30 s (3 steps if steps > 10 s)",
               ", ".join(f"{f.latency:.0f} s" if f.latency is not None else "missed" for f in headline) or "none run",
               all(head_ok) if headline else None),
        Target("slow-rank faults named within their latency target",
               f"{sum(bool(f.within_target) for f in targeted)}/{len(targeted)}",
               all(f.within_target for f in targeted) if targeted else None),
        Target(f"{FAST_SHARE:.0%} of slow-rank faults named within {FAST_S:.0f} s", _fast(targeted),
               sum(_within(f, FAST_S) for f in targeted) >= FAST_SHARE * len(targeted) if targeted else None),
        Target("precision >= 0.95", _fmt(precision), None if precision is None else precision >= 0.95),
        Target("recall >= 0.95", _fmt(recall), None if recall is None else recall >= 0.95),
        Target("cause right >= 90% of detections", _fmt(cause), None if cause is None else cause >= 0.90),
        Target(f"zero false straggler alerts over >= 10,000 healthy GPU-hours ({healthy:,.0f} run)",
               str(len(false_straggler)), len(false_straggler) == 0 and healthy >= 10_000),
        Target("job MFU within 0.5 pp of truth in steady state",
               f"{worst_mfu:.2f} pp worst" if worst_mfu is not None else "no steady stretch",
               None if worst_mfu is None else worst_mfu <= 0.5),
    ]
    latencies = [f.latency for f in detected if f.latency is not None]
    jobs = [j for s in scores for j in s.jobs]
    staged = [j for j in jobs if j.slow_stage is not None]
    imbalance_pages = sum(j.pages for s in scores if s.imbalance_only for j in s.jobs)
    worst = _worst_errors([j for j in jobs if j.source != "trace"])
    worst_trace = _worst_errors([j for j in jobs if j.source == "trace"])
    targets += [
        Target("stage-imbalance tickets name the right stage in every pipeline job with a slow stage",
               f"{sum(bool(j.stage_right) for j in staged)}/{len(staged)}",
               all(j.stage_right for j in staged) if staged else None),
        Target("no straggler page in scenarios whose only problem is imbalance", str(imbalance_pages),
               imbalance_pages == 0 if any(s.imbalance_only for s in scores) else None),
        *_job_targets(worst, worst_trace),
        *(Target(*row) for row in fabric_targets(scores)),
        *(Target(*row) for row in interruptions.targets(
            [(j.interruptions, j.error_pp["ettr"]) for j in jobs if j.interruptions])),
    ]
    return {
        **page_figures(scores),
        "stage_tickets_right": _ratio(sum(bool(j.stage_right) for j in staged), len(staged)),
        "imbalance_only_pages": imbalance_pages,
        "job_error_pp_max": worst, "trace_job_error_pp_max": worst_trace,
        "scenarios": len(scores), "faults": len(faults), "detected": len(detected),
        "episodes": len(episodes), "located_episodes": len(located), "false_episodes": len(false),
        "false_straggler_episodes": len(false_straggler),
        "precision": precision, "recall": recall, "cause_accuracy": cause,
        "latency_median_s": _percentile(latencies, 50), "latency_p90_s": _percentile(latencies, 90),
        "latency_max_s": max(latencies) if latencies else None,
        "gpu_hours": gpu_hours, "healthy_gpu_hours": healthy,
        "false_alerts_per_1000_gpu_days": len(false) / gpu_days * 1000 if gpu_days else None,
        "false_straggler_alerts_per_1000_gpu_days": len(false_straggler) / gpu_days * 1000 if gpu_days else None,
        "mfu_error_pp_max": worst_mfu,
        "mfu_error_pp_mean": float(np.mean([m.error_pp for m in mfu])) if mfu else None,
        "by_kind": kinds, "targets": [asdict(t) for t in targets],
    }


def _worst_errors(jobs: list[JobScore]) -> dict[str, float | None]:
    """The largest error (pp) over these jobs of each per-job figure; None where none was recorded."""
    errors = {key: [j.error_pp[key] for j in jobs if j.error_pp[key] is not None] for _, _, key in JOB_FIGURES}
    return {key: max(v) if v else None for key, v in errors.items()}


def _job_targets(worst: dict[str, float | None], trace: dict[str, float | None]) -> list[Target]:
    """Per-job rows: simulated jobs against the simulator's truth, trace jobs against the study."""
    paired = {k: v for k, v in worst.items() if k != "lost_share" and v is not None}
    lost, study = worst["lost_share"], trace["lost_share"]
    return [
        Target("goodput and straggler badput per job within 1 pp of truth (simulated jobs)",
               ", ".join(f"{k} {v:.2f} pp worst" for k, v in paired.items()) or "not recorded",
               max(paired.values()) <= 1.0 if paired else None),
        Target("share of step time lost per job within 5 pp of truth (simulated jobs)",
               f"{lost:.2f} pp worst" if lost is not None else "not recorded",
               None if lost is None else lost <= 5.0),
        Target("share of step time lost within 5 pp of the study (trace jobs)",
               f"{study:.2f} pp worst" if study is not None else "not recorded",
               None if study is None else study <= 5.0),
    ]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"
