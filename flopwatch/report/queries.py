"""The report's PromQL, sized for a week of a large cluster.

Everything is computed from the raw series the agents export (a backfilled history has no
recording-rule results), through one range query per quantity at the grid's step (168 points
per series for a week, each bucket aggregating its own samples: sample counts for time,
`last_over_time` differences for counters, so the buckets add up exactly). Numerators and
denominators are aggregated separately and divided afterwards, never averaged ratios. Only the
share of step time lost, which the rules estimate step by step, and lost progress (steps done again
after a restart, which only the rules can tell from new ones) are read from their results
(`step_time_queries`).

Every aggregation keeps the cluster label (`cluster_label`, absent on a single Prometheus: one
cluster named ""), so the same queries serve a global view over several clusters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from flopwatch.catalog import gpu, host, job, nic, train
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import Grid, Window, grid_for
from flopwatch.train import wire

ALERTS_STRAGGLER = 'ALERTS{alertname="FlopWatchStraggler", alertstate="firing"}'
ALERTS_PIPELINE = 'ALERTS{alertname="FlopWatchPipelineImbalance", alertstate="firing"}'
#: Recording-rule results (alerts/flopwatch-goodput.yml, flopwatch-stragglers.yml): the share of
#: step time lost per job and per class, and each pipeline stage's arrival over the fastest stage's.
STEP_TIME_LOST = "job_id:flopwatch_step_time_lost:ratio"
STEP_TIME_LOST_BY_CLASS = "job_id_class:flopwatch_step_time_lost:ratio"
STAGE_IMBALANCE = "job_id_stage:flopwatch_stage_imbalance:ratio"
#: The rules' share of a job's allocated time spent redoing steps after a restart (the counters
#: cannot tell a replayed step from a new one; the rules compare the iteration with its high mark).
LOST_PROGRESS = 'job_id:flopwatch_badput:ratio{cause="lost_progress"}'
ARRIVAL_PHASES = "|".join(wire.ARRIVAL_PHASES)
IB_ERROR_COUNTERS = "symbol_error|link_error_recovery|port_rcv_errors"
#: IBTA tolerates 120 symbol errors an hour on a link; NVLink errors alert above 1/s (rules).
IB_ERRORS_PER_HOUR = 120
NVLINK_ERRORS_PER_SECOND = 1.0
#: Series a lookback this long before the window tells a counter's baseline from a new series.
BASELINE_LOOKBACK = "6h"
#: Prometheus's default lookback delta for instant selectors (--query.lookback-delta).
LOOKBACK_S = 300


@dataclass(frozen=True)
class Query:
    """One request to the query API. Range queries run over the grid unless start is given."""

    name: str
    title: str
    expr: str
    kind: Literal["instant", "range"] = "instant"
    at: float | None = None
    start: float | None = None
    end: float | None = None
    step: float | None = None


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class QueryBuilder:
    """Expression builders bound to the settings, the window and the grid."""

    def __init__(self, settings: ReportSettings, window: Window, grid: Grid, spacing: float | None) -> None:
        self.settings = settings
        self.window = window
        self.grid = grid
        self.cluster_label = settings.cluster_label
        self.bucket = grid.range()     # one bucket as a PromQL range
        self.span = window.range()     # the whole window as a PromQL range
        self.dtype_matcher = f"dtype={quote(settings.dtype)}"   # the peak FLOP/s series' matcher
        self.offset = f"{round(grid.step * 1000)}ms"   # one bucket back (see `increase`)
        # Samples sparser than Prometheus's 5m lookback need an explicit one (which cannot see stale markers).
        self.lookback = f"{int(2 * spacing) + 1}s" if spacing and spacing > LOOKBACK_S else None

    # -- building blocks -------------------------------------------------------------------------
    def selector(self, name: str, matchers: str = "") -> str:
        """An instant selector; wrapped in last_over_time when samples are sparser than the lookback."""
        selector = f"{name}{{{matchers}}}" if matchers else name
        return f"last_over_time({selector}[{self.lookback}])" if self.lookback else selector

    def by(self, *labels: str) -> str:
        return ", ".join((self.cluster_label, *labels))

    @property
    def peak(self) -> str:
        return f"max by ({self.by('node', 'gpu')}) ({self.selector(gpu.PEAK_FLOPS.name, self.dtype_matcher)})"

    def info(self, *extra: str) -> str:
        """GPU-to-job info, one series per (job, GPU)."""
        return f"max by ({self.by('job_id', *extra, 'node', 'gpu')}) ({self.selector(job.GPU_JOB_INFO.name)})"

    def per_gpu(self, expr: str) -> str:
        return f"max by ({self.by('node', 'gpu')}) ({expr})"

    @property
    def busy(self) -> str:
        utilization = f"avg_over_time({gpu.UTILIZATION.name}[{self.bucket}])"
        return f"{self.per_gpu(utilization)} >= {self.settings.thresholds.busy_utilization:g}"

    @property
    def tensor_flops(self) -> str:
        """Per GPU: tensor-pipe activity x SM clock / max clock (telemetry-only MFU, OFU), summed over
        the bucket's samples so a bucket counts as much as the samples cover (divide by
        `tensor_samples`). The three series of one GPU carry the same labels, so they match one
        to one without aggregating."""
        bucket = self.bucket
        return self.per_gpu(f"sum_over_time({gpu.TENSOR_ACTIVE.name}[{bucket}]) * "
                            f"avg_over_time({gpu.SM_CLOCK.name}[{bucket}]) / {self.selector(gpu.SM_CLOCK_MAX.name)}")

    def increase(self, name: str, matchers: str = "") -> str:
        """A counter's increase in each bucket: its last sample in the bucket minus its last sample
        in the bucket before, so the buckets add up exactly to the increase from the window's first
        sample to its last, whatever the samples' phase against the buckets. Nothing is
        extrapolated: `rate` and `increase` stretch a series' increase toward the edges of their
        range, so at a series' first or last sample (a job starting or ending, a gap, the end of the
        data) they count time no sample covers; on a minute of data that read up to 9% high, and a
        new series' first value (born_*) came on top of it.

        A counter reset counts the value after it. A series with no sample in the bucket before
        (it begins here, or returns after a gap of a bucket or more) counts from its first sample
        in the bucket: what it counted before that sample is unknown, except for a training
        counter born in the window, which counted from zero (the born_* queries add its first
        value)."""
        selector = f"{name}{{{matchers}}}" if matchers else name
        last = f"last_over_time({selector}[{self.bucket}])"
        before = f"last_over_time({selector}[{self.bucket}] offset {self.offset})"
        first = f"min_over_time({selector}[{self.bucket}])"
        return f"(({last} - ({before} or {first})) >= 0 or {last})"

    def samples(self, name: str, matchers: str = "") -> str:
        """Samples per bucket of each series: x the sample spacing, the seconds it covers."""
        selector = f"{name}{{{matchers}}}" if matchers else name
        return f"count_over_time({selector}[{self.bucket}])"

    @property
    def held(self) -> str:
        """Per (job, GPU): samples of the job's hold on the GPU in each bucket."""
        return f"max by ({self.by('job_id', 'node', 'gpu')}) ({self.samples(job.GPU_JOB_INFO.name)})"

    def join_jobs(self, per_gpu_expr: str, *extra: str) -> str:
        """A per-GPU value summed over each job's GPUs."""
        return (f"sum by ({self.by('job_id', *extra)}) ({self.info(*extra)} * on ({self.by('node', 'gpu')}) "
                f"group_left () ({per_gpu_expr}))")

    def arrival(self, rng: str, matchers: str = "") -> str:
        """Seconds per step before the gradient collective (data + compute + other), per rank."""
        extra = f", {matchers}" if matchers else ""
        labels = self.by("job_id", "rank", "node", "gpu")
        phases = (f"sum by ({labels}) (increase({train.PHASE_SECONDS.name}"
                  f"{{phase=~{quote(ARRIVAL_PHASES)}{extra}}}[{rng}]))")
        steps = f"sum by ({labels}) (increase({train.STEPS.name}{{{matchers}}}[{rng}]))"
        return f"{phases} / ({steps} >= 1)"

    # -- the main plan ---------------------------------------------------------------------------
    def range_queries(self) -> list[Query]:
        cluster = self.cluster_label
        info_on = f"on ({self.by('node', 'gpu')})"
        energy = self.increase(gpu.ENERGY.name)
        specs = [
            ("gpus", "GPUs reporting", f"count by ({cluster}) ({self.per_gpu(self.selector(gpu.UP.name))})"),
            ("peak", "fleet peak FLOP/s", f"sum by ({cluster}) ({self.peak})"),
            ("busy", "busy GPUs", f"count by ({cluster}) ({self.busy})"),
            ("allocated", "allocated GPUs", f"count by ({cluster}) (max by ({self.by('node', 'gpu')}) "
                                            f"({self.selector(job.GPU_JOB_INFO.name)}))"),
            ("job_gpus", "GPUs per job", f"count by ({self.by('job_id', 'user')}) ({self.info('user')})"),
            ("job_busy", "busy GPUs per job",
             f"count by ({self.by('job_id')}) ({self.info()} and {info_on} ({self.busy}))"),
            ("job_flops", "model FLOPs per job",
             f"sum by ({self.by('job_id')}) ({self.increase(train.MODEL_FLOPS.name)})"),
            ("job_tensor", "telemetry MFU per job", self.join_jobs(self.tensor_flops)),
            ("job_tensor_gpus", "GPUs with tensor activity per job",
             self.join_jobs(self.per_gpu(self.samples(gpu.TENSOR_ACTIVE.name)))),
            ("tensor", "telemetry MFU", f"sum by ({cluster}) ({self.tensor_flops})"),
            ("tensor_gpus", "GPUs with tensor activity",
             f"sum by ({cluster}) ({self.per_gpu(self.samples(gpu.TENSOR_ACTIVE.name))})"),
            ("energy", "energy over time", f"sum by ({cluster}) ({energy})"),
            ("job_energy", "energy per job", self.join_jobs(self.per_gpu(energy))),
            ("idle_energy", "energy of unallocated GPUs",
             f"sum by ({cluster}) ({self.per_gpu(energy)} unless {info_on} {self.selector(job.GPU_JOB_INFO.name)})"),
            ("job_steps", "steps per job", f"max by ({self.by('job_id')}) ({self.increase(train.STEPS.name)})"),
        ]
        return [Query(name, title, expr, "range") for name, title, expr in specs + self.covered_specs()]

    def covered_specs(self) -> list[tuple[str, str, str]]:
        """Per bucket, what the samples cover: sample counts (x spacing = GPU-seconds, peak-FLOP-seconds)
        and counter increases (a bucket without samples adds nothing, so a gap, a restart or a
        window longer than the data never counts time nobody measured)."""
        bucket, cluster = self.bucket, self.cluster_label
        on = f"on ({self.by('node', 'gpu')})"
        dtype = self.dtype_matcher
        peak = f"max by ({self.by('node', 'gpu')}) (max_over_time({gpu.PEAK_FLOPS.name}{{{dtype}}}[{bucket}]))"
        jobs, phases = self.by("job_id"), self.by("job_id", "phase")
        return [
            ("gpu_cover", "GPU samples", f"sum by ({cluster}) ({self.per_gpu(self.samples(gpu.UP.name))})"),
            ("peak_cover", "peak FLOP/s samples",
             f"sum by ({cluster}) ({self.per_gpu(f'sum_over_time({gpu.PEAK_FLOPS.name}{{{dtype}}}[{bucket}])')})"),
            ("alloc_cover", "allocated GPU samples", f"sum by ({cluster}) ({self.held})"),
            ("busy_cover", "busy GPU samples",
             f"sum by ({cluster}) ({self.per_gpu(self.samples(gpu.UTILIZATION.name))} and {on} ({self.busy}))"),
            ("job_cover", "allocated GPU samples per job",
             f"sum by ({self.by('job_id', 'user')}) (max by ({self.by('job_id', 'user', 'node', 'gpu')}) "
             f"({self.samples(job.GPU_JOB_INFO.name)}))"),
            ("job_busy_cover", "busy GPU samples per job", f"sum by ({jobs}) ({self.held} and {on} ({self.busy}))"),
            ("job_peak_cover", "allocated peak samples per job",
             f"sum by ({jobs}) ({self.held} * {on} group_left () {peak})"),
            ("job_hw_flops", "hardware FLOPs per job",
             f"sum by ({jobs}) ({self.increase(train.HARDWARE_FLOPS.name)})"),
            ("job_tokens", "tokens per job", f"sum by ({jobs}) ({self.increase(train.TOKENS.name)})"),
            ("job_phases", "step phases per job",
             f"sum by ({phases}) ({self.increase(train.PHASE_SECONDS.name)})"),
            ("job_checkpoint", "checkpoints per job",
             f"sum by ({jobs}) ({self.increase(train.CHECKPOINT_SECONDS.name)})"),
        ]

    def hardware_candidates(self) -> list[Query]:
        """Instant queries over the whole window naming the GPUs and ports with any hardware trouble,
        so the per-bucket queries read only those (a healthy fleet costs no per-bucket evaluation)."""
        span, at = self.span, self.window.end
        specs = [
            ("lost_candidates", "lost GPUs", f"{self.per_gpu(f'min_over_time({gpu.UP.name}[{span}])')} == 0"),
            ("nvlink_candidates", "NVLink errors",
             f"sum by ({self.by('node', 'gpu')}) (increase({gpu.NVLINK_ERRORS.name}[{span}])) > 0"),
            ("ib_candidates", "InfiniBand errors",
             f"sum by ({self.by('node', 'device', 'port')}) (increase({nic.ERRORS.name}"
             f"{{counter=~{quote(IB_ERROR_COUNTERS)}}}[{span}])) > {IB_ERRORS_PER_HOUR * self.grid.step / 3600:g} "
             f"or sum by ({self.by('node', 'device', 'port')}) (increase({nic.LINK_DOWNED.name}[{span}])) > 0"),
            ("pcie_candidates", "PCIe links",
             self.per_gpu(f"min_over_time({gpu.PCIE_WIDTH.name}[{span}]) < "
                          f"max_over_time({gpu.PCIE_MAX_WIDTH.name}[{span}])")),
            ("ecc_candidates", "ECC errors",
             f"{self.per_gpu(f'max_over_time({gpu.ECC_UNCORRECTED.name}[{span}])')} > 0"),
        ]
        return [Query(name, title, expr, "instant", at=at) for name, title, expr in specs]

    def hardware_ranges(self, nodes: dict[str, list[str]]) -> list[Query]:
        """Per-bucket hardware queries restricted to the candidates' nodes (candidate name -> nodes)."""
        bucket = self.bucket

        def on_nodes(kind: str) -> str:
            return f"node=~{quote('|'.join(re.escape(n) for n in sorted(set(nodes[kind]))))}"

        specs = []
        if nodes.get("lost_candidates"):
            m = on_nodes("lost_candidates")
            specs.append(("lost", "lost GPUs",
                          f"{self.per_gpu(f'min_over_time({gpu.UP.name}{{{m}}}[{bucket}])')} == 0"))
        if nodes.get("nvlink_candidates"):
            m = on_nodes("nvlink_candidates")
            specs.append(("nvlink_bad", "NVLink error bursts",
                          f"sum by ({self.by('node', 'gpu')}) (rate({gpu.NVLINK_ERRORS.name}{{{m}}}[{bucket}])) "
                          f"> {NVLINK_ERRORS_PER_SECOND:g}"))
        if nodes.get("ib_candidates"):
            m = on_nodes("ib_candidates")
            specs.append(("ib_bad", "InfiniBand error bursts",
                          f"sum by ({self.by('node', 'device', 'port')}) (increase({nic.ERRORS.name}"
                          f"{{counter=~{quote(IB_ERROR_COUNTERS)}, {m}}}[{bucket}])) "
                          f"> {IB_ERRORS_PER_HOUR * self.grid.step / 3600:g}"))
            specs.append(("ib_down", "InfiniBand links down",
                          f"sum by ({self.by('node', 'device', 'port')}) (increase({nic.LINK_DOWNED.name}"
                          f"{{{m}}}[{bucket}])) > 0"))
        if nodes.get("pcie_candidates"):
            m = on_nodes("pcie_candidates")
            specs.append(("pcie_bad", "PCIe downgrades",
                          self.per_gpu(f"min_over_time({gpu.PCIE_WIDTH.name}{{{m}}}[{bucket}]) < "
                                       f"{self.selector(gpu.PCIE_MAX_WIDTH.name, m)}")))
        queries = [Query(name, title, expr, "range") for name, title, expr in specs]
        if nodes.get("ecc_candidates"):
            m = on_nodes("ecc_candidates")
            queries.append(Query("ecc", "uncorrectable ECC errors",
                                 f"{self.per_gpu(self.selector(gpu.ECC_UNCORRECTED.name, m))} > 0", "range",
                                 start=self.grid.first - self.grid.step))
        return queries

    def counter_queries(self) -> list[Query]:
        """Cumulative event counters read as values per bucket, with one bucket of baseline before
        the window: XIDs (and, in hardware_ranges, uncorrectable ECC errors) are counted exactly,
        new series included."""
        start = self.grid.first - self.grid.step
        specs = [
            ("xid", "XID errors", f"max by ({self.by('node', 'gpu', 'xid')}) "
                                  f"(last_over_time({gpu.XID_ERRORS.name}[{BASELINE_LOOKBACK}]))"),
        ]
        return [Query(name, title, expr, "range", start=start) for name, title, expr in specs]

    def total_queries(self, window: Window, prefix: str = "") -> list[Query]:
        """Counter increases over the whole window, per job where jobs matter."""
        span, cluster, at = window.range(), self.cluster_label, window.end
        jobs = self.by("job_id")
        specs = [
            ("energy_total", "energy", f"sum by ({cluster}) (increase({gpu.ENERGY.name}[{span}]))"),
            ("flops_total", "model FLOPs", f"sum by ({jobs}) (increase({train.MODEL_FLOPS.name}[{span}]))"),
            ("tokens_total", "tokens", f"sum by ({jobs}) (increase({train.TOKENS.name}[{span}]))"),
        ]
        gpu_info = f"count_over_time({job.GPU_JOB_INFO.name}[{span}])"
        peak = (f"max by ({self.by('node', 'gpu')}) (max_over_time({gpu.PEAK_FLOPS.name}"
                f"{{{self.dtype_matcher}}}[{span}]))")
        job_peak = f"{gpu_info} * on ({self.by('node', 'gpu')}) group_left () {peak}"
        specs += [
            # sample counts: x the sample spacing = GPU-seconds, peak-FLOP-seconds
            ("gpu_samples", "GPU samples", f"sum by ({cluster}) (count_over_time({gpu.UP.name}[{span}]))"),
            ("peak_samples", "peak FLOP/s samples",
             f"sum by ({cluster}) (sum_over_time({gpu.PEAK_FLOPS.name}{{{self.dtype_matcher}}}[{span}]))"),
        ]
        if prefix:
            specs += [
                ("alloc_samples", "allocated GPU samples", f"sum by ({cluster}) ({gpu_info})"),
                ("job_peak_samples", "allocated peak samples", f"sum by ({cluster}) ({job_peak})"),
            ]
        else:
            specs += [
                ("alloc_samples", "allocated GPU samples", f"sum by ({self.by('job_id', 'user')}) ({gpu_info})"),
                ("job_peak_samples", "allocated peak samples", f"sum by ({jobs}) ({job_peak})"),
            ]
        if not prefix:
            specs += [self.born(name, title, counter, by) for name, title, counter, by in (
                ("born_flops", "model FLOPs of new series", train.MODEL_FLOPS.name, jobs),
                ("born_hw_flops", "hardware FLOPs of new series", train.HARDWARE_FLOPS.name, jobs),
                ("born_tokens", "tokens of new series", train.TOKENS.name, jobs),
                ("born_phases", "step phases of new series", train.PHASE_SECONDS.name, self.by("job_id", "phase")),
                ("born_checkpoint", "checkpoints of new series", train.CHECKPOINT_SECONDS.name, jobs),
            )]
            specs += [
                ("hw_flops_total", "hardware FLOPs",
                 f"sum by ({jobs}) (increase({train.HARDWARE_FLOPS.name}[{span}]))"),
                ("steps_total", "steps", f"max by ({jobs}) (increase({train.STEPS.name}[{span}]))"),
                ("phases_total", "step phases",
                 f"sum by ({self.by('job_id', 'phase')}) (increase({train.PHASE_SECONDS.name}[{span}]))"),
                ("checkpoint_total", "checkpoints",
                 f"sum by ({jobs}) (increase({train.CHECKPOINT_SECONDS.name}[{span}]))"),
                ("alerts_present", "straggler alerts",
                 f"count(last_over_time({ALERTS_STRAGGLER}[{span}]))"),
            ]
        return [Query(prefix + name, title, expr, "instant", at=at) for name, title, expr in specs]

    def born(self, name: str, title: str, counter: str, by: str) -> tuple[str, str, str]:
        """The first value of each training counter whose series begins in the window (a job or
        rank started): it counted from zero inside the covered time, before its first sample,
        which no increase between samples sees. A series seen in the BASELINE_LOOKBACK before
        the window is not new."""
        span = self.window.range()
        return (name, title, f"sum by ({by}) (min_over_time({counter}[{span}]) unless "
                             f"count_over_time({counter}[{BASELINE_LOOKBACK}] offset {span}))")

    def previous_range_queries(self, grid: Grid) -> list[Query]:
        """The window before, for week-over-week deltas: busy GPUs (the rest are instant totals)."""
        return [Query("prev_busy", "busy GPUs the week before", f"count by ({self.cluster_label}) ({self.busy})",
                      "range", start=grid.first, end=grid.end, step=grid.step)]

    # -- second phase ------------------------------------------------------------------------------
    def straggler_arrivals(self) -> Query:
        """Each rank's arrival seconds per step per bucket. The report computes from it the job
        median, the straggler flags and the straggler wait (the slowest rank's arrival minus the
        mean rank's, the rules' mean-minus-minimum comm wait): one evaluation of the counters."""
        return Query("straggler_arrivals", "arrival per rank", self.arrival(self.bucket), "range")

    def straggler_alerts(self) -> Query:
        expr = (f"max by ({self.by('job_id', 'rank', 'node', 'gpu', 'cause')}) "
                f"(max_over_time({ALERTS_STRAGGLER}[{self.bucket}]))")
        return Query("straggler_alerts", "straggler alerts", expr, "range")

    def step_time_queries(self) -> list[Query]:
        """Per bucket, the rules' share of step time lost per job (and per class), averaged over the
        bucket's evaluations; each stage's imbalance; the pipeline-stage tickets that fired. A
        backfilled history has none of them (recording-rule results)."""
        bucket = self.bucket
        specs = [
            ("step_lost", "share of step time lost",
             f"max by ({self.by('job_id')}) (avg_over_time({STEP_TIME_LOST}[{bucket}]))"),
            ("step_lost_by_class", "share of step time lost by class",
             f"max by ({self.by('job_id', 'class')}) (avg_over_time({STEP_TIME_LOST_BY_CLASS}[{bucket}]))"),
            ("stage_imbalance", "pipeline stages against the fastest",
             f"max by ({self.by('job_id', 'stage')}) (avg_over_time({STAGE_IMBALANCE}[{bucket}]))"),
            ("stage_tickets", "pipeline-stage tickets",
             f"max by ({self.by('job_id', 'stage')}) (max_over_time({ALERTS_PIPELINE}[{bucket}]))"),
            ("job_lost_progress", "lost progress",
             f"max by ({self.by('job_id')}) (avg_over_time({LOST_PROGRESS}[{bucket}]))"),
        ]
        return [Query(name, title, expr, "range") for name, title, expr in specs]

    def power_fallback(self) -> Query:
        return Query("power_avg", "average power",
                     f"sum by ({self.cluster_label}) (avg_over_time({gpu.POWER.name}[{self.span}]))", "instant",
                     at=self.window.end)

    # -- per incident ------------------------------------------------------------------------------
    def cluster_matcher(self, cluster: str) -> str:
        return f"{self.cluster_label}={quote(cluster)}"

    def straggler_detail(self, name: str, cluster: str, job_id: str, rank: str, node: str, gpu_index: str,
                         start: float, end: float) -> Query:
        """Arrival, data and other seconds per step of the rank and of its job's median rank over
        the incident, and the telemetry that names a cause, each tagged with a `signal` label."""
        rng = f"{max(int(end - start), int(self.grid.step))}s"
        cm = self.cluster_matcher(cluster)
        job_m = f"{cm}, job_id={quote(job_id)}"
        rank_m = f"{job_m}, rank={quote(rank)}"
        gpu_m = f"{cm}, node={quote(node)}, gpu={quote(gpu_index)}"
        node_m = f"{cm}, node={quote(node)}"

        def phase(name: str, matchers: str) -> str:
            labels = self.by("job_id", "rank")
            return (f"sum by ({labels}) (increase({train.PHASE_SECONDS.name}{{phase=\"{name}\", {matchers}}}[{rng}])) "
                    f"/ (sum by ({labels}) (increase({train.STEPS.name}{{{matchers}}}[{rng}])) >= 1)")

        def tag(expr: str, signal: str) -> str:
            return f'label_replace({expr}, "signal", "{signal}", "", "")'

        events = gpu.CLOCK_EVENT_ACTIVE.name
        parts = [
            tag(f"max({self.arrival(rng, rank_m)})", "arrival_rank"),
            tag(f"quantile(0.5, {self.arrival(rng, job_m)})", "arrival_median"),
            tag(f"max({phase('data', rank_m)})", "data_rank"),
            tag(f"quantile(0.5, {phase('data', job_m)})", "data_median"),
            tag(f"max({phase('other', rank_m)})", "other_rank"),
            tag(f"quantile(0.5, {phase('other', job_m)})", "other_median"),
            tag(f"max(max_over_time({events}{{{gpu_m}, reason=~\"sw_thermal|hw_thermal\"}}[{rng}]))", "thermal"),
            tag(f"max(max_over_time({events}{{{gpu_m}, reason=~\"sw_power_cap|hw_power_brake\"}}[{rng}]))", "power"),
            tag(f"max(max_over_time({events}{{{gpu_m}, reason=\"hw_slowdown\"}}[{rng}]))", "hw_slowdown"),
            tag(f"max(max_over_time({gpu.PCIE_MAX_WIDTH.name}{{{gpu_m}}}[{rng}])) - "
                f"min(min_over_time({gpu.PCIE_WIDTH.name}{{{gpu_m}}}[{rng}]))", "pcie"),
            tag(f"sum(rate({gpu.NVLINK_ERRORS.name}{{{gpu_m}}}[{rng}]))", "nvlink"),
            tag(f"sum(rate({nic.ERRORS.name}{{{node_m}, counter=~{quote(IB_ERROR_COUNTERS)}}}[{rng}])) * 3600", "nic"),
            tag(f"sum(rate({host.CPU_SECONDS.name}{{{node_m}, mode=\"busy\"}}[{rng}])) "
                f"/ sum({host.CPUS.name}{{{node_m}}})", "host_cpu"),
        ]
        return Query(name, f"straggler on {node} GPU {gpu_index}", " or ".join(parts), "instant", at=end)

    def gpu_job(self, name: str, cluster: str, node: str, gpu_index: str, at: float) -> Query:
        """Which job held a GPU around an event."""
        matchers = f"{self.cluster_matcher(cluster)}, node={quote(node)}, gpu={quote(gpu_index)}"
        expr = f"max by (job_id, user) (last_over_time({job.GPU_JOB_INFO.name}{{{matchers}}}[{self.bucket}]))"
        return Query(name, f"job of {node} GPU {gpu_index}", expr, "instant", at=at)


def probe_queries(settings: ReportSettings, window: Window) -> list[Query]:
    """What is there at all: sample counts of GPU and training series over the window."""
    span = window.range()
    return [
        Query("probe_gpu", "GPU telemetry", f"max(count_over_time({gpu.UP.name}[{span}]))", at=window.end),
        Query("probe_train", "training telemetry", f"max(count_over_time({train.STEPS.name}[{span}]))", at=window.end),
        Query("probe_prev", "the week before", f"max(count_over_time({gpu.UP.name}[{span}]))", at=window.start),
    ]


def every_query(settings: ReportSettings | None = None) -> list[Query]:
    """One query of every kind the report sends, over a nominal week (an incident's detail and a
    GPU's owner included): the series a store must hold for the report to be complete there, such
    as the global tier that shards forward to (flopwatch.mixin.tiers)."""
    settings = settings or ReportSettings()
    window = Window(0.0, 7 * 86400.0)
    grid = grid_for(window, None)
    builder = QueryBuilder(settings, window, grid, None)
    return [*probe_queries(settings, window), *builder.range_queries(), *builder.counter_queries(),
            *builder.total_queries(window), *builder.previous_range_queries(grid), *builder.hardware_candidates(),
            *builder.hardware_ranges({"n0": ["0"]}), *builder.step_time_queries(), builder.straggler_alerts(),
            builder.straggler_arrivals(), builder.power_fallback(),
            builder.straggler_detail("detail", "c", "job", "0", "n0", "0", 0.0, 3600.0),
            builder.gpu_job("owner", "c", "n0", "0", 3600.0)]
