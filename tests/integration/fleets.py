"""Simulated fleets shared by the integration tests, a context manager that serves one, and
training ranks stepping in threads through the real client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import Scenario, parse
from flopwatch.sim.serve import FleetServer
from flopwatch.train import StepMonitor

MODEL_8B = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}


def two_jobs_48_gpus(name: str, seed: int) -> Scenario:
    """6 H100 nodes at 1 s ticks: job-a on nodes 0-2 at 42% MFU, job-b on 3-4 at 30%, node 5 idle."""
    return parse({
        "name": name, "seed": seed, "duration": "1h", "scrape_interval": "1s",
        "fleet": {"nodes": 6, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
        "jobs": [
            {"id": "job-a", "nodes": "0-2", "model": MODEL_8B, "tokens_per_step": 131072, "target_mfu": 0.42,
             "step_jitter": 0.01},
            {"id": "job-b", "nodes": "3-4", "model": MODEL_8B, "tokens_per_step": 65536, "target_mfu": 0.30,
             "step_jitter": 0.01},
        ],
        "faults": [],
    })


def llm_8b_32_ranks(name: str, seed: int, nodes: int, scrape_s: int) -> Scenario:
    """32 ranks (nodes 0-3 x 8 H100s) of an 8B model at ~4.5 s per step, 2% jitter; other nodes idle."""
    return parse({
        "name": name, "seed": seed, "duration": "1h", "scrape_interval": f"{scrape_s}s",
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 4},
        "jobs": [{"id": "llm-8b", "nodes": "0-3", "model": MODEL_8B, "tokens_per_step": 1048576,
                  "target_mfu": 0.45, "step_jitter": 0.02}],
        "faults": [],
    })


@contextmanager
def serving(fleet: Scenario | Fleet, tick: float | None = None) -> Iterator[FleetServer]:
    """Serve a fleet's nodes on loopback (a scenario's starts now), advancing it in real time every
    `tick` seconds (default: its scrape interval)."""
    if not isinstance(fleet, Fleet):
        fleet = Fleet(fleet, start_unix=time.time())
    server = FleetServer(fleet)
    server.start()
    stop = threading.Event()
    ticker = threading.Thread(target=server.run, args=(0, stop, tick) if tick else (0, stop), daemon=True)
    ticker.start()
    try:
        yield server
    finally:
        stop.set()
        ticker.join(10)
        server.stop()


class RankThreads:
    """Ranks of one training job stepping in threads through the real client (StepMonitor): rank r
    on GPU r, each step `compute_s(r)` of compute then comm for the rest of `step_s` (a slow
    rank's compute, the others' comm: the wait for it). `started` is when they began."""

    def __init__(self, socket_path: Path, job_id: str, ranks: int, step_s: float = 0.1,
                 flops_per_step: float = 1e12, tokens_per_step: float = 1000.0,
                 compute_s: Callable[[int], float] | None = None) -> None:
        self.step_s, self.flops_per_step = step_s, flops_per_step
        self.compute_s = compute_s or (lambda rank: 0.8 * step_s)
        self.monitors = [StepMonitor(flops_per_step, tokens_per_step, job_id=job_id, rank=rank, local_rank=rank,
                                     gpu=rank, socket_path=str(socket_path), min_interval=0.2)
                         for rank in range(ranks)]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(rank,), name=f"rank-{rank}", daemon=True)
                        for rank in range(ranks)]
        self.started = 0.0

    def _run(self, rank: int) -> None:
        monitor, compute = self.monitors[rank], self.compute_s(rank)
        while not self.stop.is_set():
            with monitor.step():
                with monitor.phase("compute"):
                    time.sleep(compute)
                with monitor.phase("comm"):
                    time.sleep(max(0.0, self.step_s - compute))

    def __enter__(self) -> RankThreads:
        self.started = time.monotonic()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        for monitor in self.monitors:
            monitor.close()


def spanning_job_four_shards(name: str, seed: int) -> tuple[Scenario, dict[str, list[int]]]:
    """12 H100 nodes at 1 s ticks, and the four shards they split into (shard -> node indices).

    Job `span` (nodes 0-7, 64 ranks, pipeline-parallel pp 2: stage 0 on nodes 0-3, stage 1 on nodes
    4-7, whose stage does 40% more work, so it is slowest by design) spans every shard: shard k holds
    nodes k and 4+k, 8 ranks of each stage, over `vote_min_peers` of each peer group. Each shard also
    holds one job of its own (`local-k` on node 8+k, 8 ranks). Steps of 0.6 to 0.7 s."""
    shards = {f"shard-{k}": [k, 4 + k, 8 + k] for k in range(4)}
    local = [{"id": f"local-{k}", "nodes": str(8 + k), "model": MODEL_8B, "tokens_per_step": 32768,
              "target_mfu": 0.35 + 0.02 * k, "step_jitter": 0.01} for k in range(4)]
    scenario = parse({
        "name": name, "seed": seed, "duration": "1h", "scrape_interval": "1s",
        "fleet": {"nodes": 12, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
        "jobs": [
            {"id": "span", "nodes": "0-7", "model": MODEL_8B, "tokens_per_step": 262144, "target_mfu": 0.4,
             "step_jitter": 0.01, "pipeline": {"stages": 2, "stage_weights": [1.0, 1.4], "micro_batches": 8}},
            *local,
        ],
        "faults": [],
    })
    return scenario, shards
