"""Training job: is this job efficient, and if not, which rank, GPU or phase holds it back?

MFU and HFU (instrumented, and the telemetry-only estimate), step time, a heat map of every rank's
compute seconds per step, straggler scores against each rank's peers, communication wait, time per
phase, where the step time goes (the What-if heat map of stage x dp rank, the share lost to bad
workers, stage and scattered imbalance, each stage against the fastest), goodput and badput, and
the clocks, temperatures, power and throttle reasons of the job's GPUs.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from flopwatch.catalog.gpu import CLOCK_EVENT_BITS
from flopwatch.dashboards import common as c

UID = "flopwatch-job"
TITLE = "FlopWatch / Training job"
JOB = '{job_id=~"$job_id"}'
GPUS = 'node=~"$node", gpu=~"$gpu"'
#: The clock-event reasons that hold a busy GPU back (idle is no fault).
NOT_IDLE = tuple(reason for reason in CLOCK_EVENT_BITS if reason != "idle")


def _per_step(phase: str) -> str:
    """Seconds of `phase` per step for each rank of the job (labels job_id, rank, node, gpu)."""
    return (f'rate(flopwatch_train_phase_seconds_total{{job_id=~"$job_id", phase="{phase}"}}[$__rate_interval]) '
            f"/ ignoring (phase) (rate(flopwatch_train_steps_total{JOB}[$__rate_interval]) > 0)")


def _outliers(title: str, description: str, unit: str, metric: str, pick: str):
    """The job's GPUs that stand out (`topk` or `bottomk` of 8) and the job's median for scale: a
    1,024-GPU job would otherwise draw 1,024 lines."""
    series = c.on_job_gpus(f"{metric}{{{GPUS}}}")
    return (c.timeseries_panel(title, description, unit, legend_table=True)
            .with_target(c.query(f"{pick}(8, {series})", "{{node}} GPU {{gpu}}", "A"))
            .with_target(c.query(f"quantile(0.5, {series})", "job median", "B")))


def build(docs_url: str = c.DOCS_URL) -> dm.Dashboard:
    variables = [c.job_variable(multi=False),
                 c.node_variable(f"{c.JOB_INFO}{JOB}"), c.gpu_variable()]
    board = c.Board(UID, TITLE, "One training job: MFU, step time, stragglers, badput and its GPUs.",
                    variables, docs_url=docs_url)
    to_gpu = c.drill_link("Node ${__field.labels.node} GPU ${__field.labels.gpu}", "flopwatch-node",
                          node="${__field.labels.node}", gpu="${__field.labels.gpu}")
    _efficiency(board)
    _stragglers(board, to_gpu)
    _step_time(board)
    _goodput(board)
    _gpus(board, to_gpu)
    return board.build()


def _efficiency(board: c.Board) -> None:
    """The "Efficiency" row."""
    board.row("Efficiency")
    board.add(
        c.stat_panel("MFU", "Model FLOP/s of the job over the dense peak of its GPUs (1-minute rate). "
                     + c.MFU_DESCRIPTION, c.PERCENT)
        .thresholds(c.thresholds(c.RED, *c.MFU_BANDS)).min(0).max(1)
        .links(board.runbooks("FlopWatchJobMfuRegression"))
        .with_target(c.query(f"job_id:flopwatch_mfu:ratio{JOB}", "{{job_id}}")),
        c.stat_panel("HFU", "Hardware FLOP/s (activation recomputation included) over the same peak. HFU "
                     "well above MFU means much recomputation: PaLM ran 46.2% MFU at 57.8% HFU.", c.PERCENT)
        .thresholds(c.thresholds(c.BLUE)).min(0).max(1)
        .with_target(c.query(f"job_id:flopwatch_hfu:ratio{JOB}", "{{job_id}}")),
        c.stat_panel("Goodput", "Share of the job's allocated GPU time spent in productive steps (data "
                     "loading, straggler waits, checkpoints and restarts excluded); 5-minute window.", c.PERCENT)
        .thresholds(c.thresholds(c.RED, *c.GOODPUT_BANDS)).min(0).max(1)
        .links(board.runbooks("FlopWatchGoodputLow"))
        .with_target(c.query(f"job_id:flopwatch_goodput:ratio{JOB}", "{{job_id}}")),
        c.stat_panel("Step time", "Mean wall time of a training step over the last minute. In synchronous "
                     "training it is the same on every rank, so it shows that the job slowed, not which rank "
                     "slowed it: see the heat map below.", c.SECONDS)
        .thresholds(c.thresholds(c.BLUE))
        .links(board.runbooks("FlopWatchTrainingStalled"))
        .with_target(c.query(f"job_id:flopwatch_step_seconds:mean1m{JOB}", "{{job_id}}")),
    )
    board.add(
        c.timeseries_panel(
            "MFU and HFU", "Instrumented MFU and HFU from the training client's FLOP counters, and the "
            "telemetry-only estimate (tensor-pipe activity x SM clock / max clock) that also works for jobs "
            "without the client. A drop in both with the estimate steady points at the job (batch, "
            "sequence length); a drop in all three at the hardware. " + c.MFU_DESCRIPTION, c.PERCENT,
            show_thresholds=True)
        .thresholds(c.thresholds(c.RED, *c.MFU_BANDS)).min(0)
        .with_target(c.query(f"job_id:flopwatch_mfu:ratio{JOB}", "MFU", "A"))
        .with_target(c.query(f"job_id:flopwatch_hfu:ratio{JOB}", "HFU", "B"))
        .with_target(c.query(f"job_id:flopwatch_mfu_telemetry:ratio{JOB}", "MFU (telemetry estimate)", "C")),
        c.timeseries_panel(
            "Step time", "Mean step time (1 minute) and the 50th/95th percentile from the step-time "
            "histogram. A rising mean with a steady p50 means occasional slow steps (checkpoints, GC, data "
            "stalls); both rising means every step slowed.", c.SECONDS)
        .thresholds(c.thresholds(c.BLUE))
        .with_target(c.query(f"job_id:flopwatch_step_seconds:mean1m{JOB}", "mean", "A"))
        .with_target(c.query(
            f"histogram_quantile(0.5, sum by (le) (rate(flopwatch_train_step_seconds_bucket{JOB}"
            "[$__rate_interval])))", "p50", "B"))
        .with_target(c.query(
            f"histogram_quantile(0.95, sum by (le) (rate(flopwatch_train_step_seconds_bucket{JOB}"
            "[$__rate_interval])))", "p95", "C")),
    )


def _stragglers(board: c.Board, to_gpu: c.DashboardLink) -> None:
    """The "Stragglers" row."""
    board.row("Stragglers")
    board.add(
        c.heatmap_panel(
            "Compute seconds per step by rank", "One row per rank (in rank order), one column per time step, "
            "colour = seconds of forward and backward compute per step. Read it like MegaScale's and the OSDI'25 "
            "what-if study's heat maps: a single hot cell or row is a bad worker (look at its GPU); a band "
            "of adjacent ranks is a pipeline stage with more work; scattered hot cells that move between "
            "ranks are data (sequence-length) imbalance, not hardware.", c.SECONDS)
        .with_target(c.query(c.rank_rows(f"job_id_rank:flopwatch_compute_seconds_per_step:rate1m{JOB}"),
                             "{{rank}}")),
    )
    board.add(
        c.timeseries_panel(
            "Straggler score: worst ranks", "The five ranks with the longest time per step before the "
            "collective (data + compute + other), over the median of their peers (the ranks of the same "
            "pipeline stage; the whole job without stages): 1.0 = median, 1.05 = 5% "
            "slower, and the whole job runs that much slower. FlopWatchStraggler names a rank above 2% "
            "with a corroborating cause (thermal, power, PCIe, NVLink, NIC, host CPU) or 3% without. "
            "Click a line for that GPU.", c.RATIO, show_thresholds=True, legend_table=True)
        .thresholds(c.thresholds(c.GREEN, *c.SCORE_BANDS))
        .links(board.runbooks("FlopWatchStraggler"))
        .data_links([to_gpu])
        .with_target(c.query(f"topk(5, job_id_rank:flopwatch_straggler_score:ratio{JOB})",
                             "rank {{rank}} ({{node}} GPU {{gpu}})")),
        c.timeseries_panel(
            "GPU clock score: slowest GPUs", "The job's median SM clock over each busy GPU's clock (1.0 = "
            "median, above = slower): the straggler signal for jobs without the training client, and "
            "corroboration for those with it. Only GPUs more than half busy are scored.", c.RATIO,
            show_thresholds=True, legend_table=True)
        .thresholds(c.thresholds(c.GREEN, *c.SCORE_BANDS))
        .data_links([to_gpu])
        .with_target(c.query(f"topk(5, node_gpu:flopwatch_gpu_straggler_score:ratio{JOB})",
                             "{{node}} GPU {{gpu}}")),
    )
    board.add(
        c.timeseries_panel(
            "Communication wait per step: ranks waiting least", "Seconds per step each rank spends in "
            "the gradient collective. Every rank waits for the slowest one, so the straggler is the rank "
            "that waits least; the median shows the wait the job pays for it.", c.SECONDS,
            legend_table=True)
        .data_links([to_gpu])
        .with_target(c.query(f"bottomk(5, {_per_step('comm')})", "rank {{rank}} ({{node}} GPU {{gpu}})", "A"))
        .with_target(c.query(f"quantile(0.5, {_per_step('comm')})", "median rank", "B")),
        c.timeseries_panel(
            "Time per step by phase", "Average seconds per step over the job's ranks by phase: data, "
            "compute, comm, optimizer, other. The phases add up to the step time; growing data time is an "
            "input pipeline problem, growing comm time a network or straggler problem.", c.SECONDS,
            stacked=True)
        .with_target(c.query(
            f"sum by (phase) (rate(flopwatch_train_phase_seconds_total{JOB}[$__rate_interval])) / scalar("
            f"sum(rate(flopwatch_train_steps_total{JOB}[$__rate_interval])))", "{{phase}}")),
    )


def _step_time(board: c.Board) -> None:
    """The "Where the step time goes" row."""
    board.row("Where the step time goes")
    board.add(
        c.heatmap_panel(
            "Arrival per step by pipeline stage and data-parallel rank", "One row per worker, stage by "
            "stage and data-parallel rank within it (\"stage 003 dp 00012\"); colour = seconds per step "
            "before the collective (data + compute + other, 30 s window). As in the OSDI'25 What-if study: "
            "one hot cell is a bad worker (FlopWatchStraggler pages it), a band over all rows of a stage "
            "is stage imbalance (FlopWatchPipelineImbalance files a ticket), scattered cells that move "
            "are sequence-length imbalance (reported, never alerted).", c.SECONDS, height=12)
        .with_target(c.query(c.stage_rows("job_id_rank:flopwatch_arrival_seconds_per_step:recent",
                                          'job_id=~"$job_id"'), "{{row}}")),
    )
    board.add(
        c.timeseries_panel(
            "Share of step time lost, by class", "Of each step, the share spent waiting for slower ranks "
            "beyond the collective's own time (5-minute window), split into a bad worker (one rank "
            "slower than its stage's peers), stage imbalance (a whole pipeline stage slower) and "
            "scattered imbalance (the slowest rank changes from step to step). 1 / (1 - the total) is "
            "the job's slowdown: 25% lost means the job runs 1.33x slower than it could.", c.PERCENT,
            stacked=True)
        .min(0)
        .links(board.runbooks("FlopWatchStraggler", "FlopWatchPipelineImbalance"))
        .with_target(c.query(f"job_id_class:flopwatch_step_time_lost:ratio{JOB}", "{{class}}")),
        c.timeseries_panel(
            "Pipeline stages against the fastest", "Each stage's median arrival per step over its data-"
            "parallel peers (2-minute window), over the fastest stage's: 1.0 = the fastest, 1.2 = 20% "
            "more work per step. First and last stages a few percent heavier (embedding, loss) are "
            "normal; FlopWatchPipelineImbalance files a ticket above 10%. A job without pipeline stages "
            "shows one line at 1.0.", c.RATIO, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (1.05, c.YELLOW), (1.1, c.ORANGE)))
        .links(board.runbooks("FlopWatchPipelineImbalance"))
        .with_target(c.query(
            f"job_id_stage:flopwatch_arrival_seconds_per_step:median2m{JOB} / on (job_id) group_left () "
            f"min by (job_id) (job_id_stage:flopwatch_arrival_seconds_per_step:median2m{JOB})", "stage {{stage}}")),
    )


def _goodput(board: c.Board) -> None:
    """The "Goodput and badput" row."""
    board.row("Goodput and badput")
    board.add(
        c.timeseries_panel(
            "Goodput and badput by cause", "Where the job's allocated GPU time went (5-minute windows): "
            "goodput, and badput from data loading, checkpoints, straggler waits and restarts (time in "
            "neither steps nor checkpoints: crashes, hangs, lost GPUs). The stack adds up to about 100%.",
            c.PERCENT, stacked=True)
        .min(0)
        .links(board.runbooks("FlopWatchGoodputLow"))
        .with_target(c.query(f"job_id:flopwatch_goodput:ratio{JOB}", "goodput", "A"))
        .with_target(c.query(f"job_id:flopwatch_badput:ratio{JOB}", "{{cause}}", "B")),
        c.timeseries_panel(
            "Achieved and peak FLOP/s", "Model FLOP/s the job achieves against the dense peak of its "
            "GPUs (the MFU numerator and denominator).", c.FLOPS)
        .with_target(c.query(f"job_id:flopwatch_model_flops:rate1m{JOB}", "achieved", "A"))
        .with_target(c.query(f"job_id:flopwatch_peak_flops:sum{JOB}", "dense peak", "B")),
    )


def _gpus(board: c.Board, to_gpu: c.DashboardLink) -> None:
    """The "The job's GPUs" row."""
    board.row("The job's GPUs")
    board.add(
        _outliers(
            "SM clock: slowest GPUs", "The eight lowest SM clocks among the job's GPUs (narrow with the node "
            "and GPU variables) against the job's median. A GPU clocking below its peers is throttled: the "
            "throttle-reason timeline says why.", c.HERTZ, "node_gpu:flopwatch_gpu_sm_clock_hertz:max", "bottomk")
        .data_links([to_gpu]),
        c.state_timeline_panel(
            "Throttle reasons", "Clock-event reasons holding a GPU of the job below its requested clock, "
            "only while active: sw_thermal/hw_thermal (too hot), sw_power_cap/hw_power_brake (power), "
            "hw_slowdown (hardware protection), clock_below_max (dcgm-exporter without its clock-event bitmask: a "
            "busy GPU under 90% of its model's maximum clock). A single GPU here while its rank scores high is the "
            "corroborated straggler cause.", c.COUNT,
            {"1": ("active", c.RED)})
        .links(board.runbooks("FlopWatchGpuThrottled", "FlopWatchStraggler"))
        .with_target(c.query(c.on_job_gpus(
            f"({c.clock_event_reasons(GPUS, NOT_IDLE)}) == 1"),
            "{{node}} GPU {{gpu}} {{reason}}")),
        _outliers(
            "GPU temperature: hottest GPUs", "The eight hottest of the job's GPUs against the job's median. "
            "One GPU hotter than its neighbours (cooling, airflow) throttles first.", c.CELSIUS,
            "node_gpu:flopwatch_gpu_temperature_celsius:max", "topk")
        .data_links([to_gpu]),
        _outliers(
            "GPU power: lowest-drawing GPUs", "The eight GPUs of the job drawing the least power against the "
            "job's median. One far below its peers is power-capped or waiting; all far below their limits "
            "means the job waits (data, communication, a straggler).", c.WATTS,
            "node_gpu:flopwatch_gpu_power_watts:max",
            "bottomk")
        .data_links([to_gpu]),
    )
