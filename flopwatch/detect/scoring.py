"""Scoring alerts against the simulator's ground truth (flopwatch/sim/truth.py).

Definitions (docs/detection.md says the same for users):

- An alert *episode* is one firing of one label set, from its first firing evaluation.
- A *located* episode carries a `node` label. It is true when a fault on that node was active at
  its first firing, or ended at most GRACE_S before, and it does not point elsewhere: a `gpu` label
  must be the faulty GPU's (GPU faults), a `device` label the faulty NIC's (NIC faults). Otherwise
  it is false. Job-level episodes (no `node`) are true when a fault of their job (any job, without
  a `job_id` label) was active then.
- Fabric faults: an episode with a `switch` label and no `node` is located at that switch. It is
  true, and names it, when a switch or uplink fault on that switch was active (an `uplink` label
  must be the fault's uplink; without one it names an uplink fault by its leaf). Per-port and node
  episodes on the ports under a faulted switch are true symptoms that name nothing; a cable fault
  is named by a per-port episode on its node and NIC. Job-level episodes are true while a fault
  that slows their job is on.
- Pages: the episodes through the shipped Alertmanager config (pages.py): per fault, the
  incidents at the pager receivers that carried one of its episodes; a run's worst is
  `max_pages_per_fault`; incidents carrying no true episode are false pages.
- A fault is *detected* when a true located episode *names* it: node and GPU for GPU faults, node
  and NIC for NIC faults, the node for node faults. Latency runs from the fault's start to that
  episode's first firing. The cause is right when the culprit-naming episodes of that first firing
  step carry the fault's cause (the `cause` label, else the one the alert name implies).
- Precision = true located episodes / located episodes; recall = detected faults / faults.
- Healthy GPU-hours are a job's GPU-hours outside every fault window (+GRACE_S) of that job; false
  alerts are counted per 1,000 GPU-days of all allocated GPU time.
- MFU error compares `job_id:flopwatch_mfu:ratio` with the true MFU, each averaged over the same
  steady stretch (job running, WARMUP_S after its start, no fault window), per stretch of at least
  MIN_STEADY_S.
- Pipeline-stage imbalance: FlopWatchPipelineImbalance is a ticket, scored apart from pages: in a
  job whose truth names a slow stage, some ticket must fire and every ticket must name that stage;
  in a job with none, any ticket is wrong. It never counts as a false alert.
- Per job (`jobs` of a scenario): the rules' goodput, straggler badput and share of step time lost,
  each averaged over the job's run after WARMUP_S + RATE_WINDOW_S, against the simulator's truth
  over the whole run (errors in percentage points), with the truth's culprit class. Simulated jobs
  are held to 1 pp (goodput, straggler badput) and 5 pp (share lost) of truth; replayed What-if
  traces, whose truth is the study's, to 5 pp of the study's share lost (its 1 - 1/S).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from flopwatch.detect import interruptions
from flopwatch.detect.alerts import Episode
from flopwatch.detect.fabric_scoring import (
    FABRIC_KINDS,
    FABRIC_LATENCY_TARGET_S,
    count_pages,
    fabric_target,
    fabric_targets,
    job_hit,
    page_figures,
    port_match,
    switch_match,
)
from flopwatch.detect.pages import AlertmanagerConfig
from flopwatch.sim.scenario import Scenario

GRACE_S = 600.0
WARMUP_S = 120.0
MIN_STEADY_S = 600.0
#: Faults whose symptom is one slow rank or node: the straggler latency target applies.
SLOW_RANK_KINDS = {"thermal_throttle", "power_cap", "hw_slowdown", "pcie_downgrade", "host_cpu_contention",
                   "dataloader_stall", "gc_pause"}
STRAGGLER_ALERT = "FlopWatchStraggler"
IMBALANCE_ALERT = "FlopWatchPipelineImbalance"
RATE_WINDOW_S = 300.0
#: Recorded series scored per job: (name, label filter, truth field).
JOB_FIGURES = (("job_id:flopwatch_goodput:ratio", {}, "goodput"),
               ("job_id:flopwatch_badput:ratio", {"cause": "straggler"}, "straggler_badput"),
               ("job_id:flopwatch_step_time_lost:ratio", {}, "lost_share"),
               ("job_id:flopwatch_ettr:ratio", {}, "ettr"))
LATENCY_TARGET_S = 30.0
LONG_STEP_S = 10.0
LONG_STEP_TARGET_STEPS = 3
#: The cause an alert implies by its name, when it carries no `cause` label.
CAUSE_OF_ALERT = {
    "FlopWatchGpuXidCritical": "xid", "FlopWatchGpuXid": "xid", "FlopWatchGpuLost": "gpu_lost",
    "FlopWatchGpuEccUncorrected": "xid", "FlopWatchGpuRowRemapFailure": "xid",
    "FlopWatchNvlinkErrors": "nvlink", "FlopWatchPcieDegraded": "pcie", "FlopWatchIbSymbolErrors": "nic",
    "FlopWatchIbLinkDowned": "nic", "FlopWatchIbLinkFlapping": "nic", "FlopWatchUplinkDegraded": "congestion",
}
GPU_LOST_XID = "79"
#: FlopWatchGpuThrottled's `reason` label -> cause.
THROTTLE_CAUSE = {"sw_thermal": "thermal", "hw_thermal": "thermal", "sw_power_cap": "power",
                  "hw_power_brake": "power", "hw_slowdown": "hw_slowdown"}


def alert_cause(episode: Episode) -> str | None:
    labels = episode.labels
    if "cause" in labels:
        return labels["cause"]
    if episode.alertname == "FlopWatchGpuThrottled":
        return THROTTLE_CAUSE.get(labels.get("reason", ""))
    if labels.get("xid") == GPU_LOST_XID:
        return "gpu_lost"  # XID 79: the GPU has fallen off the bus
    return CAUSE_OF_ALERT.get(episode.alertname)


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


# -- matching ----------------------------------------------------------------------------------
def _matches(fault: dict[str, Any], labels: dict[str, str]) -> tuple[bool, bool]:
    """(consistent with this fault's culprit, names it) for a located episode on the fault's node."""
    if fault["gpu"] is not None:
        if "gpu" in labels and labels["gpu"] != "":
            same = labels["gpu"] == str(fault["gpu"])
            return same, same
        return "device" not in labels, False
    if fault["nic"] is not None:
        if "device" in labels:
            same = labels["device"] == fault["device"]
            return same, same
        return True, False
    return True, True


def _in_window(fault: dict[str, Any], t: float) -> bool:
    return fault["start"] <= t <= fault["end"] + GRACE_S


def classify(episode: Episode, faults: list[dict[str, Any]], start_unix: float) -> EpisodeScore:
    t = episode.fired_at - start_unix
    resolved = episode.resolved_at - start_unix if episode.resolved_at is not None else None
    labels = episode.labels
    node = labels.get("node")
    if node is None and "switch" in labels:
        best = None
        for fault in faults:
            consistent, names = switch_match(fault, labels) if _in_window(fault, t) else (False, False)
            if consistent and (best is None or (names and not best[0])):
                best = (names, fault)
        return EpisodeScore(episode.alertname, labels, t, resolved, True, best is not None,
                            best[1]["index"] if best else None, bool(best and best[0]))
    if node is None:
        job = labels.get("job_id")
        hit = next((f for f in faults if _in_window(f, t) and job_hit(f, job)), None)
        return EpisodeScore(episode.alertname, labels, t, resolved, False, hit is not None,
                            hit["index"] if hit else None, False)
    best: tuple[bool, dict[str, Any]] | None = None
    for fault in faults:
        if not _in_window(fault, t):
            continue
        if fault["node"] is None:
            consistent, names = port_match(fault, labels)
        elif fault["node"] != node:
            continue
        else:
            consistent, names = _matches(fault, labels)
        if consistent and (best is None or (names and not best[0])):
            best = (names, fault)
    if best is None:
        return EpisodeScore(episode.alertname, labels, t, resolved, True, False, None, False)
    names, fault = best
    return EpisodeScore(episode.alertname, labels, t, resolved, True, True, fault["index"], names)


def _fault_score(fault: dict[str, Any], truth: dict[str, Any]) -> FaultScore:
    job = truth["jobs"].get(fault["job_id"]) if fault["job_id"] else None
    step = job["allocated_seconds"] / job["steps"] if job and job["steps"] else None
    target = f"gpu {fault['gpu']}" if fault["gpu"] is not None else (
        f"nic {fault['device']}" if fault["nic"] is not None else "node")
    if fault["kind"] in FABRIC_KINDS:
        target = fabric_target(fault)
    score = FaultScore(fault["index"], fault["kind"], fault["cause"], fault["node"], target, fault["job_id"],
                       job["ranks"] if job else 0, fault["slowdown"], fault["start"], fault["end"], step)
    if fault["kind"] in FABRIC_KINDS:
        score.latency_target = FABRIC_LATENCY_TARGET_S
    if fault["kind"] in SLOW_RANK_KINDS:
        score.latency_target = LATENCY_TARGET_S
        if step is not None and step > LONG_STEP_S:
            score.latency_target = LONG_STEP_TARGET_STEPS * step
    return score


def score_faults(truth: dict[str, Any], episodes: list[EpisodeScore]) -> list[FaultScore]:
    scores = []
    for fault in truth["faults"]:
        score = _fault_score(fault, truth)
        naming = sorted((e for e in episodes if e.true and e.names_culprit and e.fault == fault["index"]),
                        key=lambda e: e.fired_at)
        if naming:
            first = naming[0].fired_at
            score.detected = True
            score.latency = first - fault["start"]
            at_first = [e for e in naming if e.fired_at == first]
            score.detected_by = at_first[0].alertname
            causes = [alert_cause(Episode(e.alertname, e.labels, 0, 0)) for e in at_first]
            score.causes = sorted({c for c in causes if c})
            score.cause_right = fault["cause"] in score.causes
        scores.append(score)
    return scores


# -- GPU-hours and MFU -------------------------------------------------------------------------
def _job_span(scenario: Scenario, job_id: str) -> tuple[float, float]:
    spec = next(job for job in scenario.jobs if job.id == job_id)
    return spec.start, spec.end if spec.end is not None else scenario.duration


def _windows(truth: dict[str, Any], job_id: str) -> list[tuple[float, float]]:
    """Fault windows (plus GRACE_S) and the steps a job did again after a restart (plus one rate
    window): the truth's MFU counts only progress, the rules' the FLOPs the GPUs ran, so a replay
    is no steady stretch to compare them on (its cost is scored as goodput instead)."""
    faults = [(f["start"], f["end"] + GRACE_S) for f in truth["faults"]
              if f["job_id"] == job_id or job_id in (f.get("jobs") or ())]
    replays = [(a, b + RATE_WINDOW_S) for a, b in truth["jobs"].get(job_id, {}).get("replays", [])]
    return sorted(faults + replays)


def _subtract(span: tuple[float, float], holes: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    pieces = [span]
    for lo, hi in holes:
        nxt = []
        for a, b in pieces:
            if hi <= a or lo >= b:
                nxt.append((a, b))
                continue
            if lo > a:
                nxt.append((a, lo))
            if hi < b:
                nxt.append((hi, b))
        pieces = nxt
    return pieces


def healthy_gpu_hours(scenario: Scenario, truth: dict[str, Any]) -> float:
    total = 0.0
    for job_id, job in truth["jobs"].items():
        span = _job_span(scenario, job_id)
        healthy = _subtract(span, _windows(truth, job_id))
        total += job["ranks"] * sum(b - a for a, b in healthy) / 3600
    return total


def mfu_stretches(scenario: Scenario, truth: dict[str, Any], observed: list[tuple[dict[str, str], np.ndarray,
                                                                                  np.ndarray]],
                  start_unix: float) -> list[MfuStretch]:
    stretches = []
    for job_id, job in truth["jobs"].items():
        parts = [(t, v) for labels, t, v in observed if labels.get("job_id") == job_id]
        if not parts or not job["series"]:
            continue
        rule_t = np.concatenate([t for t, _ in parts]) - start_unix
        rule_v = np.concatenate([v for _, v in parts])
        series = np.asarray(job["series"], dtype=float)
        truth_t, truth_v = series[:, 0], series[:, 1]
        begin, end = _job_span(scenario, job_id)
        for a, b in _subtract((begin + WARMUP_S, end), _windows(truth, job_id)):
            if b - a < MIN_STEADY_S:
                continue
            in_rule = (rule_t >= a) & (rule_t <= b) & np.isfinite(rule_v)
            in_truth = (truth_t > a - 60) & (truth_t <= b)
            if not in_rule.any() or not in_truth.any():
                continue
            stretches.append(MfuStretch(job_id, a, b, float(rule_v[in_rule].mean()), float(truth_v[in_truth].mean())))
    return stretches


Observed = list[tuple[dict[str, str], np.ndarray, np.ndarray]]


def _rule_mean(recorded: dict[str, Observed], name: str, match: dict[str, str], job_id: str,
               span: tuple[float, float]) -> float | None:
    values = [v[(t >= span[0]) & (t <= span[1]) & np.isfinite(v)] for labels, t, v in recorded.get(name, [])
              if labels.get("job_id") == job_id and all(labels.get(k) == x for k, x in match.items())]
    values = [v for v in values if v.size]
    return float(np.concatenate(values).mean()) if values else None


def job_scores(scenario: Scenario, truth: dict[str, Any], episodes: list[EpisodeScore],
               recorded: dict[str, Observed], start_unix: float) -> list[JobScore]:
    """Per job: stage tickets and pages, and the rules' goodput and waste against truth."""
    out = []
    for job_id, job in truth["jobs"].items():
        if "goodput" not in job:
            continue
        begin, end = _job_span(scenario, job_id)
        span = (start_unix + begin + WARMUP_S + RATE_WINDOW_S, start_unix + end)
        lost = job.get("lost", {"culprit": "none", "share": 0.0})
        badput = job.get("badput", {})
        true_figures = {"goodput": job["goodput"], "straggler_badput": badput.get("straggler", 0.0),
                        "lost_share": lost["share"], "ettr": job.get("ettr", job["goodput"])}
        rule = {key: _rule_mean(recorded, name, match, job_id, span) for name, match, key in JOB_FIGURES}
        mine = [e for e in episodes if e.labels.get("job_id") == job_id]
        out.append(JobScore(job_id, lost["culprit"], job.get("slow_stage"),
                            sorted(e.labels.get("stage", "") for e in mine if e.alertname == IMBALANCE_ALERT),
                            sum(e.alertname == STRAGGLER_ALERT for e in mine), true_figures, rule,
                            job.get("source", "physics"), _interruptions(job_id, job, recorded, start_unix,
                                                                        (begin, end), span)))
    return out


def _interruptions(job_id: str, job: dict[str, Any], recorded: dict[str, Observed], start_unix: float,
                   run: tuple[float, float], span: tuple[float, float]) -> dict[str, Any] | None:
    score = interruptions.score_job(job_id, job, recorded, (start_unix + run[0], start_unix + run[1]), span)
    return None if score is None else score.as_dict()


def score_scenario(scenario: Scenario, truth: dict[str, Any], episodes: list[Episode], start_unix: float,
                   observed: list[tuple[dict[str, str], np.ndarray, np.ndarray]] | None = None,
                   stats: dict[str, float] | None = None,
                   recorded: dict[str, Observed] | None = None,
                   alertmanager: AlertmanagerConfig | None = None) -> ScenarioScore:
    classified = [classify(e, truth["faults"], start_unix) for e in episodes]
    score = ScenarioScore(
        scenario=scenario.name, gpus=scenario.fleet.nodes * scenario.fleet.gpus_per_node,
        duration=scenario.duration, gpu_hours=truth["gpu_hours"],
        healthy_gpu_hours=healthy_gpu_hours(scenario, truth), faults=score_faults(truth, classified),
        episodes=classified, mfu=mfu_stretches(scenario, truth, observed or [], start_unix), stats=stats or {},
        jobs=job_scores(scenario, truth, classified, recorded or {}, start_unix),
        fabric=scenario.fabric is not None,
    )
    if alertmanager is not None:
        count_pages(score, alertmanager, until=score.duration + GRACE_S)
    return score


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


def summarize(scores: list[ScenarioScore]) -> dict[str, Any]:
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
