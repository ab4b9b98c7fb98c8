"""Interruptions, restarts and their badput scored against the simulator's drawn ones (sim/failures.py).

Per job with drawn interruptions: the rules' onsets (`job_id_cause:flopwatch_interruptions:started`)
against the truth's interruptions (counted exactly when equal; causes compared with the telemetry
cause each drawn one leaves), the rules' mean time to restart (`job_id:flopwatch_restart:seconds`)
against the truth's mean down time, and the badput causes an interruption costs (`restart`,
`lost_progress`, `checkpoint`) in percentage points of truth. `restart` is averaged over the span
goodput is (after the warm-up, whose 5-minute rates overstate it); `lost_progress` and `checkpoint`,
which are nothing in the first minutes in truth and in the rules alike, over the whole run, so that
leaving the warm-up out does not weigh the replays more than the truth does (it read 1.1 pp high on
a run whose rules and truth differ by 1% of the replayed seconds).

Checkpoint economics, from the rules' last samples in the run: the job's mean time between
interruptions (`job_id:flopwatch_mtbi:seconds1w`) against the run's own (its allocated time over
the drawn interruptions, what telemetry can measure) and the scenario's (its failure rate x the
job's GPUs); the recommended interval (`job_id:flopwatch_checkpoint_interval_optimal:seconds`)
against Young/Daly from the scenario's rate and the job's checkpoint cost.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from flopwatch.sim.failures import young_daly

ONSETS = "job_id_cause:flopwatch_interruptions:started"
RESTARTS = "job_id:flopwatch_restart:seconds"
BADPUT = "job_id:flopwatch_badput:ratio"
MTBF = "job_id:flopwatch_mtbi:seconds1w"
INTERVAL = "job_id:flopwatch_checkpoint_interval_optimal:seconds"
#: What the benchmark records for this scoring (added to the engine's observed records).
OBSERVED = (ONSETS, RESTARTS, MTBF, INTERVAL)
BADPUT_CAUSES = ("restart", "lost_progress", "checkpoint")
Observed = list[tuple[dict[str, str], np.ndarray, np.ndarray]]


@dataclass
class InterruptionScore:
    job_id: str
    true_count: int
    rule_count: int
    true_causes: dict[str, int]
    rule_causes: dict[str, int]
    true_restart_s: float | None        # mean seconds from the failure to the first step again
    rule_restart_s: float | None        # mean of the rules' restart records
    badput_error_pp: dict[str, float | None]
    true_mtbf_s: float | None = None    # the run's: allocated seconds over the drawn interruptions
    rate_mtbf_s: float | None = None    # the scenario's failure rate x the job's GPUs, inverted
    rule_mtbf_s: float | None = None    # the rules' last mean time between interruptions
    young_daly_s: float | None = None   # sqrt(2 x checkpoint cost x rate_mtbf_s)
    rule_interval_s: float | None = None  # the rules' last recommended interval

    @property
    def counted_exactly(self) -> bool:
        return self.true_count == self.rule_count

    @property
    def causes_right(self) -> bool:
        return self.true_causes == self.rule_causes

    @property
    def restart_error(self) -> float | None:
        """Relative error of the mean time to restart."""
        return _relative(self.rule_restart_s, self.true_restart_s)

    @property
    def mtbf_error(self) -> float | None:
        """Relative error of the rules' MTBF against the run's own."""
        return _relative(self.rule_mtbf_s, self.true_mtbf_s)

    @property
    def mtbf_rate_error(self) -> float | None:
        """Relative error of the rules' MTBF against the scenario's rate (the draw's luck included)."""
        return _relative(self.rule_mtbf_s, self.rate_mtbf_s)

    @property
    def interval_error(self) -> float | None:
        """Relative error of the recommended interval against Young/Daly from the scenario's truth."""
        return _relative(self.rule_interval_s, self.young_daly_s)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(counted_exactly=self.counted_exactly, causes_right=self.causes_right,
                   restart_error=self.restart_error, mtbf_error=self.mtbf_error,
                   mtbf_rate_error=self.mtbf_rate_error, interval_error=self.interval_error)
        return out


def _relative(rule: float | None, truth: float | None) -> float | None:
    if rule is None or truth is None or not np.isfinite(truth) or truth <= 0:
        return None
    return abs(rule - truth) / truth


def _last(recorded: dict[str, Observed], name: str, job_id: str, span: tuple[float, float]) -> float | None:
    """The rule's newest finite sample for the job in the span."""
    best: tuple[float, float] | None = None
    for labels, t, v in recorded.get(name, []):
        if labels.get("job_id") != job_id:
            continue
        keep = (t >= span[0]) & (t <= span[1]) & np.isfinite(v)
        if keep.any():
            i = int(np.argmax(np.where(keep, t, -np.inf)))
            if best is None or t[i] > best[0]:
                best = (float(t[i]), float(v[i]))
    return None if best is None else best[1]


def _samples(recorded: dict[str, Observed], name: str, job_id: str,
             span: tuple[float, float]) -> list[tuple[dict[str, str], np.ndarray]]:
    return [(labels, v[(t >= span[0]) & (t <= span[1]) & np.isfinite(v)])
            for labels, t, v in recorded.get(name, []) if labels.get("job_id") == job_id]


def _badput_error(recorded: dict[str, Observed], job: dict[str, Any], job_id: str,
                  run: tuple[float, float], span: tuple[float, float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for cause in BADPUT_CAUSES:
        window = span if cause == "restart" else run
        values = [v for labels, v in _samples(recorded, BADPUT, job_id, window) if labels.get("cause") == cause]
        values = [v for v in values if v.size]
        rule = float(np.concatenate(values).mean()) if values else None
        out[cause] = None if rule is None else abs(rule - job.get("badput", {}).get(cause, 0.0)) * 100
    return out


def score_job(job_id: str, job: dict[str, Any], recorded: dict[str, Observed],
              span: tuple[float, float], badput_span: tuple[float, float],
              rate_mtbf_s: float | None = None, save_s: float | None = None) -> InterruptionScore | None:
    """`span`: the job's run (unix seconds) for events; `badput_span`: the one goodput is averaged on;
    `rate_mtbf_s` and `save_s`: the scenario's true MTBF for the job and its checkpoint cost."""
    drawn = job.get("interruptions")
    if not drawn:
        return None
    rule_causes = Counter()
    for labels, values in _samples(recorded, ONSETS, job_id, span):
        rule_causes[labels.get("cause", "none")] += int(values.size)
    restarts = [v for _, v in _samples(recorded, RESTARTS, job_id, span) if v.size]
    rule_restart = float(np.concatenate(restarts).mean()) if restarts else None
    done = [d["restart_seconds"] for d in drawn if d.get("restart_seconds") is not None]
    return InterruptionScore(
        job_id, len(drawn), sum(rule_causes.values()), dict(Counter(d["telemetry_cause"] for d in drawn)),
        dict(rule_causes), float(np.mean(done)) if done else None, rule_restart,
        _badput_error(recorded, job, job_id, span, badput_span),
        true_mtbf_s=job["allocated_seconds"] / len(drawn) if job.get("allocated_seconds") else None,
        rate_mtbf_s=rate_mtbf_s, rule_mtbf_s=_last(recorded, MTBF, job_id, span),
        young_daly_s=young_daly(save_s, rate_mtbf_s) if save_s and rate_mtbf_s else None,
        rule_interval_s=_last(recorded, INTERVAL, job_id, span))


def _worst(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def targets(jobs: list[tuple[dict[str, Any], float | None]]) -> list[tuple[str, str, bool | None]]:
    """The issue's targets over the jobs with drawn interruptions: (their scores as dicts, their
    ETTR error in pp); rows of (what, measured, met) for the suite's summary."""
    if not jobs:
        return []
    exact = sum(bool(score["counted_exactly"]) for score, _ in jobs)
    pp = [ettr for _, ettr in jobs] + [v for score, _ in jobs for v in score["badput_error_pp"].values()]
    worst_pp = _worst(pp)
    mtbf = _worst([score["mtbf_error"] for score, _ in jobs])
    rate = _worst([score["mtbf_rate_error"] for score, _ in jobs])
    interval = _worst([score["interval_error"] for score, _ in jobs])
    return [
        ("interruptions counted exactly per job", f"{exact}/{len(jobs)}", exact == len(jobs)),
        ("ETTR and badput restart, lost_progress, checkpoint within 1 pp of truth (interrupted jobs)",
         "not recorded" if worst_pp is None else f"{worst_pp:.2f} pp worst",
         None if worst_pp is None else worst_pp <= 1.0),
        ("MTBF within 10% of the run's (allocated time over its interruptions)",
         "not recorded" if mtbf is None else f"{mtbf:.1%} worst"
         + ("" if rate is None else f"; {rate:.1%} from the scenario's rate, the draw's luck included"),
         None if mtbf is None else mtbf <= 0.10),
        ("recommended checkpoint interval within 10% of Young/Daly from the scenario's rate and cost",
         "not recorded" if interval is None else f"{interval:.1%} worst",
         None if interval is None else interval <= 0.10),
    ]
