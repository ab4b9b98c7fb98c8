"""The agent renders once per collection and serves those bytes; collector failures are isolated."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable

from helpers import wait_for
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


class FakeTime:
    """The run loop's clock and stop event in one: wait(delay) advances the clock by the delay
    and records it; the loop stops after `cycles` waits. `cost` is what each cycle takes."""

    def __init__(self, cycles: int, cost: Callable[[int], float] = lambda cycle: 0.0) -> None:
        self.now, self.cycles, self.cost, self.waits = 1000.0, cycles, cost, []

    def clock(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return len(self.waits) >= self.cycles

    def wait(self, delay: float) -> bool:
        self.waits.append(round(delay, 9))
        self.now += delay
        return self.is_set()


def test_run_keeps_a_fixed_schedule_and_stops(sim_config):
    agent = build_agent(sim_config)
    fake = FakeTime(cycles=5, cost=lambda cycle: 0.3 if cycle == 3 else 0.1)   # the third is slow
    collect = agent.collect_once

    def timed_cycle() -> None:
        collect()
        fake.now += fake.cost(agent.cycles)

    agent.collect_once = timed_cycle
    agent.run(1.0, fake, clock=fake.clock)
    assert agent.cycles == 5
    # each wait ends on the next whole interval after the start: a slow cycle shortens it, no drift
    assert fake.waits == [0.9, 0.9, 0.7, 0.9, 0.9]
    agent.close()


def test_run_skips_the_slots_a_slow_cycle_missed(sim_config, caplog):
    agent = build_agent(sim_config)
    fake = FakeTime(cycles=3)
    collect = agent.collect_once

    def cycle() -> None:
        collect()
        fake.now += 2.5 if agent.cycles == 1 else 0.0    # the first cycle overruns two slots

    agent.collect_once = cycle
    agent.run(1.0, fake, clock=fake.clock)
    assert fake.waits == [0.5, 1.0, 1.0]    # back on the grid at start + 3 s, no burst of cycles
    assert "skipping 2 slot(s)" in caplog.text
    agent.close()


def test_run_returns_when_stopped(sim_config):
    agent = build_agent(sim_config)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(3600.0, stop))
    thread.start()
    wait_for(lambda: agent.cycles >= 1, 5, "the first cycle")
    stop.set()
    thread.join(5)
    assert not thread.is_alive()     # the hour-long wait ended with the stop, not the interval
    assert agent.cycles == 1
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
    fake = FakeTime(cycles=3)
    agent.run(1.0, fake, clock=fake.clock)
    assert len(calls) == 3 and agent.cycles == 2
    assert "collection cycle failed" in caplog.text
    agent.close()
