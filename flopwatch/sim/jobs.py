"""Synchronous data-parallel training physics, one step at a time, vectorised over ranks.

Per step every rank loads data, computes forward and backward, then enters the gradient
collective. The collective starts when the slowest rank arrives, so every rank's step wall time
is the same; faster ranks record the difference as wait inside `comm`. The straggler is therefore
invisible in step time and visible only as the longest compute phase (DESIGN.md).

Base compute time comes from the job's model FLOPs, tokens per step, the GPU's dense peak and the
target MFU, calibrated so that a healthy job runs at its target MFU including the expected cost of
jitter (the mean of the maximum over ranks), and is divided by each rank's current speed.
Communication time follows the all-reduce message size over NVLink and NIC bandwidth.

Pipeline jobs (`pipeline: {stages: P, stage_weights, micro_batches: M}`): rank r is stage
r // (ranks / P) and data-parallel rank r % (ranks / P) (Megatron's order: tensor fastest, then data,
then pipeline; tensor-parallel peers are folded into one GPU's rank here). A stage's compute is its
weight times the base. Under 1F1B the bottleneck stage paces the M micro-batches and fill and
drain pass each other stage once, so a step with one heavy stage k takes about M t_k + (P - 1) t_typ:
span = max(arrival) + (P - 1) / M x median(arrival) (a rank's arrival is its M micro-batches of
compute). The bubble is paced by the typical stage, not by the bottleneck, so it does not grow with
the heavy stage; balanced pipelines get (M + P - 1) / M x their arrival as before. Every rank waits
in `comm` for the bottleneck and the bubble, then the data-parallel all-reduce and the optimizer
follow. `sequence_imbalance: X` gives a random
quarter of the ranks up to X more compute each step, so the slowest rank moves from step to step.
A job without either draws exactly the random numbers it drew before (same seed, same output).
`pipeline.reweight` changes the stage weights from a given time on (a whole stage slowing mid-run,
on every data-parallel replica): the same draws, other weights, and its lost time is stage class.

Trace jobs replay a What-if trace's per-worker phases step by step (flopwatch.traces.whatif); the
study's what-if analysis beside the trace is their truth (straggler badput and share lost per step
wall x (1 - 1/S_step)), and the worker it blames when single workers explain the slowdown. Faults
act on a trace's workers as on simulated ranks (compute over speed, extra data and other seconds):
a worker's extra time first uses up its wait above the step's comm floor (in a pipeline it waited
for a slower stage anyway), and what is left lengthens the step for every worker; that growth is
worker-class time lost on top of the study's.

Each step also carries what ground truth needs, in FlopWatch's operational definition (the one
the straggler badput truth uses too): the time lost is the mean over ranks of the wait beyond the
collective's own time, w(arrival) = max(arrival) - mean(arrival). Its classes come from the same
formula on the arrivals with, in turn, the faults removed, the stage weights removed and nothing
left but scatter: worker = w(actual) - w(no faults), stage = w(no faults) - w(no stage weights),
scattered = w(no stage weights). Not "every rank at its typical compute": that ideal counts a heavy
stage's own extra work as lost, which the What-if study's analysis of a real trace does not
(docs/detection.md). Trace jobs take the study's per-step slowdown as their truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flopwatch.hardware import GpuModel
from flopwatch.sim.scenario import FleetSpec, JobSpec
from flopwatch.sim.scenario_pipeline import PipelineSpec
from flopwatch.train.wire import PHASES

NIC_BYTES_PER_S = 50e9          # 400 Gb/s per rail (NDR InfiniBand / 400G RoCE)
GRAD_BYTES_PER_PARAM = 2        # bf16 gradients
COMM_OVERLAP = 0.9              # share of the all-reduce hidden behind backward compute
MAX_EXPOSED_COMM_SHARE = 0.15   # of a step; beyond that real jobs shard or overlap more
DATA_SHARE = 0.02               # of compute, healthy data loading
OPTIMIZER_SHARE = 0.03          # of the step
SEQ_IMBALANCE_RANKS = 0.05      # share of ranks with longer sequences in a given step
GC_PROBABILITY = 0.004          # per rank and step
GC_PAUSE_SHARE = 0.03           # of compute
SEQ_EXTRA_RANKS = 0.25          # share of ranks that get longer sequences under `sequence_imbalance`
LOST_CLASSES = ("worker", "stage", "scattered")
SLOW_STAGE_RATIO = 1.05         # a stage this much heavier than the lightest is imbalanced by design
SLOW_STAGE_MIN_SHARE = 0.2      # of a trace's slowdown explained by stage partitioning (M_S)
BAD_WORKER_MIN_SHARE = 0.5      # of a trace's slowdown explained by single workers (M_W): one is bad


def _wait(arrival: np.ndarray) -> float:
    """Mean over ranks of the time waited for the last to arrive: max - mean (0 for one rank)."""
    return float(arrival.max() - arrival.mean())


@dataclass
class RankSlowdowns:
    """Per-rank multipliers the fault engine sets; 1.0 is healthy."""

    speed: np.ndarray              # compute speed (GPU clock factor, PCIe stalls)
    data_extra: np.ndarray         # extra seconds of data loading per step (stalled loader)
    other_extra: np.ndarray        # extra seconds of host work per step (CPU contention, GC)
    comm_extra: float = 0.0        # job-wide extra collective seconds (slow NIC, NVLink errors)
    stalled: bool = False          # a lost GPU stops the job

    def reset(self) -> None:
        self.speed[:] = 1.0
        self.data_extra[:] = 0.0
        self.other_extra[:] = 0.0
        self.comm_extra = 0.0
        self.stalled = False


@dataclass
class StepResult:
    start: float
    wall: float
    phases: dict[str, np.ndarray]  # phase -> seconds per rank
    lost: bool = False             # recomputed after a restart: no progress
    lost_seconds: float = 0.0      # truth: seconds of this step lost to waiting for slower ranks
    lost_by_class: dict[str, float] = field(default_factory=dict)  # the same seconds, per class
    waiting: float = 0.0           # truth: straggler badput seconds of this step (mean wait over ranks)


@dataclass
class JobRunner:
    spec: JobSpec
    fleet: FleetSpec
    rng: np.random.Generator
    ranks: int = 0
    flops_per_step: float = 0.0
    hw_flops_per_step: float = 0.0
    target_wall: float = 0.0
    compute_base: float = 0.0
    comm_exposed: float = 0.0
    optimizer: float = 0.0
    slow: RankSlowdowns = field(init=False)
    clock: float = 0.0             # simulated time the job has progressed to
    steps: int = 0
    next_checkpoint: float = 0.0
    steps_since_checkpoint: int = 0
    replay_steps: int = 0          # steps to redo after a restart (lost progress)
    stage: np.ndarray = field(init=False)     # pipeline stage per rank
    dp_rank: np.ndarray = field(init=False)   # data-parallel rank per rank (position within its stage)
    weight: np.ndarray = field(init=False)    # the rank's stage weight (1.0 without a pipeline)
    slots: float = 1.0                        # (M + P - 1) / M: a balanced pipeline's span over one pass
    trace_phases: np.ndarray | None = None    # (steps, ranks, phases) seconds of a replayed trace
    trace_index: int = 0
    trace_slowdown: np.ndarray | None = None  # the study's S per trace step (its truth), when published
    trace_classes: tuple[float, float] = (0.0, 0.0)   # the study's M_W, M_S
    trace_stage_slowdown: dict[int, float] = field(default_factory=dict)
    trace_dp_slowdown: dict[int, float] = field(default_factory=dict)
    reweighted: int = 0                       # `pipeline.reweight` changes in force so far

    def __post_init__(self) -> None:
        model: GpuModel = self.fleet.gpu_model
        self.ranks = self.spec.ranks(self.fleet.gpus_per_node)
        self._layout()
        per_token = self.spec.model.model_flops_per_token()
        self.flops_per_step = per_token * self.spec.tokens_per_step
        # full activation recomputation runs the forward pass twice: 8N + 16·L·H·Q·T (HFU)
        self.hw_flops_per_step = self.spec.model.hardware_flops_per_token("full" if self.spec.recompute else "none") * \
            self.spec.tokens_per_step
        peak = model.peak_dense_flops["bf16"]
        self.target_wall = self.flops_per_step / (self.ranks * peak * self.spec.target_mfu)
        self.comm_exposed = min(self.all_reduce_seconds() * (1 - COMM_OVERLAP),
                                MAX_EXPOSED_COMM_SHARE * self.target_wall)
        self.optimizer = OPTIMIZER_SHARE * self.target_wall
        self.slow = RankSlowdowns(np.ones(self.ranks), np.zeros(self.ranks), np.zeros(self.ranks))
        budget = self.target_wall - self.comm_exposed - self.optimizer
        self.compute_base = budget / self._expected_span()
        self.clock = self.spec.start
        self.next_checkpoint = self.spec.start + self.spec.checkpoint_every

    def _layout(self) -> None:
        """Stage and dp rank of every rank (Megatron order), stage weights, the 1F1B span; a trace's own."""
        ranks = np.arange(self.ranks)
        pipe: PipelineSpec | None = self.spec.pipeline
        self.weight = np.ones(self.ranks)
        if self.spec.trace is not None:
            from flopwatch.traces import whatif

            trace = whatif.load_cached(self.spec.trace.path)
            self.stage = np.array([w.stage for w in trace.workers])
            self.dp_rank = np.array([w.dp_rank for w in trace.workers])
            wall = trace.step_seconds.max(axis=1, keepdims=True)
            phases = trace.phases.copy()
            phases[:, :, PHASES.index("comm")] += wall - trace.step_seconds   # everyone waits for the last
            self.trace_phases = phases * self.spec.trace.time_scale
            self._trace_truth(trace)
        elif pipe is None:
            self.stage, self.dp_rank = np.zeros(self.ranks, dtype=int), ranks
        else:
            per_stage = self.ranks // pipe.stages
            self.stage, self.dp_rank = ranks // per_stage, ranks % per_stage
            self.weight = np.asarray(pipe.stage_weights, dtype=float)[self.stage]
            self.slots = (pipe.micro_batches + pipe.stages - 1) / pipe.micro_batches

    def slow_stage(self) -> int | None:
        """The stage that is heavier by design (stage weights, or the study's by-stage slowdown), if any."""
        pipe = self.spec.pipeline
        if pipe is not None:   # the most imbalanced of the job's weights, at start or after a reweight
            weights = max((pipe.stage_weights, *(w for _, w in pipe.reweight)), key=lambda w: max(w) / min(w))
            return int(np.argmax(weights)) if max(weights) > SLOW_STAGE_RATIO * min(weights) else None
        if self.trace_stage_slowdown and self.trace_classes[1] > SLOW_STAGE_MIN_SHARE:
            return max(self.trace_stage_slowdown, key=self.trace_stage_slowdown.get)
        return None

    def _trace_truth(self, trace) -> None:
        """The study's per-step slowdown and class shares (result-, mw-, ms-*.json beside the trace)."""
        from flopwatch.traces import whatif

        try:
            study = whatif.study_result(trace.path)
        except whatif.TraceError:
            return   # no published analysis: the comm-floor estimate stands in (scattered)
        self.trace_slowdown = np.array([study.per_step.get(s, study.slowdown) for s in trace.steps])
        self.trace_classes = (study.worker_share or 0.0, study.stage_share or 0.0)
        self.trace_stage_slowdown = study.by_stage
        self.trace_dp_slowdown = study.by_dp_rank

    def trace_bad_worker(self) -> tuple[int, float] | None:
        """(rank, slowdown) of the worker a trace's study blames, when single workers explain most of it.

        The study's M_W above BAD_WORKER_MIN_SHARE means one worker is slow (AR): the dp rank and
        the stage whose recorded durations alone give the largest slowdown locate it; its slowdown
        is that dp rank's S - 1. None for simulated jobs and for traces of imbalance.
        """
        if self.trace_classes[0] <= BAD_WORKER_MIN_SHARE or not self.trace_dp_slowdown or not self.trace_stage_slowdown:
            return None
        dp = max(self.trace_dp_slowdown, key=self.trace_dp_slowdown.get)
        stage = max(self.trace_stage_slowdown, key=self.trace_stage_slowdown.get)
        at = np.flatnonzero((self.dp_rank == dp) & (self.stage == stage))
        return (int(at[0]), self.trace_dp_slowdown[dp] - 1.0) if at.size else None

    @property
    def healthy_step(self) -> float:
        """The step a host or network fault's `slowdown` is a fraction of: the target step, or a
        replayed trace's mean recorded step (its model and target MFU only label its FLOPs)."""
        if self.trace_phases is None:
            return self.target_wall
        return float(self.trace_phases.sum(axis=2)[:, 0].mean())

    def all_reduce_seconds(self) -> float:
        """Ring all-reduce of bf16 gradients: 2(n-1)/n x bytes over the slowest link in the ring."""
        n = self.ranks
        if n <= 1:
            return 0.0
        size = GRAD_BYTES_PER_PARAM * self.spec.model.params
        model = self.fleet.gpu_model
        nvlink = max(model.nvlink_links * model.nvlink_link_bytes_per_second, 1e9)
        if len(self.spec.nodes) > 1 and self.fleet.nics_per_node:
            bandwidth = min(nvlink, self.fleet.nics_per_node * NIC_BYTES_PER_S / self.fleet.gpus_per_node)
        else:
            bandwidth = nvlink
        return 2 * (n - 1) / n * size / bandwidth

    def nic_bytes_per_step(self) -> float:
        """Bytes each node sends (and receives) over its NICs per step, over all rails."""
        if len(self.spec.nodes) <= 1 or not self.fleet.nics_per_node:
            return 0.0
        n = self.ranks
        return 2 * (n - 1) / n * GRAD_BYTES_PER_PARAM * self.spec.model.params

    def nvlink_bytes_per_step(self) -> float:
        """Bytes each GPU sends over NVLink per step (intra-node reduce-scatter + all-gather)."""
        gpn = self.fleet.gpus_per_node
        return 2 * (gpn - 1) / gpn * GRAD_BYTES_PER_PARAM * self.spec.model.params / gpn if gpn > 1 else 0.0

    # -- one step ------------------------------------------------------------------------------
    def _arrival_factors(self, rng: np.random.Generator, size: tuple[int, ...]) -> tuple[np.ndarray, ...]:
        """Relative data, compute and other times of healthy ranks (multiples of compute_base)."""
        jitter = self.spec.step_jitter
        compute = 1 + rng.normal(0, jitter, size)
        longer = rng.random(size) < SEQ_IMBALANCE_RANKS  # sequence-length imbalance, moves each step
        compute = compute + longer * rng.uniform(0, 2 * jitter, size)
        data = DATA_SHARE * (1 + 0.2 * np.abs(rng.normal(0, 1, size)))
        other = (rng.random(size) < GC_PROBABILITY) * GC_PAUSE_SHARE
        return data, np.maximum(compute, 0.5), other

    def _sequence_extra(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray | float:
        """Relative extra compute of longer sequences (none drawn when the job has no imbalance)."""
        x = self.spec.sequence_imbalance
        if not x:
            return 0.0
        return (rng.random(size) < SEQ_EXTRA_RANKS) * rng.uniform(0, x, size)

    def _expected_span(self) -> float:
        """Mean span of a healthy step in compute_base units, so that the job runs at its target MFU."""
        calibration = np.random.default_rng([self.ranks, int(self.spec.step_jitter * 1e6)])
        data, compute, other = self._arrival_factors(calibration, (256, self.ranks))
        if self.spec.pipeline is not None or self.spec.sequence_imbalance:
            compute = compute * self.weight + self._sequence_extra(calibration, (256, self.ranks)) * self.weight
        arrival = data + compute + other
        if self.slots == 1.0:
            return float(np.mean(np.max(arrival, axis=1)))   # as before pipelines: same numbers
        return float(np.mean(np.max(arrival, axis=1) + (self.slots - 1) * np.median(arrival, axis=1)))

    def _span(self, arrival: np.ndarray) -> float:
        """Span of one step's compute: the slowest rank, plus the 1F1B bubble at the typical rank's pace.

        The bottleneck paces the M micro-batches (max(arrival) = M t_k); fill and drain cross every
        other stage once ((P - 1) t_typ = (slots - 1) x median(arrival)). Without a pipeline: the max.
        """
        slowest = float(arrival.max())
        return slowest if self.slots == 1.0 else slowest + (self.slots - 1) * float(np.median(arrival))

    def _truth(self, result: StepResult, parts: tuple[np.ndarray, ...], arrival: np.ndarray) -> None:
        """Lost seconds (mean wait beyond the collective) and their classes: faults, stage weights, scatter.

        The same w = max - mean on the arrivals as they were, without the faults' slowdowns, and
        also without the stage weights (every stage at the median weight); what each removal takes
        away is its class's share, the rest is scattered (jitter, sequence lengths, GC).
        """
        data, compute, other = parts                 # healthy factors (multiples of compute_base)
        base = self.compute_base
        healthy = base * (data + compute + other)    # no fault slowdowns, stage weights kept
        flat = base * (data + compute / self.weight * float(np.median(self.weight)) + other)
        waits = [_wait(a) for a in (arrival, healthy, flat)]
        result.waiting = result.lost_seconds = waits[0]
        result.lost_by_class = {"worker": max(0.0, waits[0] - waits[1]), "stage": max(0.0, waits[1] - waits[2]),
                                "scattered": max(0.0, waits[2])}

    def step(self) -> StepResult:
        result = self._trace_step() if self.trace_phases is not None else self._physics_step()
        self.clock += result.wall
        if self.replay_steps > 0:
            self.replay_steps -= 1
            result.lost = True
        else:
            self.steps += 1
            self.steps_since_checkpoint += 1
        return result

    def _reweight(self) -> None:
        """Take up the `pipeline.reweight` stage weights whose time has come (at the step's start)."""
        changes = self.spec.pipeline.reweight if self.spec.pipeline is not None else ()
        while self.reweighted < len(changes) and self.clock >= changes[self.reweighted][0]:
            self.weight = np.asarray(changes[self.reweighted][1], dtype=float)[self.stage]
            self.reweighted += 1

    def _physics_step(self) -> StepResult:
        self._reweight()
        data, compute, other = self._arrival_factors(self.rng, (self.ranks,))
        if self.spec.pipeline is not None or self.spec.sequence_imbalance:
            compute = (compute + self._sequence_extra(self.rng, (self.ranks,))) * self.weight
        base = self.compute_base
        s = self.slow
        data_s = base * data + s.data_extra
        compute_s = base * compute / s.speed
        other_s = base * other + s.other_extra
        arrival = data_s + compute_s + other_s
        span = self._span(arrival)
        comm_run = self.comm_exposed + s.comm_extra
        wait = span - arrival
        wall = span + comm_run + self.optimizer
        result = StepResult(
            start=self.clock, wall=wall,
            phases={"data": data_s, "compute": compute_s, "comm": wait + comm_run,
                    "optimizer": np.full(self.ranks, self.optimizer), "other": other_s},
        )
        self._truth(result, (data, compute, other), arrival)
        return result

    def _trace_step(self) -> StepResult:
        """The trace's next step (from the first again after the last): phases as recorded, scaled."""
        assert self.trace_phases is not None
        phases = self.trace_phases[self.trace_index % len(self.trace_phases)]
        self.trace_index += 1
        recorded = float(phases[0].sum())
        phases, grown = self._trace_faults(phases)
        wall = float(phases[0].sum())
        comm = phases[:, PHASES.index("comm")]
        floor = float(comm.min())
        result = StepResult(start=self.clock, wall=wall,
                            phases={name: phases[:, i].copy() for i, name in enumerate(PHASES)})
        if self.trace_slowdown is None:   # no published analysis: the wait above the comm floor
            lost, worker, stage = float(comm.mean() - floor), 0.0, 0.0
            scattered = max(0.0, lost)
        else:   # the study is the truth: its per-step slowdown S of the step as recorded, split by its
            # M_W and M_S; what the faults added to the step is worker-class time lost on top
            lost = recorded * (1 - 1 / self.trace_slowdown[(self.trace_index - 1) % len(self.trace_slowdown)])
            worker = min(1.0, max(0.0, self.trace_classes[0])) * lost
            stage = min(lost - worker, max(0.0, self.trace_classes[1]) * lost)
            scattered = max(0.0, lost - worker - stage)
            lost, worker = lost + grown, worker + grown
        result.waiting = result.lost_seconds = lost
        result.lost_by_class = {"worker": worker, "stage": stage, "scattered": scattered}
        return result

    def _trace_faults(self, phases: np.ndarray) -> tuple[np.ndarray, float]:
        """A trace step's phases under the faults' slowdowns, and the seconds the step grew by.

        Each worker's compute is divided by its speed and its data and other phases grow by the
        faults' extra seconds. That extra time first uses up the worker's wait above the step's comm
        floor (the least any worker spent in comm: the collective's own time); what is left
        lengthens the step, and every other worker waits that much longer in comm. A comm fault
        adds its seconds to every worker's comm. Unchanged (and 0.0) without an active fault.
        """
        s = self.slow
        if s.speed.min() >= 1.0 and not s.data_extra.any() and not s.other_extra.any() and not s.comm_extra:
            return phases, 0.0
        out = phases.copy()
        c, d, o, m = (PHASES.index(name) for name in ("compute", "data", "other", "comm"))
        out[:, c] = phases[:, c] / s.speed
        out[:, d] = phases[:, d] + s.data_extra
        out[:, o] = phases[:, o] + s.other_extra
        extra = (out[:, c] - phases[:, c]) + s.data_extra + s.other_extra
        slack = phases[:, m] - float(phases[:, m].min())
        grown = float(np.maximum(extra - slack, 0.0).max())
        out[:, m] = phases[:, m] + grown + s.comm_extra - extra
        return out, grown

    def restart(self, at: float, lost_steps: int) -> None:
        """After a crash the job resumes at `at` and must redo the steps since its last checkpoint."""
        self.clock = max(self.clock, at)
        self.replay_steps += lost_steps
        self.steps_since_checkpoint = 0
