"""A started GPU backend under the real GpuCollector and Agent, torn down together: what the NVML,
DCGM and driver-library backend tests each drive (they differ only in the backend they start)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flopwatch import config as cfg
from flopwatch.exporters.agent import Agent
from flopwatch.exporters.gpu.collector import GpuCollector

NODE = "n1"


class BackendRig:
    """`make_backend(gpu_options)` builds the backend; overrides go to the agent config."""

    def __init__(self, make_backend: Callable[[cfg.GpuOptions], Any], **overrides: object) -> None:
        self.config = cfg.load(overrides={"node": NODE, **overrides}, environ={})
        self.backend = make_backend(self.config.gpu)
        self.count = self.backend.start()
        self.collector = GpuCollector(self.backend, NODE, self.config.gpu, self.count)
        self.agent = Agent(NODE, [self.collector], self.backend.name)

    def collect(self) -> None:
        self.agent.collect_once()

    def value(self, name: str, **labels: str) -> float | None:
        return self.agent.registry.get_sample_value(name, {"node": NODE, **labels})

    def close(self) -> None:
        self.agent.close()
        self.backend.stop()
