"""A real Prometheus (both releases) that starts watching a dcgm-exporter node already broken: the
node's first scrape holds XID 79 on GPU 3 (dcgm-exporter's last-XID gauge keeps it until the driver
is reset) and lacks GPU 6 altogether (fallen off the bus before DCGM started: every field blank, so
dcgm-exporter drops its series) while GPUs 0-5 and 7 report. Both must raise the alerts a fault
seen arriving raises; a healthy node scraped alongside stays silent.

Faked, because no GPU or DCGM runs here: dcgm-exporter itself. The bodies come from
tests/fixtures/dcgm_exporter/make.py (written from dcgm-exporter's source, README there), served
over loopback by integration/dcgm_serving.py, broken from the first byte served.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from flopwatch.promql import PromClient
from flopwatch.stack import Prometheus
from integration.dashboard_checks import RULE_FILES
from integration.dcgm_serving import FIX, serve

pytestmark = pytest.mark.integration

#: FlopWatchGpuLost waits 30s after the 15 s state group first records the GPU down; a group
#: first runs anywhere within its interval, so 90 s leaves a loaded machine room.
DEADLINE_S = 120

NODES = {
    "broken": FIX.Node(host="dgx21", generation="v4-hostname", job="j21", broken=True),
    "healthy": FIX.Node(host="dgx22", generation="v4-Hostname", job="j22"),
}


@pytest.fixture(scope="module")
def prometheus(server_release: str) -> Iterator[PromClient]:
    with serve(NODES) as scrape:
        prom = Prometheus(scrape, rule_files=RULE_FILES)
        try:
            prom.start()
            yield PromClient(prom.url)
        finally:
            prom.stop()


def _gpu_alerts(client: PromClient) -> dict[tuple[str, str, str], dict[str, str]]:
    return {(s.labels["alertname"], s.labels.get("node", ""), s.labels.get("gpu", "")): s.labels
            for s in client.query('ALERTS{alertname=~"FlopWatchGpu.*"}')}


def test_a_node_broken_before_watching_starts_raises_the_same_alerts(prometheus: PromClient) -> None:
    wanted = {("FlopWatchGpuXidCritical", "dgx21", "3"), ("FlopWatchGpuLost", "dgx21", "6")}
    throttled = ("FlopWatchGpuThrottled", "dgx21", "5")  # the fixture's broken GPU 5 runs at 83% of its clock
    deadline = time.monotonic() + DEADLINE_S
    while True:
        alerts = _gpu_alerts(prometheus)
        firing = {key for key, labels in alerts.items() if labels["alertstate"] == "firing"}
        if wanted <= firing:
            break
        assert time.monotonic() < deadline, f"timed out waiting for {sorted(wanted)}; alerts: {sorted(alerts)}"
        time.sleep(2)
    assert set(alerts) - {throttled} == wanted, "the healthy node and the broken node's GPUs 0-2, 4 and 7 stay silent"
    xid = alerts[("FlopWatchGpuXidCritical", "dgx21", "3")]
    assert (xid["xid"], xid["severity"], xid["job_id"]) == ("79", "page", "j21")
    assert alerts[("FlopWatchGpuLost", "dgx21", "6")]["severity"] == "page"
