"""The InfluxDB sink against a real server speaking the v2 write API: VictoriaMetrics
(`/api/v2/write`; Debian's own InfluxDB is 1.x and has no v2 API), in both releases (the
`server_release` matrix: Debian's 1.79 and the current one built by scripts/build-servers.sh).
Points are read back through VictoriaMetrics' export API and compared sample by sample with what
the agent exported.

Only the GPUs are simulated (the agent's `sim` backend); the agent, influxdb-client and the server
are the real ones.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from flopwatch import config as cfg
from flopwatch.exporters.agent import Agent
from flopwatch.exporters.influx import InfluxSink
from flopwatch.exporters.wiring import build_agent
from flopwatch.stack import AgentProcess, VictoriaMetrics

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("server_release")]

Series = tuple[str, tuple[tuple[str, str], ...]]


#: The outage test's collection interval: its 55 cycles in about 14 s instead of 55.
OUTAGE_INTERVAL_S = 0.25


def agent_config(node: str, vm_url: str, buffer_dir: Path) -> cfg.AgentConfig:
    return cfg.load(overrides={"backend": "sim", "node": node, "interval": 1, "listen": "127.0.0.1:0",
                               "influx.url": vm_url, "influx.buffer_dir": str(buffer_dir),
                               "influx.flush_interval": 0.2}, environ={})


def sink_of(agent: Agent) -> InfluxSink:
    return next(c for c in agent.collectors if c.name == "influx")


def expected_samples(cycles: list[tuple[float, bytes]]) -> dict[Series, list[tuple[int, float]]]:
    """Per series, (timestamp ms, value) of every finite sample the agent exported, via
    prometheus_client's own parser."""
    out: dict[Series, list[tuple[int, float]]] = defaultdict(list)
    for at, text in cycles:
        for family in text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                if math.isfinite(sample.value):
                    out[(sample.name, tuple(sorted(sample.labels.items())))].append((round(at * 1000), sample.value))
    return out


def exported(vm: VictoriaMetrics, node: str, suffix: str = "") -> dict[Series, list[tuple[int, float]]]:
    """Every raw sample VictoriaMetrics holds for `node`, names with `suffix` removed."""
    with urllib.request.urlopen(f"{vm.url}/internal/force_flush", timeout=30):
        pass  # make what it acknowledged searchable now rather than within seconds
    query = urllib.parse.urlencode({"match[]": f'{{node="{node}"}}', "start": "0"})
    with urllib.request.urlopen(f"{vm.url}/api/v1/export?{query}", timeout=30) as answer:
        rows = [json.loads(line) for line in answer.read().splitlines() if line]
    out: dict[Series, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        labels = dict(row["metric"])
        name = labels.pop("__name__")
        assert name.endswith(suffix), name
        key = (name[:len(name) - len(suffix)] if suffix else name, tuple(sorted(labels.items())))
        out[key] += zip(row["timestamps"], map(float, row["values"]), strict=True)
    return {key: sorted(values) for key, values in out.items()}


def assert_same(got: dict[Series, list[tuple[int, float]]], expected: dict[Series, list[tuple[int, float]]]):
    """The same series with the same timestamps; values as equal as VictoriaMetrics stores them
    (it keeps about 12 significant decimal digits)."""
    assert set(got) == set(expected), (sorted(set(expected) - set(got))[:3], sorted(set(got) - set(expected))[:3])
    for key, unsorted in expected.items():
        values = sorted(unsorted)
        assert [t for t, _ in got[key]] == [t for t, _ in values], f"{key}: timestamps differ"
        assert [v for _, v in got[key]] == pytest.approx([v for _, v in values], rel=1e-11, abs=1e-300), key


def wait_for_samples(vm: VictoriaMetrics, node: str, total: int, suffix: str = "", timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        got = exported(vm, node, suffix)
        count = sum(len(values) for values in got.values())
        if count >= total or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_every_exported_sample_reads_back_as_measurement_value(tmp_path):
    """Default VictoriaMetrics flags: measurement `m` with field `value` is read back as `m_value`."""
    with VictoriaMetrics() as vm:
        agent = build_agent(agent_config("rt-node", vm.url, tmp_path / "buffer"))
        cycles: list[tuple[float, bytes]] = []
        agent.cycle_listeners.append(lambda at, text: cycles.append((at, text)))
        try:
            for _ in range(3):
                agent.collect_once()
                time.sleep(0.02)
            assert sink_of(agent).flush(20)
            sink = sink_of(agent)
        finally:
            agent.close()
        expected = expected_samples(cycles)
        total = sum(len(values) for values in expected.values())
        assert total > 3000
        got = wait_for_samples(vm, "rt-node", total, "_value")
    assert_same(got, expected)
    assert sink.written == total and sink.failures == 0 and not any(sink.dropped.values())


def test_an_outage_of_55_cycles_loses_nothing_and_writes_nothing_twice(tmp_path):
    """Stop the server while the agent collects 55 cycles (every 0.25 s here: the outage is counted
    in cycles, not waited out in seconds); after it is back, every sample of every cycle is there
    exactly once (with -influxSkipSingleField the names are the exposition's own)."""
    (tmp_path / "vm").mkdir()
    vm = VictoriaMetrics(extra_args=["-influxSkipSingleField"], workdir=tmp_path / "vm")
    vm.start()
    agent = build_agent(agent_config("outage-node", vm.url, tmp_path / "buffer"))
    sink = sink_of(agent)
    cycles: list[tuple[float, bytes]] = []
    agent.cycle_listeners.append(lambda at, text: cycles.append((at, text)))
    stop = threading.Event()
    collecting = threading.Thread(target=agent.run, args=(OUTAGE_INTERVAL_S, stop), daemon=True)
    try:
        collecting.start()
        while len(cycles) < 3:
            time.sleep(0.1)
        assert sink.flush(20)
        vm.stop()                               # graceful: what it acknowledged is on its disk
        before = len(cycles)
        wait_for(lambda: len(cycles) - before >= 55 and sink.failures > 0, 120,
                 "55 collection cycles through the outage, with failed writes")
        assert sink.buffer.on_disk and sink.buffer.lines > 50 * 1000
        assert list((tmp_path / "buffer").glob("*.lp")), "the outage is buffered in segment files"
        vm.restart()
        assert sink.flush(60), "the buffer drains once the server is back"
    finally:
        stop.set()
        collecting.join(10)
        agent.close()
    try:
        expected = expected_samples(cycles)
        total = sum(len(values) for values in expected.values())
        got = wait_for_samples(vm, "outage-node", total)
    finally:
        vm.stop()
    duplicated = {key: values for key, values in got.items() if len(values) != len(set(values))}
    assert not duplicated, f"written twice: {list(duplicated)[:3]}"
    assert_same(got, expected)
    assert sink.written == total and not any(sink.dropped.values())


def test_the_agent_command_writes_with_a_token_it_never_shows(tmp_path, monkeypatch):
    """`flopwatch agent --influx-url` as users run it; the token comes from the environment."""
    monkeypatch.setenv("FLOPWATCH_INFLUX_TOKEN", "tok-7f3a9c-secret")
    with VictoriaMetrics() as vm, AgentProcess(node="cli-node", extra=[
            "--influx-url", vm.url, "--influx-buffer-dir", str(tmp_path / "buffer")]) as agent:
        deadline = time.monotonic() + 30
        up = {}
        while time.monotonic() < deadline and len(up) < 8:
            up = {key: values for key, values in exported(vm, "cli-node", "_value").items()
                  if key[0] == "flopwatch_gpu_up"}
            time.sleep(0.5)
        assert len(up) == 8
        written = 0.0
        while time.monotonic() < deadline and not written:  # the next cycle renders the count
            with urllib.request.urlopen(agent.url + "/metrics", timeout=10) as answer:
                metrics = answer.read().decode()
            written = sum(float(line.split()[-1]) for line in metrics.splitlines()
                          if line.startswith("flopwatch_influx_points_written_total"))
            time.sleep(0.2)
        assert written > 0
        log = agent.log_path.read_text()
    assert "tok-7f3a9c-secret" not in log and "tok-7f3a9c-secret" not in metrics
