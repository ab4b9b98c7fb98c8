"""Synchronous data-parallel training physics, one step at a time, vectorised over ranks.

Per step every rank loads data, computes forward and backward, then enters the gradient
collective. The collective starts when the slowest rank arrives, so every rank's step wall time
is the same; faster ranks record the difference as wait inside `comm`. The straggler is therefore
invisible in step time and visible only as the longest compute phase (DESIGN.md).

Base compute time comes from the job's model FLOPs, tokens per step, the GPU's dense peak and the
target MFU, calibrated so that a healthy job runs at its target MFU including the expected cost of
jitter (the mean of the maximum over ranks), and is divided by each rank's current speed.
Communication time follows the all-reduce message size over NVLink and NIC bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flopwatch.hardware import GpuModel
from flopwatch.sim.scenario import FleetSpec, JobSpec

PHASES = ("data", "compute", "comm", "optimizer", "other")
NIC_BYTES_PER_S = 50e9          # 400 Gb/s per rail (NDR InfiniBand / 400G RoCE)
GRAD_BYTES_PER_PARAM = 2        # bf16 gradients
COMM_OVERLAP = 0.9              # share of the all-reduce hidden behind backward compute
MAX_EXPOSED_COMM_SHARE = 0.15   # of a step; beyond that real jobs shard or overlap more
DATA_SHARE = 0.02               # of compute, healthy data loading
OPTIMIZER_SHARE = 0.03          # of the step
SEQ_IMBALANCE_RANKS = 0.05      # share of ranks with longer sequences in a given step
GC_PROBABILITY = 0.004          # per rank and step
GC_PAUSE_SHARE = 0.03           # of compute


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

    def __post_init__(self) -> None:
        model: GpuModel = self.fleet.gpu_model
        self.ranks = len(self.spec.nodes) * self.fleet.gpus_per_node
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
        self.compute_base = budget / self._expected_max_arrival()
        self.clock = self.spec.start
        self.next_checkpoint = self.spec.start + self.spec.checkpoint_every

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

    def _expected_max_arrival(self) -> float:
        calibration = np.random.default_rng([self.ranks, int(self.spec.step_jitter * 1e6)])
        data, compute, other = self._arrival_factors(calibration, (256, self.ranks))
        return float(np.mean(np.max(data + compute + other, axis=1)))

    def step(self) -> StepResult:
        data, compute, other = self._arrival_factors(self.rng, (self.ranks,))
        base = self.compute_base
        s = self.slow
        data_s = base * data + s.data_extra
        compute_s = base * compute / s.speed
        other_s = base * other + s.other_extra
        arrival = data_s + compute_s + other_s
        slowest = float(arrival.max())
        comm_run = self.comm_exposed + s.comm_extra
        wait = slowest - arrival
        wall = slowest + comm_run + self.optimizer
        result = StepResult(
            start=self.clock, wall=wall,
            phases={"data": data_s, "compute": compute_s, "comm": wait + comm_run,
                    "optimizer": np.full(self.ranks, self.optimizer), "other": other_s},
        )
        self.clock += wall
        if self.replay_steps > 0:
            self.replay_steps -= 1
            result.lost = True
        else:
            self.steps += 1
            self.steps_since_checkpoint += 1
        return result

    def restart(self, at: float, lost_steps: int) -> None:
        """After a crash the job resumes at `at` and must redo the steps since its last checkpoint."""
        self.clock = max(self.clock, at)
        self.replay_steps += lost_steps
        self.steps_since_checkpoint = 0
