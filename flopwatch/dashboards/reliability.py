"""Reliability: what interrupts training and what it costs. XIDs by code, lost GPUs, memory errors,
interruptions and stalls, checkpoint time, the goodput trend and the alerts that fired.

Meta's RSC study puts the mean time to failure of a 1,024-GPU job at 7.9 hours; Llama 3 saw 466
interruptions in 54 days, 78% of them hardware. This dashboard is where that shows for a fleet.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from flopwatch.dashboards import common as c

UID = "flopwatch-reliability"
TITLE = "FlopWatch / Reliability"
NODE = '{node=~"$node"}'
JOB = '{job_id=~"$job_id"}'
XIDS = "flopwatch_gpu_xid_errors_total" + NODE


def build(docs_url: str = c.DOCS_URL) -> dm.Dashboard:
    board = c.Board(UID, TITLE, "XIDs, lost GPUs, memory errors, interruptions, checkpoints, goodput "
                    "and alerts over time.", [c.job_variable(multi=True), c.node_variable()],
                    docs_url=docs_url, time_from="now-7d")
    to_gpu = c.drill_link("Node ${__data.fields.node} GPU ${__data.fields.gpu}", "flopwatch-node",
                          node="${__data.fields.node}", gpu="${__data.fields.gpu}")
    _gpu_faults(board, to_gpu)
    _jobs_interruptions_checkpoints_goodput(board)
    _alerts_and_agents(board)
    return board.build()


def _gpu_faults(board: c.Board, to_gpu: c.DashboardLink) -> None:
    """The "GPU faults" row."""
    board.row("GPU faults")
    board.add(
        c.timeseries_panel(
            "XIDs by code", "XID errors per interval by code over the selected nodes (a GPU's first XID "
            "counts too; dcgm-exporter's GPUs: 1 for 5 minutes after a new last-XID code). Critical codes (48 "
            "double-bit ECC, 62, 64, 74 NVLink, 79 fallen off the bus, 94, "
            "95, 119, 120) page; the rest ticket. NVIDIA's Xid catalogue has every code.", c.COUNT,
            width=16, bars=True)
        .links(board.runbooks("FlopWatchGpuXidCritical", "FlopWatchGpuXid"))
        .with_target(c.query(f"sum by (xid) ({c.increase_with_new(XIDS, '$__rate_interval')} or "
                             f"{c.dcgm_xids(NODE.strip('{}'))})", "XID {{xid}}")),
        c.stat_panel(
            "GPUs lost now", "GPUs that cannot be read (the agent reports them down, or their dcgm-exporter "
            "series stopped while its target is up), with the trend. A "
            "synchronous job on a lost GPU cannot step.", c.COUNT, width=8)
        .thresholds(c.thresholds(c.GREEN, (1, c.RED)))
        .links(board.runbooks("FlopWatchGpuLost"))
        .with_target(c.query(f"sum(1 - {c.UP}{NODE})", "lost")),
    )
    xids = (
        c.table_panel(
            "XIDs in range by GPU", "Every GPU that reported an XID in the dashboard's time range, with the "
            "code and count (from the agent's counters; dcgm-exporter's GPUs: 1 per code new in the range). "
            "Click the node or GPU for its telemetry.", c.COUNT,
            columns=["node", "gpu", "xid"])
        .with_target(c.query(f"sum by (node, gpu, xid) ({c.increase_with_new(XIDS, '$__range')}) "
                             f"or {c.dcgm_xids(NODE.strip('{}'), '$__range')}",
                             instant=True, table_format=True))
        .sort_by([c.sort_desc("XIDs")])
    )
    xids = c.value_column(xids, "A", "XIDs", c.COUNT)
    xids = c.column_links(c.column_links(xids, "node", [to_gpu]), "gpu", [to_gpu])
    lost = (
        c.table_panel(
            "Lost GPUs", "GPUs that cannot be read right now, with the job that held them (the agent "
            "keeps a lost GPU's job; dcgm-exporter's job labels go with its series).", c.COUNT,
            columns=["node", "gpu", "job_id"], hide=["Value #A", "Value #B", "user"])
        .with_target(c.query(f"{c.UP}{NODE} == 0", ref="A", instant=True, table_format=True))
        .with_target(c.query(f"{c.JOB_INFO}{NODE} and on (node, gpu) {c.UP} == 0", ref="B",
                             instant=True, table_format=True))
    )
    board.add(xids, c.column_links(lost, "node", [to_gpu]).links(board.runbooks("FlopWatchGpuLost")))
    board.add(
        c.timeseries_panel(
            "Memory errors", "Uncorrectable ECC errors in the last 10 minutes, and GPUs with a row remap "
            "waiting for a reset (pending, agent only) or failed (no spare rows: replace the GPU), over the "
            "selected nodes.", c.COUNT,
            width=24)
        .links(board.runbooks("FlopWatchGpuEccUncorrected", "FlopWatchGpuRowRemapFailure"))
        .with_target(c.query(f"sum(node_gpu:flopwatch_gpu_ecc_uncorrected_errors:increase10m{NODE})",
                             "uncorrected ECC errors", "A"))
        .with_target(c.query(f"sum(flopwatch_gpu_row_remap_pending{NODE})", "GPUs with a remap pending", "B"))
        .with_target(c.query(f"sum(node_gpu:flopwatch_gpu_row_remap_failed:max{NODE})", "GPUs with a failed remap",
                             "C")),
    )


def _jobs_interruptions_checkpoints_goodput(board: c.Board) -> None:
    """The "Jobs: interruptions, checkpoints, goodput" row."""
    board.row("Jobs: interruptions, checkpoints, goodput")
    board.add(
        c.timeseries_panel(
            "Goodput trend", "Share of each job's allocated GPU time in productive steps. Google reports "
            "its largest Gemini job going from 85% to 97% goodput; FlopWatchGoodputLow tickets below 80%.",
            c.PERCENT, show_thresholds=True)
        .thresholds(c.thresholds(c.RED, *c.GOODPUT_BANDS)).min(0).max(1)
        .links(board.runbooks("FlopWatchGoodputLow"))
        .with_target(c.query(f"job_id:flopwatch_goodput:ratio{JOB}", "{{job_id}}")),
        c.timeseries_panel(
            "Interruptions: restart badput", "Share of each job's allocated GPU time spent neither in steps "
            "nor checkpoints: crashes and restarts, hangs, lost GPUs.", c.PERCENT)
        .min(0)
        .with_target(c.query('job_id:flopwatch_badput:ratio{job_id=~"$job_id", cause="restart"}',
                             "{{job_id}}")),
        c.timeseries_panel(
            "Time since the last step", "Seconds since any rank of the job completed a step. A steady "
            "climb is a hang; FlopWatchTrainingStalled pages after max(5 x the usual step time, 5 "
            "minutes).", c.SECONDS, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (300, c.RED)))
        .links(board.runbooks("FlopWatchTrainingStalled"))
        .with_target(c.query(
            f"time() - max by (job_id) (flopwatch_train_last_step_timestamp_seconds{JOB})", "{{job_id}}")),
        c.timeseries_panel(
            "Checkpoint time", "Share of each rank's time spent saving or restoring checkpoints, averaged "
            "over the job's ranks, by kind. Long or frequent checkpoints show here and as checkpoint "
            "badput; FlopWatchCheckpointIntervalOff tickets a day-long job whose interval is more than "
            "2x off the Young/Daly optimum.", c.PERCENT)
        .min(0)
        .links(board.runbooks("FlopWatchCheckpointIntervalOff"))
        .with_target(c.query(
            f"avg by (job_id, kind) (rate(flopwatch_train_checkpoint_seconds_total{JOB}[$__rate_interval]))",
            "{{job_id}} {{kind}}")),
    )


def _alerts_and_agents(board: c.Board) -> None:
    """The "Alerts and agents" row."""
    board.row("Alerts and agents")
    board.add(
        c.timeseries_panel(
            "FlopWatch alerts firing", "Alerts firing over time by name; open the FlopWatch alerts table on "
            "the fleet dashboard or the runbooks for what each means.", c.COUNT, stacked=True)
        .with_target(c.query('count by (alertname) (ALERTS{alertname=~"FlopWatch.*", alertstate="firing"})',
                             "{{alertname}}")),
        c.timeseries_panel(
            "Agents known and up", "FlopWatch agents seen in the last hour (by their flopwatch_build_info) "
            "and those Prometheus scraped successfully. A gap is a node whose GPUs, NICs and ranks go "
            "unobserved (FlopWatchAgentDown after 2 minutes). FlopWatchScrapeIntervalTooCoarse tickets a scrape "
            "job scraped less often than the rules were built for.", c.COUNT, width=6)
        .links(board.runbooks("FlopWatchAgentDown", "FlopWatchScrapeIntervalTooCoarse"))
        .with_target(c.query(f"count(max by (instance, job) (last_over_time(flopwatch_build_info{NODE}[1h])))",
                             "known", "A"))
        .with_target(c.query(
            f"count(max by (instance, job) (flopwatch_build_info{NODE}) and on (instance, job) (up == 1))",
            "up", "B")),
        c.timeseries_panel(
            "Collector errors", "Errors per second of each agent collector (failed reads, timeouts, whole "
            "failed updates), summed over the selected nodes; FlopWatchCollectorErrors tickets above "
            "0.01/s on a node for 10 minutes.", c.PER_SECOND, width=6)
        .links(board.runbooks("FlopWatchCollectorErrors"))
        .with_target(c.query(
            f"sum by (collector) (rate(flopwatch_collector_errors_total{NODE}[$__rate_interval]))",
            "{{collector}}")),
    )
