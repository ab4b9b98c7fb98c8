"""A real Prometheus (Debian package) scraping dcgm-exporter expositions, with every rule file of
alerts/: the GPU alerts fire on a broken node and stay silent on healthy ones, and telemetry-only MFU
matches the value computed by hand for each label generation.

Faked, because no GPU or DCGM runs here: dcgm-exporter itself. Its /metrics bodies come from
tests/fixtures/dcgm_exporter/make.py, written from dcgm-exporter's source (README there), and are
served over loopback (integration/dcgm_serving.py); the fault switches on after the broken
node's healthy state has been scraped, as an XID or a lost GPU arrives on a running exporter.
"""

from __future__ import annotations

import time

import pytest

from flopwatch.promql import PromClient
from flopwatch.stack import Prometheus
from integration.dashboard_checks import RULE_FILES
from integration.dcgm_serving import FIX, serve

pytestmark = pytest.mark.integration

#: Telemetry MFU needs the peaks, recorded once a minute (a group first runs anywhere within its
#: interval), then the 15 s MFU group: its first value can take 75 s and more on a loaded machine.
DEADLINE_S = 150

#: One node per label generation (healthy), and one broken node on FlopWatch's counters file.
NODES = {
    "v4": FIX.Node(host="dgx01", generation="v4-Hostname", job="j1"),
    "v4lower": FIX.Node(host="dgx02", generation="v4-hostname", job="j2", mig=False),
    "expfmt": FIX.Node(host="dgx03", generation="expfmt", mode="kubernetes", job="j3"),
    "nohost": FIX.Node(generation="no-hostname", job="j4"),
    "broken": FIX.Node(host="dgx09", generation="v4-Hostname", job="j9", opt_in=True),
}
JOB_IDS = {"v4": "j1", "v4lower": "j2", "expfmt": "training/j3-worker-0", "nohost": "j4", "broken": "j9"}


@pytest.fixture(scope="module")
def prometheus():
    with serve(NODES) as scrape:
        prom = Prometheus(scrape, rule_files=RULE_FILES)
        try:
            prom.start()
            client = PromClient(prom.url)
            _wait(lambda: client.query("count(node_gpu:flopwatch_gpu_up:max == 1)")
                  and client.query("count(node_gpu:flopwatch_gpu_up:max == 1)")[0].value >= 40, "GPUs to be up")
            time.sleep(5)                       # the broken node's healthy state is in the TSDB
            NODES["broken"].broken = True
            yield client
        finally:
            prom.stop()


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)


def _alerts(client: PromClient) -> dict[tuple[str, str, str], str]:
    return {(s.labels["alertname"], s.labels.get("node", ""), s.labels.get("gpu", "")): s.labels["alertstate"]
            for s in client.query("ALERTS")}


#: (alert, GPU of the broken node, states that count: alerts with a long `for:` are pending within
#: the test's time; promtool's alerts/tests/dcgm.yml checks that they fire).
EXPECTED = [
    ("FlopWatchGpuXidCritical", "3", {"firing"}),
    ("FlopWatchGpuLost", "6", {"firing"}),
    ("FlopWatchGpuThrottled", "5", {"pending", "firing"}),
    ("FlopWatchNvlinkErrors", "1", {"pending", "firing"}),
    ("FlopWatchPcieDegraded", "4", {"pending", "firing"}),
    ("FlopWatchGpuEccUncorrected", "2", {"firing"}),
]


def test_broken_node_alerts_and_healthy_nodes_stay_silent(prometheus) -> None:
    client = prometheus

    def seen() -> bool:
        alerts = _alerts(client)
        return all(alerts.get((name, "dgx09", gpu)) in states for name, gpu, states in EXPECTED)

    _wait(seen, "the broken node's alerts")
    alerts = _alerts(client)
    gpu_alerts = {key for key in alerts if key[0].startswith(("FlopWatchGpu", "FlopWatchNvlink", "FlopWatchPcie"))}
    assert {key for key in gpu_alerts if key[1] != "dgx09"} == set(), "healthy nodes must stay silent"
    assert {(name, gpu) for name, _, gpu in gpu_alerts} == {(name, gpu) for name, gpu, _ in EXPECTED}
    xid = client.query('ALERTS{alertname="FlopWatchGpuXidCritical"}')[0].labels
    assert (xid["xid"], xid["job_id"]) == ("79", "j9")
    throttled = client.query('ALERTS{alertname="FlopWatchGpuThrottled"}')[0].labels
    assert throttled["reason"] == "sw_thermal"


@pytest.mark.parametrize("name", list(NODES))
def test_telemetry_mfu_matches_the_hand_computed_value(prometheus, name: str) -> None:
    client = prometheus
    query = f'job_id:flopwatch_mfu_telemetry:ratio{{job_id="{JOB_IDS[name]}"}}'
    node = NODES[name]

    def close() -> bool:
        result = client.query(query)
        return bool(result) and abs(result[0].value - FIX.telemetry_mfu(node)) < 0.005

    _wait(lambda: bool(client.query(query)), query)
    if name == "broken":
        _wait(lambda: client.query('count(node_gpu:flopwatch_gpu_up:max{node="dgx09"} == 1)')[0].value == 7,
              "the lost GPU to leave the estimate")
    _wait(close, f"{query} within 0.5 pp of {FIX.telemetry_mfu(node):.4f}")
    counts = client.query('count by (node) (node_gpu:flopwatch_gpu_up:max == 1)')
    assert len({s.labels["node"] for s in counts}) == len(NODES), "each node's GPUs are series of their own"
