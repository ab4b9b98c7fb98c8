"""Simulated fleets shared by the integration tests, and a context manager that serves one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import Scenario, parse
from flopwatch.sim.serve import FleetServer

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
def serving(scenario: Scenario, tick: float) -> Iterator[FleetServer]:
    """Serve the fleet's nodes on loopback, advancing it in real time every `tick` seconds."""
    server = FleetServer(Fleet(scenario, start_unix=time.time()))
    server.start()
    stop = threading.Event()
    ticker = threading.Thread(target=server.run, args=(0, stop, tick), daemon=True)
    ticker.start()
    try:
        yield server
    finally:
        stop.set()
        ticker.join(10)
        server.stop()
