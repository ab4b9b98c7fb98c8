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
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ONSETS = "job_id_cause:flopwatch_interruptions:started"
RESTARTS = "job_id:flopwatch_restart:seconds"
BADPUT = "job_id:flopwatch_badput:ratio"
#: What the benchmark records for this scoring (added to the engine's observed records).
OBSERVED = (ONSETS, RESTARTS)
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

    @property
    def counted_exactly(self) -> bool:
        return self.true_count == self.rule_count

    @property
    def causes_right(self) -> bool:
        return self.true_causes == self.rule_causes

    @property
    def restart_error(self) -> float | None:
        """Relative error of the mean time to restart."""
        if self.true_restart_s is None or self.rule_restart_s is None or self.true_restart_s <= 0:
            return None
        return abs(self.rule_restart_s - self.true_restart_s) / self.true_restart_s

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(counted_exactly=self.counted_exactly, causes_right=self.causes_right,
                   restart_error=self.restart_error)
        return out


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
              span: tuple[float, float], badput_span: tuple[float, float]) -> InterruptionScore | None:
    """`span`: the job's run (unix seconds) for events; `badput_span`: the one goodput is averaged on."""
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
        _badput_error(recorded, job, job_id, span, badput_span))
