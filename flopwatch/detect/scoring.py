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

from collections.abc import Iterable
from typing import Any

import numpy as np

from flopwatch.detect import interruptions
from flopwatch.detect.alerts import Episode
from flopwatch.detect.fabric_scoring import (
    FABRIC_KINDS,
    FABRIC_LATENCY_TARGET_S,
    count_pages,
    fabric_target,
    job_hit,
    port_match,
    switch_match,
)
from flopwatch.detect.pages import AlertmanagerConfig
from flopwatch.detect.score_records import EpisodeScore, FaultScore, JobScore, MfuStretch, ScenarioScore
from flopwatch.sim.scenario import Scenario

GRACE_S = 600.0
WARMUP_S = 120.0
MIN_STEADY_S = 600.0
#: Faults whose symptom is one slow rank or node: the straggler latency target applies.
SLOW_RANK_KINDS = {"thermal_throttle", "power_cap", "hw_slowdown", "pcie_downgrade", "host_cpu_contention",
                   "dataloader_stall", "gc_pause", "silent_slowdown"}
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
    "FlopWatchSpineDegraded": "congestion",
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
                            job.get("source", "physics"), _interruptions(scenario, job_id, job, recorded,
                                                                        start_unix, (begin, end), span)))
    return out


def _interruptions(scenario: Scenario, job_id: str, job: dict[str, Any], recorded: dict[str, Observed],
                   start_unix: float, run: tuple[float, float], span: tuple[float, float]) -> dict[str, Any] | None:
    spec = next(j for j in scenario.jobs if j.id == job_id)
    rate = scenario.failures.per_gpu_hour * len(spec.nodes) * scenario.fleet.gpus_per_node \
        if scenario.failures is not None else 0.0
    score = interruptions.score_job(job_id, job, recorded, (start_unix + run[0], start_unix + run[1]), span,
                                    rate_mtbf_s=3600.0 / rate if rate > 0 else None, save_s=spec.checkpoint_seconds)
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
