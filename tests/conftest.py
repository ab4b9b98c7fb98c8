"""Shared fixtures. Integration tests start real servers only through flopwatch.stack."""

from __future__ import annotations

import pytest

from flopwatch import config as cfg
from flopwatch.stack import stop_all


@pytest.fixture
def sim_config() -> cfg.AgentConfig:
    """An agent config on the simulated backend: 8 H100s, 1 s interval, a fixed node name."""
    return cfg.load(overrides={"backend": "sim", "node": "test-node", "interval": 1,
                               "listen": "127.0.0.1:0"}, environ={})


@pytest.fixture(autouse=True, scope="session")
def _no_server_left_behind():
    yield
    stop_all()
