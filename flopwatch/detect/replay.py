"""Replaying recorded training steps through the real training client and the agent's intake.

A What-if trace (flopwatch.traces.whatif) records every worker's phases step by step. Here each
worker becomes a `StepMonitor` (the client a training job links) with its pipeline stage and
data-parallel rank, reporting each step with `record_step`; its datagrams go over a real Unix
datagram socket to the node's `TrainIntake` (the agent's own collector), eight workers to a node
as GPUs are; and each scrape tick renders the intakes' families as Prometheus would store them.
`PrometheusEngine.evaluate` then runs the shipped rules over those samples faster than wall-clock.

Two seams stand in for what needs a live process: the simulated clock (a step "ends" when the
replay's time passes it; the intake is handed that time), and the intake's reader thread (the
replay drains each node's socket itself after the steps of a tick, so no datagram can be lost to
a full kernel queue). GPU attribution (`flopwatch_gpu_job_info`) is emitted for each worker's GPU
as the attribution collector would from the Slurm mapping directory.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flopwatch.catalog import all_metrics
from flopwatch.catalog import job as job_metrics
from flopwatch.config import TrainOptions
from flopwatch.detect import rules
from flopwatch.detect.alerts import Episode
from flopwatch.detect.engine import START_UNIX, Progress, PrometheusEngine
from flopwatch.detect.fast_sampler import SCRAPE_JOB, Group, Labels
from flopwatch.exporters.train_intake import TrainIntake
from flopwatch.traces.whatif import Trace
from flopwatch.train import StepMonitor, wire

GPUS_PER_NODE = 8


@dataclass
class ReplayedJob:
    """One trace replayed as a job: its steps in order, looped, with durations divided by `time_scale`."""

    job_id: str
    trace: Trace
    time_scale: float = 1.0
    monitors: list[StepMonitor] = field(default_factory=list)
    next_step_at: float = 0.0      # replay seconds at which the current step ends
    step: int = 0                  # steps replayed so far

    def step_row(self) -> tuple[float, np.ndarray]:
        """(wall seconds of the current step, phases per worker); every worker's step lasts as long
        as the slowest worker's (a synchronous step), the difference waited in comm."""
        index = self.step % len(self.trace.steps)
        phases = self.trace.phases[index] / self.time_scale
        seconds = self.trace.step_seconds[index] / self.time_scale
        wall = float(seconds.max())
        phases = phases.copy()
        phases[:, wire.PHASE_INDEX["comm"]] += wall - seconds
        return wall, phases


class TraceReplay:
    """A `SampleSource` (flopwatch.detect.engine) of traces replayed as jobs on their own nodes."""

    def __init__(self, jobs: list[ReplayedJob], start_unix: float) -> None:
        self.jobs = jobs
        self.now_unix = start_unix
        self.elapsed = 0.0
        self._dir = tempfile.TemporaryDirectory(prefix="flopwatch-replay-")
        self.nodes: list[_Node] = []
        for job in jobs:
            self._place(job)

    def _place(self, job: ReplayedJob) -> None:
        trace = job.trace
        for first in range(0, len(trace.workers), GPUS_PER_NODE):
            node = _Node(f"{job.job_id}-node{first // GPUS_PER_NODE:03d}", Path(self._dir.name), job.job_id)
            self.nodes.append(node)
            for gpu, worker in enumerate(trace.workers[first:first + GPUS_PER_NODE]):
                job.monitors.append(StepMonitor(
                    job_id=job.job_id, rank=worker.rank, gpu=gpu, local_rank=gpu, socket_path=str(node.path),
                    min_interval=0, environ={}, pp_stage=worker.stage, pp_size=trace.pp_size,
                    dp_rank=worker.dp_rank, dp_size=trace.dp_size))
                node.gpus.append(gpu)
        job.next_step_at, _ = job.step_row()

    def advance(self, dt: float) -> None:
        """Move on by `dt`: every step that ends by then is reported by each worker's client."""
        self.elapsed += dt
        self.now_unix += dt
        for job in self.jobs:
            while job.next_step_at <= self.elapsed:
                wall, phases = job.step_row()
                for monitor, row in zip(job.monitors, phases, strict=True):
                    monitor.record_step(wall, dict(zip(wire.PHASES, row.tolist(), strict=True)))
                for node in self.nodes:
                    node.drain(self.now_unix)
                job.step += 1
                job.next_step_at += job.step_row()[0]

    def sample(self) -> Iterator[Group]:
        for node in self.nodes:
            yield from node.sample()

    def close(self) -> None:
        for job in self.jobs:
            for monitor in job.monitors:
                monitor.close()
        for node in self.nodes:
            node.close()
        self._dir.cleanup()

    def __enter__(self) -> TraceReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Node:
    """One node's step socket and the agent's intake reading it."""

    def __init__(self, name: str, directory: Path, job_id: str) -> None:
        self.name, self.job_id = name, job_id
        self.path = directory / f"{name}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        options = TrainOptions(socket=str(self.path), socket_group=None, max_jobs=64, max_ranks=4096,
                               expiry=3600.0)
        self.intake = TrainIntake(options, name, start=False)
        self.gpus: list[int] = []

    def drain(self, wall: float) -> None:
        now = time.monotonic()
        with contextlib.suppress(BlockingIOError):
            while True:
                self.intake.handle(self.sock.recv(wire.MAX_DATAGRAM + 1), now, wall)

    def sample(self) -> Iterator[Group]:
        self.intake.update()
        yield (_labels("up", {"node": self.name}, self.name),), [1.0]
        info = job_metrics.GPU_JOB_INFO
        yield tuple(_labels(info.name, {"node": self.name, "gpu": str(gpu), "job_id": self.job_id, "user": "replay"},
                            self.name) for gpu in self.gpus), [1.0] * len(self.gpus)
        for family in self.intake.collect():
            labels, values = [], []
            for sample in family.samples:
                labels.append(_labels(sample.name, sample.labels, self.name))
                values.append(float(sample.value))
            if labels:
                yield tuple(labels), values

    def close(self) -> None:
        self.sock.close()


def _labels(name: str, pairs: dict[str, str], instance: str) -> Labels:
    """Labels as a scrape stores them: empty values dropped, the scrape's job and instance added."""
    items = {k: v for k, v in pairs.items() if v != ""}
    items["job"], items["instance"] = SCRAPE_JOB, instance
    return tuple(sorted([("__name__", name), *items.items()]))


#: Recorded series a replay keeps, to compare with the study's what-if results.
OBSERVED = ("job_id:flopwatch_step_time_lost:ratio", "job_id_class:flopwatch_step_time_lost:ratio",
            "job_id_stage:flopwatch_stage_imbalance:ratio", "job_id:flopwatch_goodput:ratio",
            "job_id:flopwatch_badput:ratio")


@dataclass
class ReplayResult:
    """Alerts that fired and recorded series, per job, from one replay through the shipped rules."""

    episodes: list[Episode]
    observed: dict[str, list[tuple[dict[str, str], np.ndarray, np.ndarray]]]
    end_unix: float

    def fired(self, alertname: str, job_id: str) -> list[dict[str, str]]:
        """Distinct label sets of `alertname` that fired for `job_id`."""
        seen = {tuple(sorted(e.labels.items())) for e in self.episodes
                if e.alertname == alertname and e.labels.get("job_id") == job_id}
        return [dict(labels) for labels in sorted(seen)]

    def mean(self, record: str, job_id: str, last_s: float = 300.0, **labels: str) -> float | None:
        """Mean of a recorded series of `job_id` (matching `labels`) over the replay's last `last_s`."""
        values = [vals[stamps > self.end_unix - last_s] for metric, stamps, vals in self.observed.get(record, [])
                  if metric.get("job_id") == job_id and all(metric.get(k) == v for k, v in labels.items())]
        joined = np.concatenate(values) if values else np.zeros(0)
        return float(joined.mean()) if len(joined) else None


def replay(jobs: list[ReplayedJob], rules_path: str | Path, seconds: float, scrape_interval: float = 5.0,
           progress: Progress | None = None) -> ReplayResult:
    """Replay `jobs` through the rules in `rules_path` (a rule file or folder) for `seconds`."""
    produced = {"up"}
    for _, metric in all_metrics():
        produced.add(metric.name)
        if metric.type == "histogram":
            produced |= {metric.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    engine = PrometheusEngine(rules.load(rules_path, 15.0), chunk=300.0, observe=OBSERVED, produced=produced)
    with TraceReplay(jobs, START_UNIX) as source:
        result = engine.evaluate(source, seconds, scrape_interval, "replay", progress)
        end = source.now_unix
    return ReplayResult(result.episodes, result.observed, end)
