"""Simulated fleets shared by the integration tests."""

from __future__ import annotations

from flopwatch.sim.scenario import Scenario, parse

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
