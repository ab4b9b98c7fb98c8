"""`flopwatch agent` as its own process, for integration tests and benchmarks that need the agent
exactly as users run it (console script, signals, HTTP server), started like the other servers."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from flopwatch.stack.process import ServerProcess


class AgentProcess(ServerProcess):
    """The agent of this Python environment on simulated GPUs; ready when /healthz answers 200."""

    binary = "flopwatch"
    package = "flopwatch (pip install -e . into this virtual environment)"
    ready_path = "/healthz"

    def __init__(self, *, node: str = "test-node", gpus: int = 8, model: str = "H100-SXM",
                 interval: float = 1.0, extra: Sequence[str] = (), port: int | None = None) -> None:
        super().__init__(port)
        self.node, self.gpus, self.model, self.interval = node, gpus, model, interval
        self.extra = list(extra)

    def command(self) -> list[str]:
        script = Path(sys.executable).parent / "flopwatch"
        return [str(script)] if script.exists() else [sys.executable, "-m", "flopwatch"]

    def args(self) -> list[str]:
        return ["agent", "--backend", "sim", "--sim-gpus", str(self.gpus), "--sim-model", self.model,
                "--interval", f"{self.interval:g}", "--node", self.node, "--listen", f"{self.host}:{self.port}",
                *self.extra]
