"""Recommendations written from thresholds (settings.thresholds), each with the numbers behind it.

Ordered by what they cost: GPU-hours at stake first. Nothing here is a guess beyond the figures:
a job at low MFU, GPUs held idle, an unallocated share of the fleet, a job losing goodput to one
cause, a class of lost step time (a slow pipeline stage, scattered imbalance, bad workers), a node
with repeated incidents, a straggler that held a job back.
"""

from __future__ import annotations

from flopwatch.report import steptime
from flopwatch.report.facts import BADPUT_CAUSES, ClusterFacts, Facts, JobFacts
from flopwatch.report.format import fmt
from flopwatch.report.incidents import KIND_NAMES, Incident, Lemon
from flopwatch.report.model import Section
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import format_duration, format_time

ADVICE = {
    "data": "profile its data loader (more workers, prefetching, local caching of the dataset)",
    "checkpoint": "checkpoint asynchronously or less often",
    "straggler": "find and drain the slow GPUs or nodes (see the straggler incidents)",
    "restart": "look at its crashes and hangs, and checkpoint more often to lose less on a restart",
}


def recommendations(facts: Facts, stragglers: list[Incident], lemons: list[Lemon],
                    settings: ReportSettings,
                    step_times: dict[tuple[str, str], steptime.StepTime] | None = None) -> Section:
    step_times = step_times or {}
    advisor = _Advisor(settings)
    for job in facts.ranked_jobs():
        advisor.job(job, step_times.get((job.cluster, job.job_id)))
    for cf in facts.clusters.values():
        advisor.cluster(cf)
    advisor.items += steptime.recommendations(step_times, settings, advisor.enough)
    advisor.lemons(lemons)
    advisor.stragglers(stragglers)
    section = Section("recommendations", "Recommendations",
                      intro="Written from thresholds (settings.thresholds in --config), largest stake first.")
    section.items = [text for _, text in sorted(advisor.items, key=lambda item: -item[0])]
    if advisor.skipped:
        covered = max((cf.covered_hours for cf in facts.clusters.values()), default=0.0)
        section.notes.append(
            f"The data covers {format_duration(covered * 3600)} of this window ({facts.total('gpu_hours') or 0:,.1f} "
            f"GPU-hours): too little for {len(advisor.skipped)} figure(s) to mean something, so they make no "
            f"recommendation (each needs at least {min(advisor.skipped):,.0f} GPU-hours of data; "
            "thresholds.min_gpu_hours sets it).")
    if not section.items:
        section.notes.append("Nothing crossed a threshold in this window.")
    return section


class _Advisor:
    """Collects (GPU-hours at stake, text) recommendations, and the thresholds of figures that
    covered too little GPU time to act on."""

    def __init__(self, settings: ReportSettings) -> None:
        self.settings = settings
        self.t = settings.thresholds
        self.items: list[tuple[float, str]] = []
        self.skipped: list[float] = []

    def money(self, gpu_hours: float) -> str:
        """', about $X' at the configured GPU-hour price, or nothing."""
        if self.settings.price_gpu_hour is None:
            return ""
        return f", about {fmt(gpu_hours * self.settings.price_gpu_hour, 'money', self.settings.currency)}"

    def enough(self, gpu_hours: float, needed: float) -> bool:
        """Whether a figure covers enough GPU time to act on; remembers those that do not."""
        if gpu_hours >= needed:
            return True
        self.skipped.append(needed)
        return False

    def job(self, job: JobFacts, step_time: steptime.StepTime | None) -> None:
        t = self.t
        if job.mfu is not None and job.mfu < t.low_mfu and self.enough(job.gpu_hours, t.min_gpu_hours):
            self.items.append((job.gpu_hours * (t.low_mfu - job.mfu) / t.low_mfu,
                               f"Job {job.job_id} ran at {100 * job.mfu:.0f}% MFU on {job.max_gpus} GPUs for "
                               f"{job.hours:,.0f} h ({job.gpu_hours:,.0f} GPU-hours{self.money(job.gpu_hours)}): "
                               f"below the {100 * t.low_mfu:.0f}% target; profile it (kernels, parallelism, "
                               "batch size)."))
        if not job.instrumented and job.gpu_hours >= t.min_gpu_hours:
            telemetry = f" (telemetry-only estimate {100 * job.telemetry_mfu:.0f}%)" if job.telemetry_mfu else ""
            self.items.append((job.gpu_hours * 0.01,
                               f"Job {job.job_id} used {job.gpu_hours:,.0f} GPU-hours without training telemetry"
                               f"{telemetry}: instrument it with flopwatch.train for exact MFU and goodput."))
        if job.gpu_seconds and job.idle_gpu_hours / job.gpu_hours >= t.idle_share and \
                self.enough(job.gpu_hours, t.min_gpu_hours / 10) and job.idle_gpu_hours >= t.min_gpu_hours / 10:
            self.items.append((job.idle_gpu_hours,
                               f"Job {job.job_id} held GPUs idle for {job.idle_gpu_hours:,.0f} GPU-hours "
                               f"({100 * job.idle_gpu_hours / job.gpu_hours:.0f}% of its allocation"
                               f"{self.money(job.idle_gpu_hours)}): release GPUs it does not use."))
        self._goodput(job, step_time)

    def _goodput(self, job: JobFacts, step_time: steptime.StepTime | None) -> None:
        badput = job.badput()
        if badput is None or job.goodput is None or job.goodput >= self.t.goodput_low or \
                not self.enough(job.gpu_hours, self.t.min_gpu_hours / 10):
            return
        cause = max(BADPUT_CAUSES, key=lambda c: badput[c])
        lost = badput[cause] * job.gpu_hours
        advice = ADVICE[cause]
        if cause == "straggler" and step_time is not None:
            advice = steptime.waiting_advice(step_time, advice)
        self.items.append((lost, f"Job {job.job_id} reached {100 * job.goodput:.0f}% goodput; its largest loss is "
                                 f"{cause} ({100 * badput[cause]:.1f}% of its GPU time, {lost:,.0f} GPU-hours): "
                                 f"{advice}."))

    def cluster(self, cf: ClusterFacts) -> None:
        if cf.gpu_hours and cf.unallocated_hours / cf.gpu_hours >= self.t.idle_share and \
                self.enough(cf.gpu_hours, self.t.min_gpu_hours):
            name = cf.cluster or "The cluster"
            self.items.append((cf.unallocated_hours,
                               f"{name} left {100 * cf.unallocated_hours / cf.gpu_hours:.0f}% of its GPU-hours "
                               f"unallocated ({cf.unallocated_hours:,.0f} GPU-hours"
                               f"{self.money(cf.unallocated_hours)}): schedule more work on them or shrink the "
                               "reservation."))

    def lemons(self, lemons: list[Lemon]) -> None:
        for lemon in lemons:
            kinds = ", ".join(f"{KIND_NAMES.get(k, k)} ×{n}" for k, n in sorted(lemon.kinds.items()))
            self.items.append((1e6 + lemon.occasions, f"Drain node {lemon.node} and run diagnostics: incidents on "
                                                      f"{lemon.occasions} separate occasions ({kinds})."))

    def stragglers(self, incidents: list[Incident]) -> None:
        for incident in incidents:
            if incident.gpu_hours_lost is not None and incident.gpu_hours_lost >= self.t.min_gpu_hours / 10:
                self.items.append((incident.gpu_hours_lost,
                                   f"{incident.node} GPU {incident.gpu} ({incident.cause or 'cause unknown'}) held "
                                   f"job {incident.job_id} back for {format_duration(incident.seconds)} from "
                                   f"{format_time(incident.start)}: about {incident.gpu_hours_lost:,.0f} GPU-hours "
                                   "lost."))
