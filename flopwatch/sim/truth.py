"""Ground truth the simulator writes (`--truth-out`): what really happened, to score detection.

    {"scenario": ..., "jobs": {"llm-70b": {"ranks": 1024, "series": [[t, mfu, goodput], ...],
     "steady_mfu": 0.42, ...}}, "faults": [{"kind", "cause", "node", "gpu", "nic", "rank",
     "job_id", "start", "end", ...}]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
                "mfu": mfu, "goodput": job.productive_s / job.allocated_s if job.allocated_s else 0.0,
                "allocated_seconds": job.allocated_s, "badput_seconds": job.badput_s,
                "series": [[round(t, 3), round(m, 6), round(g, 6)] for t, m, g in job.series],
            }
        return {"scenario": self.scenario, "seed": self.seed, "scrape_interval": self.scrape_interval,
                "gpu_hours": self.gpu_hours, "energy_joules": self.energy_joules, "jobs": jobs,
                "faults": self.faults}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=1))
