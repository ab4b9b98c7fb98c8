"""`flopwatch remediate run` as its own process, for integration tests that need the service as
users run it (signals, SIGKILL and restart, its HTTP webhook), started like the other servers."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from flopwatch.stack.process import ServerProcess


class RemediateProcess(ServerProcess):
    """`flopwatch remediate run --config FILE` of this Python environment; ready when /-/ready answers.
    `env` adds to the environment (SLURM_CONF for a test cluster)."""

    binary = "flopwatch"
    package = "flopwatch (pip install -e . into this virtual environment)"
    ready_path = "/-/ready"

    def __init__(self, config: Path, *, env: Mapping[str, str] | None = None, extra: Sequence[str] = (),
                 port: int | None = None) -> None:
        super().__init__(port)
        self.config, self.env, self.extra = config, dict(env or {}), list(extra)

    def wait_ready(self, timeout: float) -> None:
        """Ready when /-/ready answers: 200, or 401 behind a web config with basic auth."""
        self.wait_until(self._answers, timeout, f" at {self.url}")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=2):
                return True
        except urllib.error.HTTPError as error:
            return error.code == 401
        except (urllib.error.URLError, OSError):
            return False

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def command(self) -> list[str]:
        script = Path(sys.executable).parent / "flopwatch"
        return [str(script)] if script.exists() else [sys.executable, "-m", "flopwatch"]

    def args(self) -> list[str]:
        return ["remediate", "run", "--config", str(self.config), "--listen", f"{self.host}:{self.port}",
                "--log-level", "debug", *self.extra]
