"""The fast renderer says exactly what prometheus_client.generate_latest says."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from flopwatch.exporters.exposition import ExpositionRenderer
from flopwatch.exporters.wiring import build_agent


def parsed(exposition: bytes) -> list:
    return [
        (family.name, family.type, family.documentation,
         sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in family.samples))
        for family in text_string_to_metric_families(exposition.decode())
    ]


class Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def odd_families():
    gauge = GaugeMetricFamily("flopwatch_t_odd", 'help with \\ backslash\nand "newline"', labels=["a", "b"])
    gauge.add_metric(['quote " here', "back\\slash\nnewline"], 1.5)
    gauge.add_metric(["inf", ""], math.inf)
    gauge.add_metric(["-inf", ""], -math.inf)
    gauge.add_metric(["int", ""], 3)
    gauge.add_metric(["big", ""], 1.2345e300)
    counter = CounterMetricFamily("flopwatch_t_events", "events", labels=["k"])
    counter.add_metric(["x"], 7)
    hist = HistogramMetricFamily("flopwatch_t_step_seconds", "steps", labels=["job_id"])
    hist.add_metric(["j1"], [("0.5", 1), ("1.0", 3), ("+Inf", 4)], 2.5)
    return [gauge, counter, hist]


def test_matches_generate_latest_on_edge_cases():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(odd_families()))
    renderer = ExpositionRenderer()
    assert parsed(renderer.render(registry.collect())) == parsed(generate_latest(registry))
    # second render comes from the prefix cache and must be the same
    assert parsed(renderer.render(registry.collect())) == parsed(generate_latest(registry))


def test_nan_renders_as_nan():
    gauge = GaugeMetricFamily("flopwatch_t_nan", "nan", labels=[])
    gauge.add_metric([], math.nan)
    text = ExpositionRenderer().render([gauge]).decode()
    assert "flopwatch_t_nan NaN\n" in text


def test_matches_generate_latest_for_the_agent(sim_config):
    agent = build_agent(sim_config)
    agent.collect_once()
    assert parsed(agent.exposition()) == parsed(generate_latest(agent.registry))
    agent.close()


def test_cache_holds_only_the_last_render():
    renderer = ExpositionRenderer()
    for round_ in range(50):
        gauge = GaugeMetricFamily("flopwatch_t_churn", "churn", labels=["rank"])
        for rank in range(100):
            gauge.add_metric([f"{round_}-{rank}"], rank)
        renderer.render([gauge])
    assert len(renderer._prefixes) == 100


def test_block_renderer_reuses_a_metrics_text_only_while_its_values_are_unchanged():
    from flopwatch.catalog import gpu as g
    from flopwatch.exporters.exposition import BlockRenderer, Blocks

    renderer = BlockRenderer()

    def render(power: list[float], clock: float) -> str:
        blocks = Blocks("n1")
        for gpu, watts in enumerate(power):
            blocks.add(g.POWER, (str(gpu),), watts)
        blocks.add(g.SM_CLOCK_MAX, ("0",), clock)
        out: list[bytes] = []
        renderer.render(blocks, out)
        return b"".join(out).decode()

    first = render([300.0, 310.0], 1.98e9)
    assert render([300.0, 310.0], 1.98e9) == first
    moved = render([300.0, 320.5], 1.98e9)
    assert 'flopwatch_gpu_power_watts{node="n1",gpu="1"} 320.5' in moved and "310.0" not in moved
    nan = render([math.nan, 320.5], 1.98e9)
    assert 'flopwatch_gpu_power_watts{node="n1",gpu="0"} NaN' in nan
    assert 'flopwatch_gpu_power_watts{node="n1",gpu="0"} 300.0' in render([300.0, 320.5], 1.98e9)
    assert render([300.0, 320.5], 1.5e9).count("1500000000.0") == 1


def test_block_renderer_writes_each_value_as_the_family_renderer_does():
    """Repeated values, 0.0 and -0.0 (equal, printed differently), NaN, the infinities and a value
    past 1e16: the same bytes as from prometheus_client families, rendered and then from the cache."""
    from flopwatch.catalog import gpu as g
    from flopwatch.catalog import train as t
    from flopwatch.exporters.exposition import BlockRenderer, Blocks

    blocks = Blocks("n1")
    for gpu, watts in enumerate([1.5, 1.5, 0.0, -0.0, 2.25, 2.25, 1e22, 1e22]):
        blocks.add(g.POWER, (str(gpu),), watts)
    for gpu, value in enumerate([math.nan, 1.0, 1.0, math.inf, -math.inf]):
        blocks.add(g.TEMPERATURE, (str(gpu),), value)
    for gpu, value in enumerate([3.0, 4.0]):
        blocks.add(g.ENERGY, (str(gpu),), value)
    blocks.add_histogram(t.STEP_SECONDS, ("j1",), [(1.0, 2.0), (2.0, 2.0), (math.inf, 2.0)], 3.5)
    expected = ExpositionRenderer().render(blocks.families()).decode()
    assert "-0.0\n" in expected and "NaN\n" in expected and "1e+22\n" in expected
    renderer = BlockRenderer()
    for _ in range(2):   # the second from the cached text
        out: list[bytes] = []
        renderer.render(blocks, out)
        assert b"".join(out).decode() == expected
