"""The simulated fleet's state records: a node with its GPUs and NICs, a job's runner, counters and
truth, and the per-rank counters its training client would report. Apart from fleet.py (which
advances them) so that the fabric's faults (fabric.py) read the same records without importing the
fleet that holds them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from flopwatch.catalog import train as train_metrics
from flopwatch.exporters.gpu.simulated import SimulatedGpu
from flopwatch.sim.jobs import PHASES, JobRunner, StepResult
from flopwatch.sim.nic import SimulatedNic
from flopwatch.sim.truth import JobTruth
from flopwatch.train.wire import ARRIVAL_INDEX, COMM_MIN_BLOCK

#: Rows of RankCounters.recent's totals: arrival, then the recent gauges' host-side phases.
_RECENT_ROWS = (list(ARRIVAL_INDEX), *(PHASES.index(phase) for phase in train_metrics.RECENT_PHASES))

#: Step-time histogram bounds: the intake's (catalogue) plus +Inf.
STEP_BUCKETS = (*train_metrics.STEP_BUCKETS, math.inf)


@dataclass
class RankCounters:
    """What the training client reports per rank, accumulated as the agent's intake would."""

    ranks: int
    steps: np.ndarray = field(init=False)
    tokens: np.ndarray = field(init=False)
    model_flops: np.ndarray = field(init=False)
    hardware_flops: np.ndarray = field(init=False)
    phase_seconds: np.ndarray = field(init=False)        # [phase, rank]
    checkpoint_seconds: np.ndarray = field(init=False)
    last_step_time: np.ndarray = field(init=False)       # unix seconds
    step_buckets: np.ndarray = field(init=False)         # cumulative count per bucket (job-wide)
    step_sum: float = 0.0
    step_count: int = 0
    comm_min: np.ndarray = field(init=False)     # shortest comm of a step over the last completed block
    comm_block_min: np.ndarray = field(init=False)
    comm_block_steps: int = 0
    comm_min_ready: bool = False                 # a block has completed: the gauge exists
    iteration: int = 0                           # the job's training iteration of the last step
    replayed_steps: int = 0                      # steps that redid iterations (as the agent counts them)
    replayed_seconds: float = 0.0                # their step wall time, per rank
    #: (end unix s, step count, totals [arrival, data, other] x rank) of the steps the agent's recent
    #: window still needs: the newest that starts a full window and every one after it.
    recent: deque[tuple[float, int, np.ndarray]] = field(init=False)

    def __post_init__(self) -> None:
        r = self.ranks
        self.comm_min, self.comm_block_min = np.zeros(r), np.full(r, np.inf)
        self.steps, self.tokens = np.zeros(r), np.zeros(r)
        self.model_flops, self.hardware_flops = np.zeros(r), np.zeros(r)
        self.phase_seconds = np.zeros((len(PHASES), r))
        self.checkpoint_seconds = np.zeros(r)
        self.last_step_time = np.zeros(r)
        self.step_buckets = np.zeros(len(STEP_BUCKETS))
        self.recent = deque()

    def observe_step(self, runner: JobRunner, step: StepResult, unix_end: float) -> None:
        r = self.ranks
        self.steps += 1
        self.tokens += runner.spec.tokens_per_step / r
        self.model_flops += runner.flops_per_step / r
        self.hardware_flops += runner.hw_flops_per_step / r
        for i, phase in enumerate(PHASES):
            self.phase_seconds[i] += step.phases[phase]
        np.minimum(self.comm_block_min, step.phases["comm"], out=self.comm_block_min)
        self.comm_block_steps += 1
        if self.comm_block_steps == COMM_MIN_BLOCK:   # as the client does: a floor per block of steps
            self.comm_min[:] = self.comm_block_min
            self.comm_block_min[:] = np.inf
            self.comm_block_steps = 0
            self.comm_min_ready = True
        self.last_step_time[:] = unix_end
        # a restart from a checkpoint resumes below the iteration reached before (replayed steps)
        self.iteration = runner.steps - runner.replay_steps
        self.step_buckets += np.array([step.wall <= bound for bound in STEP_BUCKETS])
        self.step_sum += step.wall
        self.step_count += 1
        if step.lost:
            self.replayed_steps += 1
            self.replayed_seconds += step.wall
        self._remember(unix_end)

    def _remember(self, unix_end: float) -> None:
        """Keep this step's totals for the recent window, as the agent keeps each report's, and drop
        the steps no later window can start at."""
        p = self.phase_seconds
        totals = np.stack([p[_RECENT_ROWS[0]].sum(axis=0), *(p[row] for row in _RECENT_ROWS[1:])])
        recent = self.recent
        recent.append((unix_end, self.step_count, totals))
        starts = train_metrics.starts_recent_window
        while len(recent) > 2 and starts(unix_end - recent[1][0], self.step_count - recent[1][1]):
            recent.popleft()

    def recent_window(self, now_unix: float) -> np.ndarray | None:
        """Per step over the recent window, rows arrival then RECENT_PHASES, a column per rank
        (flopwatch_train_recent_*_seconds): None where the agent exports no such gauge."""
        if len(self.recent) < 2:
            return None
        first, last = self.recent[0], self.recent[-1]
        stale = now_unix - last[0] > train_metrics.RECENT_STALE_S
        if stale or not train_metrics.starts_recent_window(last[0] - first[0], last[1] - first[1]):
            return None
        return (last[2] - first[2]) / (last[1] - first[1])




@dataclass
class SimNode:
    index: int
    name: str
    gpus: list[SimulatedGpu]
    nics: list[SimulatedNic]
    job_id: str | None = None
    host_cpu_busy: float = 0.05
    numa_nodes: int = 2
    cpus_per_numa: int = 56
    cpu_seconds: dict[str, float] = field(default_factory=lambda: {"busy": 0.0, "idle": 0.0, "iowait": 0.0,
                                                                   "steal": 0.0})
    cpu_pressure_some_s: float = 0.0

    def advance_host(self, dt: float) -> None:
        """CPU time by mode over all cores, and PSI cpu stall once the cores are saturated."""
        total = self.numa_nodes * self.cpus_per_numa * dt
        busy = min(1.0, self.host_cpu_busy)
        self.cpu_seconds["busy"] += busy * total
        self.cpu_seconds["iowait"] += 0.005 * total
        self.cpu_seconds["idle"] += max(0.0, 1 - busy - 0.005) * total
        self.cpu_pressure_some_s += dt * min(1.0, max(0.0, busy - 0.85) * 6)


@dataclass
class JobState:
    runner: JobRunner
    counters: RankCounters
    truth: JobTruth
    pending: StepResult | None = None
    last_step: StepResult | None = None
    finished_at: float | None = None   # sim time the job ended
    restarted_faults: set[int] = field(default_factory=set)
    checkpoint_iteration: int = 0      # the iteration its last checkpoint saved (a restart resumes there)

    def rank_of(self, node: int, gpu: int) -> int | None:
        nodes = self.runner.spec.nodes
        if node not in nodes:
            return None
        return nodes.index(node) * self.runner.fleet.gpus_per_node + gpu
