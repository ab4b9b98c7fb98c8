"""Shared fixtures. Integration tests start real servers only through flopwatch.stack."""

from __future__ import annotations

import pytest

from flopwatch import config as cfg
from flopwatch.stack import releases, stop_all


@pytest.fixture
def sim_config() -> cfg.AgentConfig:
    """An agent config on the simulated backend: 8 H100s, 1 s interval, a fixed node name."""
    return cfg.load(overrides={"backend": "sim", "node": "test-node", "interval": 1,
                               "listen": "127.0.0.1:0"}, environ={})


@pytest.fixture(autouse=True, scope="session")
def _no_server_left_behind():
    yield
    stop_all()


@pytest.fixture(scope="module", params=releases.RELEASES)
def server_release(request: pytest.FixtureRequest):
    """The compatibility matrix: a module (or test) that asks for this runs once on Debian's
    servers (Prometheus 2.42, Alertmanager 0.25, VictoriaMetrics 1.79) and once on the current
    upstream releases built by scripts/build-servers.sh; every server it starts in between comes
    from that release (flopwatch.stack.releases)."""
    with releases.use(request.param):
        yield request.param
