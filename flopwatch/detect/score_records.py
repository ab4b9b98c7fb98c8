"""The detection benchmark's scores as records: per fault, per alert episode, per steady MFU
stretch, per job and per scenario. Plain data with the few figures derived from it, kept apart
from the scoring so that the fabric's page counting (fabric_scoring.py) and the scoring
(scoring.py) both read them without importing each other."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class FaultScore:
    index: int
    kind: str
    cause: str
    node: str | None       # None for a switch or an uplink
    target: str            # "gpu 3", "nic mlx5_0", "node", "switch leaf1-r0", "uplink leaf1-r0 spine1", ...
    job_id: str | None
    ranks: int
    slowdown: float
    start: float
    end: float
    step_seconds: float | None
    detected: bool = False
    latency: float | None = None
    detected_by: str | None = None
    causes: list[str] = field(default_factory=list)
    cause_right: bool | None = None
    latency_target: float | None = None
    pages: int | None = None   # incidents at the pager carrying its episodes (None: not counted)

    @property
    def within_target(self) -> bool | None:
        if self.latency_target is None:
            return None
        return self.latency is not None and self.latency <= self.latency_target


@dataclass
class EpisodeScore:
    alertname: str
    labels: dict[str, str]
    fired_at: float        # seconds since scenario start
    resolved_at: float | None
    located: bool
    true: bool
    fault: int | None      # index of the fault it belongs to
    names_culprit: bool


@dataclass
class MfuStretch:
    job_id: str
    start: float
    end: float
    rule: float
    truth: float

    @property
    def error_pp(self) -> float:
        return abs(self.rule - self.truth) * 100


@dataclass
class JobScore:
    job_id: str
    culprit: str                       # truth: worker, stage, scattered or none
    slow_stage: int | None             # truth: the stage a ticket must name
    tickets: list[str]                 # stages named by FlopWatchPipelineImbalance episodes
    pages: int                         # FlopWatchStraggler episodes on this job
    truth: dict[str, float]            # goodput, straggler_badput, lost_share
    rule: dict[str, float | None]
    source: str = "physics"            # "trace": a replayed What-if trace, the study is its truth
    interruptions: dict[str, Any] | None = None   # drawn interruptions scored (detect/interruptions.py)

    @property
    def stage_right(self) -> bool | None:
        """A ticket named the slow stage and none another; for balanced jobs, no ticket."""
        if self.slow_stage is None:
            return not self.tickets
        return bool(self.tickets) and all(t == str(self.slow_stage) for t in self.tickets)

    @property
    def error_pp(self) -> dict[str, float | None]:
        return {k: None if self.rule.get(k) is None else abs(self.rule[k] - v) * 100 for k, v in self.truth.items()}


@dataclass
class ScenarioScore:
    scenario: str
    gpus: int
    duration: float
    gpu_hours: float
    healthy_gpu_hours: float
    faults: list[FaultScore]
    episodes: list[EpisodeScore]
    mfu: list[MfuStretch]
    stats: dict[str, float] = field(default_factory=dict)
    jobs: list[JobScore] = field(default_factory=list)
    fabric: bool = False                    # the scenario has a fabric
    max_pages_per_fault: int | None = None
    false_pages: int | None = None          # incidents carrying no true episode

    @property
    def imbalance_only(self) -> bool:
        """No fault, and some job's lost time is stage or scattered imbalance."""
        return not self.faults and any(j.culprit in ("stage", "scattered") for j in self.jobs)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for job, data in zip(self.jobs, out["jobs"], strict=True):
            data["stage_right"], data["error_pp"] = job.stage_right, job.error_pp
        for fault, data in zip(self.faults, out["faults"], strict=True):
            data["within_target"] = fault.within_target
        for stretch, data in zip(self.mfu, out["mfu"], strict=True):
            data["error_pp"] = stretch.error_pp
        return out
