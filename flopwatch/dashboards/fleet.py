"""Fleet overview: how much of the fleet's compute turns into training, and where to look next.

MFU for the fleet (idle GPUs count against it) and the cluster (allocated GPUs only), GPUs by
state, power and energy, goodput per job, the worst ranks by straggler score and FlopWatch alerts.
Jobs link to the training-job dashboard, GPUs to the node drill-down, alerts to their runbooks.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from flopwatch.dashboards import common as c

UID = "flopwatch-fleet"
TITLE = "FlopWatch / Fleet overview"
JOB = '{job_id=~"$job_id"}'


def build(docs_url: str = c.DOCS_URL) -> dm.Dashboard:
    board = c.Board(UID, TITLE, "MFU, GPU states, power, goodput, stragglers and alerts across the fleet.",
                    [c.job_variable(multi=True)], docs_url=docs_url)
    to_job = c.drill_link("Training job ${__data.fields.job_id}", "flopwatch-job",
                          job_id="${__data.fields.job_id}")
    to_gpu = c.drill_link("Node ${__data.fields.node} GPU ${__data.fields.gpu}", "flopwatch-node",
                          node="${__data.fields.node}", gpu="${__data.fields.gpu}")
    _efficiency(board)
    _mfu_and_goodput_by_job(board, to_job)
    _gpus_power_and_energy(board)
    _stragglers_and_alerts(board, to_gpu, to_job, docs_url)
    return board.build()


def _efficiency(board: c.Board) -> None:
    """The "Efficiency" row."""
    board.row("Efficiency")
    board.add(
        c.stat_panel(
            "Fleet MFU", "Model FLOP/s of every job over the dense peak of every GPU in the fleet, idle ones "
            "included: what the fleet as a whole turns into training. " + c.MFU_DESCRIPTION, c.PERCENT)
        .thresholds(c.thresholds(c.RED, *c.MFU_BANDS)).min(0).max(1)
        .with_target(c.query("fleet:flopwatch_mfu:ratio", "fleet")),
        c.stat_panel(
            "Cluster MFU (allocated GPUs)", "Model FLOP/s of the jobs over the dense peak of the GPUs "
            "allocated to them: how well the jobs that run use what they hold. A gap to fleet MFU is idle "
            "capacity. " + c.MFU_DESCRIPTION, c.PERCENT)
        .thresholds(c.thresholds(c.RED, *c.MFU_BANDS)).min(0).max(1)
        .with_target(c.query("cluster:flopwatch_mfu:ratio", "cluster")),
        c.stat_panel(
            "GPUs by state", "busy: a kernel ran at least 10% of the last minute; allocated_idle: held by a "
            "job but not busy (paid for, doing nothing); idle: neither. Lost GPUs count in none.",
            c.COUNT, width=8)
        .thresholds(c.thresholds(c.BLUE))
        .with_target(c.query("cluster:flopwatch_gpus:count", "{{state}}")),
        c.stat_panel(
            "GPUs lost", "GPUs whose agent cannot read them (fallen off the bus, hung, timing out): "
            "the canonical up record is 0. Any is a page (FlopWatchGpuLost).", c.COUNT, width=4)
        .thresholds(c.thresholds(c.GREEN, (1, c.RED)))
        .links(board.runbooks("FlopWatchGpuLost"))
        .with_target(c.query(f"sum(1 - {c.UP})", "lost")),
    )


def _mfu_and_goodput_by_job(board: c.Board, to_job: c.DashboardLink) -> None:
    """The "MFU and goodput by job" row."""
    board.row("MFU and goodput by job")
    board.add(
        c.timeseries_panel(
            "MFU over time", "Fleet, cluster and per-job MFU (model FLOPs only: recomputation counts toward "
            "HFU, never MFU). A job that drops while the others hold points at that job: open it from the "
            "jobs table. " + c.MFU_DESCRIPTION, c.PERCENT, width=16, show_thresholds=True)
        .thresholds(c.thresholds(c.RED, *c.MFU_BANDS)).min(0)
        .with_target(c.query("fleet:flopwatch_mfu:ratio", "fleet", "A"))
        .with_target(c.query("cluster:flopwatch_mfu:ratio", "cluster", "B"))
        .with_target(c.query(f"job_id:flopwatch_mfu:ratio{JOB}", "{{job_id}}", "C"))
        .data_links([c.drill_link("Training job ${__field.labels.job_id}", "flopwatch-job",
                                  job_id="${__field.labels.job_id}")]),
        c.bargauge_panel(
            "Goodput by job", "Share of each job's allocated GPU time that went into productive steps "
            "(data loading and straggler waits excluded). Llama 3 kept more than 90% effective training "
            "time; FlopWatchGoodputLow tickets below 80% over 30 minutes.", c.PERCENT, width=8)
        .thresholds(c.thresholds(c.RED, *c.GOODPUT_BANDS)).min(0).max(1)
        .links(board.runbooks("FlopWatchGoodputLow"))
        .with_target(c.query(f"job_id:flopwatch_goodput:ratio{JOB}", "{{job_id}}")),
    )
    jobs = (
        c.table_panel(
            "Jobs", "Every job with its GPUs, MFU, HFU, goodput and step time right now (user where the "
            "agent attributes jobs; dcgm-exporter has none). Click a job for its dashboard.", c.COUNT,
            columns=["job_id", "user"], width=24, height=7)
        .with_target(c.query(f"count by (job_id, user) (flopwatch_gpu_job_info{JOB}) or on (job_id) "
                             f"count by (job_id) ({c.JOB_INFO}{JOB})", ref="A",
                             instant=True, table_format=True))
        .with_target(c.query(f"job_id:flopwatch_mfu:ratio{JOB}", ref="B", instant=True, table_format=True))
        .with_target(c.query(f"job_id:flopwatch_hfu:ratio{JOB}", ref="C", instant=True, table_format=True))
        .with_target(c.query(f"job_id:flopwatch_goodput:ratio{JOB}", ref="D", instant=True,
                             table_format=True))
        .with_target(c.query(f"job_id:flopwatch_step_seconds:mean1m{JOB}", ref="E", instant=True,
                             table_format=True))
    )
    jobs = c.value_column(jobs, "A", "GPUs", c.COUNT)
    jobs = c.value_column(jobs, "B", "MFU", c.PERCENT, (c.RED, c.MFU_BANDS))
    jobs = c.value_column(jobs, "C", "HFU", c.PERCENT)
    jobs = c.value_column(jobs, "D", "Goodput", c.PERCENT, (c.RED, c.GOODPUT_BANDS))
    jobs = c.value_column(jobs, "E", "Step time", c.SECONDS)
    board.add(c.column_links(jobs, "job_id", [to_job]))


def _gpus_power_and_energy(board: c.Board) -> None:
    """The "GPUs, power and energy" row."""
    board.row("GPUs, power and energy")
    board.add(
        c.timeseries_panel(
            "GPUs busy, idle and allocated but idle", "GPU count by state over time. A growing "
            "allocated_idle band is capacity paid for and unused (FlopWatchIdleAllocatedGpus after 30 "
            "minutes).", c.COUNT, stacked=True)
        .links(board.runbooks("FlopWatchIdleAllocatedGpus"))
        .with_target(c.query("cluster:flopwatch_gpus:count", "{{state}}")),
        c.timeseries_panel(
            "GPU power", "Board power drawn by all GPUs against the sum of their enforced limits (limits "
            "from the agent only). Power far below the limit while jobs run means GPUs wait (data, "
            "communication, stragglers).",
            c.WATTS, width=8)
        .with_target(c.query("sum(node_gpu:flopwatch_gpu_power_watts:max)", "power", "A"))
        .with_target(c.query("sum(flopwatch_gpu_power_limit_watts)", "limit", "B")),
        c.stat_panel(
            "GPU energy in range", "Energy the GPUs used over the dashboard's time range (NVML total "
            "energy counters; board power only, not hosts or cooling).", c.WATT_HOURS, width=4, trend=False)
        .thresholds(c.thresholds(c.BLUE))
        .with_target(c.query("sum(increase(flopwatch_gpu_energy_joules_total[$__range])) / 3600", "energy",
                             instant=True)),
    )


def _stragglers_and_alerts(board: c.Board, to_gpu: c.DashboardLink, to_job: c.DashboardLink, docs_url: str) -> None:
    """The "Stragglers and alerts" row."""
    board.row("Stragglers and alerts")
    stragglers = (
        c.table_panel(
            "Worst ranks by straggler score", "Each rank's time per step before the gradient collective "
            "over its job's median rank (1.0 = the median). In synchronous training every rank waits for "
            "the slowest, so one rank at 1.08 slows the whole job by 8%. The alert names a rank above "
            "2-3% (more in a noisy job). Click node or GPU for its telemetry, the job for its heat map.",
            c.RATIO, columns=["job_id", "rank", "node", "gpu"])
        .with_target(c.query(f"topk(10, job_id_rank:flopwatch_straggler_score:ratio{JOB})", instant=True,
                             table_format=True))
        .sort_by([c.sort_desc("Score")])
    )
    stragglers = c.value_column(stragglers, "A", "Score", c.RATIO, (c.GREEN, c.SCORE_BANDS))
    stragglers = c.column_links(stragglers, "job_id", [to_job])
    stragglers = c.column_links(stragglers, "node", [to_gpu])
    board.add(c.column_links(stragglers, "gpu", [to_gpu]).links(board.runbooks("FlopWatchStraggler")))
    alerts = (
        c.table_panel(
            "FlopWatch alerts", "Alerts pending or firing now, with the labels that say where (job, node, "
            "GPU, rank, device) and why (cause). Click the runbook for what to do.", c.COUNT,
            columns=["alertname", "alertstate", "severity", "job_id", "node", "gpu", "rank", "device",
                     "cause", "runbook"], hide=["Value"])
        .with_target(c.query(
            "max by (alertname, alertstate, severity, job_id, node, gpu, rank, device, cause, runbook) ("
            + c.with_runbook_label('ALERTS{alertname=~"FlopWatch.*"}') + ")", instant=True, table_format=True))
    )
    alerts = c.column_links(alerts, "runbook", [
        c.external_link("Runbook", f"{docs_url}/runbooks.md#${{__data.fields.runbook}}")])
    board.add(c.column_links(alerts, "node", [to_gpu]))
