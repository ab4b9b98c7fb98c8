"""The agent renders once per collection and serves those bytes; collector failures are isolated."""

from __future__ import annotations

import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from flopwatch import __version__
from flopwatch.exporters.agent import Agent
from flopwatch.exporters.wiring import build_agent


class Exploding:
    name = "broken"

    def update(self) -> int:
        raise OSError("sysfs went away")

    def collect(self):
        return iter(())

    def close(self) -> None:
        pass


def samples(exposition: bytes) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_scrape_serves_the_last_rendering_without_collecting(sim_config):
    agent = build_agent(sim_config)
    agent.collect_once()
    host, port = agent.serve("127.0.0.1", 0)
    try:
        first = urllib.request.urlopen(f"http://{host}:{port}/metrics").read()
        second = urllib.request.urlopen(f"http://{host}:{port}/metrics").read()
        assert first == second  # no collection happened between scrapes
        agent.collect_once()
        third = urllib.request.urlopen(f"http://{host}:{port}/metrics").read()
        assert third != first
        assert urllib.request.urlopen(f"http://{host}:{port}/healthz").status == 200
    finally:
        agent.http.stop()
        agent.close()


def test_self_metrics(sim_config):
    agent = build_agent(sim_config)
    agent.collect_once()
    values = samples(agent.exposition())
    assert values[("flopwatch_build_info", (("backend", "sim"), ("node", "test-node"),
                   ("python", __import__("platform").python_version()), ("version", __version__)))] == 1
    assert values[("flopwatch_collector_errors_total", (("collector", "gpu"), ("node", "test-node")))] == 0
    assert values[("flopwatch_collector_duration_seconds", (("collector", "gpu"), ("node", "test-node")))] > 0


def test_a_failing_collector_is_counted_and_others_continue(sim_config, caplog):
    gpu_agent = build_agent(sim_config)
    agent = Agent("test-node", [*gpu_agent.collectors, Exploding()], "sim")
    agent.collect_once()
    agent.collect_once()
    values = samples(agent.exposition())
    assert values[("flopwatch_collector_errors_total", (("collector", "broken"), ("node", "test-node")))] == 2
    assert values[("flopwatch_gpu_up", (("gpu", "0"), ("node", "test-node")))] == 1
    assert "collector broken failed: sysfs went away" in caplog.text
    agent.close()


def test_run_keeps_schedule_and_stops(sim_config):
    agent = build_agent(sim_config)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(0.05, stop))
    # interval is validated >= 1 s in config; run() itself accepts any interval for tests
    thread.start()
    time.sleep(0.5)
    stop.set()
    thread.join(2)
    assert not thread.is_alive()
    assert 6 <= agent.cycles <= 12
    agent.close()


def test_healthz_turns_503_when_collection_stalls(sim_config, monkeypatch):
    agent = build_agent(sim_config)
    assert agent.route("/healthz").status == 503  # nothing collected yet
    agent.collect_once()
    agent.interval = 1.0
    assert agent.route("/healthz").status == 200
    agent.last_cycle_at -= 60
    answer = agent.route("/healthz")
    assert answer.status == 503 and b"stale" in answer.body
    agent.close()


def test_a_failing_cycle_does_not_stop_the_loop(sim_config, caplog):
    agent = build_agent(sim_config)
    calls = []
    original = agent.collect_once

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("render bug")
        original()

    agent.collect_once = flaky
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(0.05, stop))
    thread.start()
    time.sleep(0.3)
    stop.set()
    thread.join(2)
    assert len(calls) >= 3 and agent.cycles >= 2
    assert "collection cycle failed" in caplog.text
    agent.close()
