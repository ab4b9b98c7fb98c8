"""Ground truth the simulator writes (`--truth-out`): what really happened, to score detection.

    {"scenario": ..., "jobs": {"llm-70b": {"ranks": 1024, "series": [[t, mfu, goodput], ...],
     "steady_mfu": 0.42, "lost": {"culprit": "stage", "share": 0.15, "by_class": {"worker": ...,
     "stage": ..., "scattered": ...}}, ...}}, "faults": [{"kind", "cause", "node", "gpu", "nic", "rank",
     "job_id", "start", "end", ...}]}

The share of step time lost is FlopWatch's operational definition, the one its rules measure and
the straggler badput truth counts: per step, the mean over ranks of the time waited beyond the
collective's own (max(arrival) - mean(arrival)), over the job's productive step time. Its classes
(jobs.py) are what removing in turn the faults' slowdowns (worker) and the stage weights (stage)
takes away from it; the rest is scattered (jitter, sequence lengths). The culprit is the largest
class, "none" below CULPRIT_MIN_SHARE. docs/detection.md says why the simulator's own jobs do not
use an "every rank at its typical compute" ideal.

A trace job (`source: "trace"`) takes the What-if study's analysis as its truth: per step, straggler
badput and lost seconds wall x (1 - 1/S_step), so goodput follows; classes by the study's M_W and
M_S; and when M_W says one worker is at fault, a `trace_worker` fault record naming it (cause
unknown, for the whole job).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOST_CLASSES = ("worker", "stage", "scattered")
#: Below this share of step time lost, a job has no culprit class.
CULPRIT_MIN_SHARE = 0.01


@dataclass
class JobTruth:
    ranks: int
    peak_flops: float
    target_mfu: float
    flops_per_step: float
    series: list[tuple[float, float, float]] = field(default_factory=list)  # (t, mfu, goodput)
    model_flops: float = 0.0
    allocated_s: float = 0.0
    productive_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    lost_steps: int = 0
    replays: list[list[float]] = field(default_factory=list)   # [start, end] of steps done again
    stages: int = 1
    slow_stage: int | None = None  # the stage a pipeline-imbalance ticket must name (None: balanced)
    source: str = "physics"        # "trace": a replayed What-if trace, whose truth is the study's
    actual_s: float = 0.0          # step time of productive steps
    lost_s: float = 0.0            # of it, time lost to waiting for slower ranks
    lost_class_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOST_CLASSES, 0.0))
    interruptions: list[dict[str, Any]] = field(default_factory=list)   # drawn ones that restarted

    def observe_step(self, wall: float, lost: float, lost_by_class: dict[str, float]) -> None:
        self.actual_s += wall
        self.lost_s += min(wall, max(0.0, lost))
        for cls, seconds in lost_by_class.items():
            self.lost_class_s[cls] += seconds

    def lost(self) -> dict[str, Any]:
        """Share of step time lost, per class, and the culprit class."""
        if self.actual_s <= 0:
            return {"culprit": "none", "share": 0.0, "by_class": dict.fromkeys(LOST_CLASSES, 0.0)}
        share = float(self.lost_s / self.actual_s)
        by_class = {cls: float(seconds / self.actual_s) for cls, seconds in self.lost_class_s.items()}
        culprit = max(by_class, key=by_class.get) if share >= CULPRIT_MIN_SHARE else "none"
        return {"culprit": culprit, "share": share, "by_class": by_class}

    def note_replay(self, start: float, end: float) -> None:
        """A step done again after a restart; consecutive ones form one interval."""
        if self.replays and start - self.replays[-1][1] < 1e-6 + 60.0:
            self.replays[-1][1] = end
        else:
            self.replays.append([start, end])

    def add_badput(self, cause: str, seconds: float) -> None:
        if seconds > 0:
            self.badput_s[cause] = self.badput_s.get(cause, 0.0) + seconds


@dataclass
class Truth:
    scenario: str
    seed: int
    scrape_interval: float
    jobs: dict[str, JobTruth] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    gpu_hours: float = 0.0
    energy_joules: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        jobs = {}
        for job_id, job in self.jobs.items():
            mfu = job.model_flops / (job.allocated_s * job.ranks * job.peak_flops) if job.allocated_s else 0.0
            jobs[job_id] = {
                "ranks": job.ranks, "target_mfu": job.target_mfu, "peak_flops": job.peak_flops,
                "flops_per_step": job.flops_per_step, "steps": job.steps, "lost_steps": job.lost_steps,
                "replays": [[round(a, 3), round(b, 3)] for a, b in job.replays],
                "mfu": mfu, "goodput": job.productive_s / job.allocated_s if job.allocated_s else 0.0,
                "allocated_seconds": job.allocated_s, "step_seconds": job.actual_s, "badput_seconds": job.badput_s,
                "badput": {c: s / job.allocated_s for c, s in job.badput_s.items()} if job.allocated_s else {},
                "stages": job.stages, "slow_stage": job.slow_stage, "source": job.source, "lost": job.lost(),
                "ettr": job.actual_s / job.allocated_s if job.allocated_s else 0.0,
                "interruptions": job.interruptions,
                "series": [[round(t, 3), round(m, 6), round(g, 6)] for t, m, g in job.series],
            }
        return {"scenario": self.scenario, "seed": self.seed, "scrape_interval": self.scrape_interval,
                "gpu_hours": self.gpu_hours, "energy_joules": self.energy_joules, "jobs": jobs,
                "faults": self.faults}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=1))
