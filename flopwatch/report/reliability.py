"""The report's interruptions and checkpoints section: ETTR, interruptions by cause, MTBF, time to
restart and lost progress per job, and per job the checkpoint interval that would waste least.

Interruptions, restarts, ETTR and lost progress are the rules' results (alerts/flopwatch-
interruptions.yml, flopwatch-goodput.yml) over the window; a backfilled history has none, and the
section says so. Checkpoint saves come from rank 0's raw save counter (its changes count saves).

Checkpoint advice is Young/Daly's first-order optimum: with a save costing C seconds and a mean
time between failures M, checkpointing every tau seconds wastes C/tau of the time in saves and,
per failure, tau/2 on average in steps done again, so the waste W(tau) = C/tau + tau/(2M) (plus a
restart cost that does not depend on tau) is least at tau* = sqrt(2 C M), and the goodput gained by
moving there is W(tau) - W(tau*). It assumes failures at a constant rate (exponential), blocking
saves, C << tau << M, and that a restart resumes from the last completed save.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flopwatch.report.facts import Facts, ratio
from flopwatch.report.fetch import Results
from flopwatch.report.model import Column, Figure, Section, Table
from flopwatch.report.queries import Query, QueryBuilder
from flopwatch.report.sections import cluster_name, failed_notes

ONSETS = "job_id_cause:flopwatch_interruptions:started"
RESTARTS = "job_id:flopwatch_restart:seconds"
#: Pauses that were a checkpoint save longer than the threshold: their onsets (cause none) are no interruption.
SAVE_PAUSES = "job_id:flopwatch_checkpoint_pause:seconds"
ETTR = "job_id:flopwatch_ettr:ratio"
LOST = 'job_id:flopwatch_badput:ratio{cause="lost_progress"}'
SAVES = 'flopwatch_train_checkpoint_seconds_total{kind="save", rank="0"}'
#: A job's own interruptions stand in for the cluster's rate from this many on.
OWN_MTBF_MIN = 3
QUERY_NAMES = ("int_onsets", "int_save_pauses", "int_restart_sum", "int_restart_count", "int_ettr", "int_lost",
               "ckpt_seconds", "ckpt_saves")


def queries(promql: QueryBuilder) -> list[Query]:
    """Instant queries at the window's end over the whole window."""
    w, by = promql.span, promql.by
    at = promql.window.end
    specs = [
        ("int_onsets", "interruptions", f"sum by ({by('job_id', 'cause')}) (count_over_time({ONSETS}[{w}]))"),
        ("int_save_pauses", "checkpoint pauses", f"sum by ({by('job_id')}) (count_over_time({SAVE_PAUSES}[{w}]))"),
        ("int_restart_sum", "restart times", f"sum by ({by('job_id')}) (sum_over_time({RESTARTS}[{w}]))"),
        ("int_restart_count", "restarts", f"sum by ({by('job_id')}) (count_over_time({RESTARTS}[{w}]))"),
        ("int_ettr", "ETTR", f"max by ({by('job_id')}) (avg_over_time({ETTR}[{w}]))"),
        ("int_lost", "lost progress", f"max by ({by('job_id')}) (avg_over_time({LOST}[{w}]))"),
        ("ckpt_seconds", "checkpoint save seconds", f"max by ({by('job_id')}) (increase({SAVES}[{w}]))"),
        ("ckpt_saves", "checkpoint saves", f"max by ({by('job_id')}) (changes({SAVES}[{w}]) - resets({SAVES}[{w}]))"),
    ]
    return [Query(name, title, expr, at=at) for name, title, expr in specs]


def young_daly(save_s: float | None, mtbf_s: float | None) -> float | None:
    """sqrt(2 x C x MTBF), None without both."""
    return math.sqrt(2 * save_s * mtbf_s) if save_s and mtbf_s else None


def waste(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """First-order share of time lost to saves and to steps redone after failures: C/tau + tau/2M."""
    return save_s / interval_s + interval_s / (2 * mtbf_s)


@dataclass
class JobReliability:
    cluster: str
    job_id: str
    gpus: int
    hours: float                            # hours it held its GPUs in the window
    interruptions: dict[str, int] = field(default_factory=dict)   # by cause
    restart_s: float | None = None          # mean time to restart
    ettr: float | None = None
    lost_progress: float | None = None      # share of its allocated time
    save_s: float | None = None             # mean save cost C
    saves: int = 0
    mtbf_s: float | None = None             # its own, or the cluster's rate at its size
    mtbf_source: str = ""

    @property
    def count(self) -> int:
        return sum(self.interruptions.values())

    @property
    def interval_s(self) -> float | None:
        return self.hours * 3600 / self.saves if self.saves else None

    @property
    def optimal_s(self) -> float | None:
        return young_daly(self.save_s, self.mtbf_s)

    @property
    def gain(self) -> float | None:
        """Goodput gained (share of time) by checkpointing at the optimum instead."""
        tau, best = self.interval_s, self.optimal_s
        if tau is None or best is None or not self.save_s or not self.mtbf_s:
            return None
        return waste(tau, self.save_s, self.mtbf_s) - waste(best, self.save_s, self.mtbf_s)


@dataclass
class Reliability:
    jobs: list[JobReliability]
    rate_per_gpu_hour: dict[str, float]     # per cluster: interruptions per GPU-hour of stepping jobs
    rules_present: bool


def compute(results: Results, facts: Facts, cluster_label: str) -> Reliability:
    onsets: dict[tuple[str, str], dict[str, int]] = {}
    for (cluster, job_id, cause), value in results.vector("int_onsets", cluster_label, "job_id", "cause").items():
        onsets.setdefault((cluster, job_id), {})[cause] = round(value)
    for key, value in results.vector("int_save_pauses", cluster_label, "job_id").items():
        causes = onsets.get(key, {})
        if "none" in causes:                  # a long save read as an interruption until it ended
            causes["none"] = max(0, causes["none"] - round(value))
            if not causes["none"]:
                del causes["none"]
    single = {name: results.vector(name, cluster_label, "job_id") for name in QUERY_NAMES[1:]}
    jobs = []
    for (cluster, job_id), job in sorted(facts.jobs.items()):
        if not job.instrumented:
            continue
        key = (cluster, job_id)
        row = JobReliability(cluster, job_id, job.max_gpus, job.hours, onsets.get(key, {}))
        row.restart_s = ratio(single["int_restart_sum"].get(key), single["int_restart_count"].get(key))
        row.ettr, row.lost_progress = single["int_ettr"].get(key), single["int_lost"].get(key)
        row.saves = round(single["ckpt_saves"].get(key, 0.0))
        row.save_s = ratio(single["ckpt_seconds"].get(key), row.saves)
        jobs.append(row)
    rates = _cluster_rates(jobs)
    for row in jobs:
        if row.count >= OWN_MTBF_MIN and row.hours:
            row.mtbf_s, row.mtbf_source = row.hours * 3600 / row.count, "its own"
        elif rates.get(row.cluster) and row.gpus:
            row.mtbf_s, row.mtbf_source = 3600 / (rates[row.cluster] * row.gpus), "the cluster's rate"
    present = any(name in results.outcomes and results.vector(name, "job_id") for name in ("int_ettr", "int_onsets"))
    return Reliability(jobs, rates, present)


def _cluster_rates(jobs: list[JobReliability]) -> dict[str, float]:
    """Interruptions per GPU-hour of the jobs that report steps, per cluster (absent without one)."""
    out: dict[str, float] = {}
    for cluster in {row.cluster for row in jobs}:
        mine = [row for row in jobs if row.cluster == cluster]
        count, gpu_hours = sum(r.count for r in mine), sum(r.gpus * r.hours for r in mine)
        if count and gpu_hours:
            out[cluster] = count / gpu_hours
    return out


INTRO = ("ETTR (effective training time ratio, Meta's definition): the time a job's steps made progress over the "
         "time it held its GPUs; a restart, a checkpoint save and the steps done again after a restart from an "
         "older checkpoint (lost progress) are not progress. An interruption is a job that holds its GPUs and "
         "makes no step for longer than 5 step times (at least 2 minutes), counted once, with the cause its nodes' "
         "telemetry gave; time to restart runs from its last step to its first step after. MTBF is the job's own "
         f"(hours over interruptions, from {OWN_MTBF_MIN} interruptions) or the cluster's interruption rate per "
         "GPU-hour at the job's size. The checkpoint interval that wastes least is Young/Daly's sqrt(2 x C x MTBF) "
         "for a save cost C: checkpointing every tau wastes C/tau in saves and tau/(2 MTBF) in steps redone, to "
         "first order; the goodput gained is that waste at the measured interval minus at the optimum. It assumes "
         "failures at a constant rate, blocking saves, C << tau << MTBF, and restarts from the last save.")


def section(data: Reliability, errors: dict[str, str]) -> Section:
    out = Section("interruptions", "Interruptions and checkpoints", intro=INTRO)
    total = sum(row.count for row in data.jobs)
    hours = sum(row.gpus * row.hours for row in data.jobs)
    restarts = [row.restart_s for row in data.jobs if row.restart_s is not None]
    out.figures = [
        Figure("Interruptions", float(total), "int"),
        Figure("Per 1,000 GPU-hours", 1000 * total / hours if hours else None, "float",
               "of jobs that report steps"),
        Figure("Mean time between interruptions", hours / total * 3600 if total and hours else None, "duration",
               "per GPU: GPU-hours over interruptions"),
        Figure("Mean time to restart", sum(restarts) / len(restarts) if restarts else None, "duration"),
    ]
    out.tables = [_per_job(data), _advice(data)]
    if not data.rules_present:
        out.notes.append("This Prometheus holds no results of alerts/flopwatch-interruptions.yml for the window (a "
                         "backfilled history has none, or the rules are not loaded): no ETTR, interruptions or "
                         "restart times.")
    out.notes += failed_notes(errors, QUERY_NAMES)
    return out


def _per_job(data: Reliability) -> Table:
    table = Table("interruptions_by_job", "Per job", [
        Column("cluster", "Cluster"), Column("job_id", "Job"), Column("ettr", "ETTR", "pct"),
        Column("interruptions", "Interruptions", "int"), Column("causes", "Causes"),
        Column("mtbf", "MTBF", "duration"), Column("restart", "Mean time to restart", "duration"),
        Column("lost_progress", "Lost progress", "pct"),
    ], empty="no job reports training steps")
    for row in data.jobs:
        table.rows.append({
            "cluster": cluster_name(row.cluster), "job_id": row.job_id, "ettr": row.ettr, "interruptions": row.count,
            "causes": ", ".join(f"{cause} {n}" for cause, n in sorted(row.interruptions.items())) or "none",
            "mtbf": row.mtbf_s if row.mtbf_source == "its own" else None, "restart": row.restart_s,
            "lost_progress": row.lost_progress,
        })
    return table


def _advice(data: Reliability) -> Table:
    table = Table("checkpoint_advice", "Checkpoint interval per job (Young/Daly)", [
        Column("job_id", "Job"), Column("save", "Save cost (s)", "float"), Column("saves", "Saves", "int"),
        Column("interval", "Interval now", "duration"), Column("mtbf", "MTBF used", "duration"),
        Column("mtbf_source", "MTBF from"), Column("optimal", "Young/Daly interval", "duration"),
        Column("gain", "Goodput gained there", "pct"),
    ], empty="no job saved a checkpoint (rank 0's flopwatch_train_checkpoint_seconds_total) or no interruption "
             "in the window to set a failure rate")
    for row in data.jobs:
        if row.save_s is None or row.mtbf_s is None:
            continue
        table.rows.append({"job_id": row.job_id, "save": row.save_s, "saves": row.saves, "interval": row.interval_s,
                           "mtbf": row.mtbf_s, "mtbf_source": row.mtbf_source, "optimal": row.optimal_s,
                           "gain": row.gain})
    return table
