"""Running a scenario through the real rules, faster than wall-clock (DESIGN.md, "Evaluating rules
faster than wall-clock").

A throwaway Prometheus (remote-write receiver, out-of-order window) receives the simulated samples
a stretch at a time; each recording rule, in dependency order, is evaluated with one
`/api/v1/query_range` at its group's interval over that stretch and its result written back (with
stale markers where a series ends), so the next rule reads it as it would in a live Prometheus;
then each alert expression is range-queried and `for:` applied (alerts.py). All PromQL is
Prometheus's own.

A tick's samples are stamped SCRAPE_LEAD_MS before that tick's evaluations, as a live Prometheus
scrapes at each target's own offset and never at the very millisecond a rule group evaluates: a
range window then holds the samples it holds live, the same in Prometheus 2 (windows closed on
the left) and 3 (open on the left): six 5 s samples in `[30s]`, not seven in 2.x and six in 3.x.
Recorded series are written at the evaluation steps themselves, as Prometheus writes them.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from flopwatch.detect import interruptions, remote_write
from flopwatch.detect.alerts import AlertTracker, Episode
from flopwatch.detect.dcgm_sampler import agent_names
from flopwatch.detect.fast_sampler import Group, supported_names
from flopwatch.detect.remote_write import STALE_NAN, encode_labels, encode_request
from flopwatch.detect.rules import Rule, RuleSet, names_in, selectors
from flopwatch.detect.sampler import Block, FleetSampler, Recorder, keep_by
from flopwatch.promql import PromClient, PromError
from flopwatch.sim.dcgm_exposition import DcgmExporterError, field_names, uses_flopwatch_counters
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.scenario import Scenario, parse
from flopwatch.stack import Prometheus

log = logging.getLogger(__name__)

#: Simulated time starts here (2023-11-14): fixed, so runs are reproducible; Prometheus retention
#: counts from the newest sample, not from the wall clock.
START_UNIX = 1_700_000_000.0
#: How long before a tick's evaluations its samples are stamped (milliseconds: Prometheus's unit).
SCRAPE_LEAD_MS = 1
#: Recording rules whose results the scorer needs, kept as they are evaluated.
OBSERVED = ("job_id:flopwatch_mfu:ratio", "job_id:flopwatch_goodput:ratio", "job_id:flopwatch_badput:ratio",
            "job_id:flopwatch_step_time_lost:ratio",
            "job_id:flopwatch_ettr:ratio", *interruptions.OBSERVED)
Labels = tuple[tuple[str, str], ...]
Progress = Callable[[float, str], None]


class EngineError(RuntimeError):
    """Prometheus rejected a rule or a write; the message names the rule."""


class SampleSource(Protocol):
    """What the engine evaluates: something that moves on in time and is scraped once a tick
    (a simulated fleet, or a replay through real clients and the agent's intake)."""

    @property
    def now_unix(self) -> float: ...

    def advance(self, dt: float) -> None: ...

    def sample(self) -> Iterable[Group]: ...


@dataclass
class Evaluation:
    """What one run through the rules gave: alert episodes, the observed records, costs."""

    episodes: list[Episode]
    observed: dict[str, list[tuple[dict[str, str], np.ndarray, np.ndarray]]]
    stats: dict[str, float]


class _FleetSource:
    def __init__(self, fleet: Fleet, sampler: FleetSampler) -> None:
        self.fleet, self.sampler = fleet, sampler

    @property
    def now_unix(self) -> float:
        return self.fleet.now_unix

    def advance(self, dt: float) -> None:
        self.fleet.advance(dt)

    def sample(self) -> Iterable[Group]:
        return self.sampler.sample()


@dataclass
class RunResult:
    scenario: Scenario
    truth: dict[str, Any]
    start_unix: float
    episodes: list[Episode]
    observed: dict[str, list[tuple[dict[str, str], np.ndarray, np.ndarray]]]
    stats: dict[str, float] = field(default_factory=dict)
    exact_nodes: list[int] = field(default_factory=list)


@functools.cache
def producible_names() -> set[str]:
    """Every series name a simulated node's scrape carries: a one-node fleet with a job, rendered."""
    scenario = parse({
        "name": "names", "duration": "1m", "fleet": {"nodes": 1, "gpus_per_node": 1, "nics_per_node": 1},
        "jobs": [{"id": "j", "nodes": "0", "tokens_per_step": 65536, "target_mfu": 0.4,
                  "checkpoint_every": "10s", "checkpoint_seconds": "1s",
                  "model": {"params": 1e9, "layers": 8, "heads": 8, "head_dim": 64, "seq_len": 1024}}],
    })
    fleet = Fleet(scenario)
    agent = SimNodeAgent(fleet, fleet.nodes[0])
    for _ in range(3):
        fleet.advance(5.0)
    names = {"up"}
    for line in agent.render().decode().splitlines():
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names | supported_names()  # XID series appear only after an XID


def exact_nodes_for(scenario: Scenario) -> list[int]:
    """Nodes whose GPUs can be lost: their agents' collector state machine is needed."""
    return sorted({fault.node for fault in scenario.faults if fault.kind == "gpu_lost" or fault.xid == 79})


_TEMPLATE = re.compile(r"\{\{\s*(?:\$labels\.|\.Labels\.)([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}"
                       r"|\{\{\s*(?:\$value|\.Value)\s*\}\}")


def template_label(text: str, labels: dict[str, str], value: float) -> str:
    """Alert label templates of the simple kinds ({{ $labels.x }}, {{ $value }})."""
    if "{{" not in text:
        return text
    return _TEMPLATE.sub(lambda m: labels.get(m.group(1), "") if m.group(1) else f"{value:g}", text)


class _SeriesRows:
    """Rows of written-back series of one rule across stretches, for stale markers."""

    def __init__(self) -> None:
        self.rows: dict[Labels, int] = {}
        self.label_bytes: list[bytes] = []
        self.was_present = np.zeros(0, dtype=bool)

    def block(self, items: list[tuple[Labels, np.ndarray, np.ndarray]], stamps_ms: np.ndarray) -> Block | None:
        for labels, _, _ in items:
            if labels not in self.rows:
                self.rows[labels] = len(self.label_bytes)
                self.label_bytes.append(encode_labels(labels))
        count, steps = len(self.label_bytes), len(stamps_ms)
        values = np.zeros((count, steps))
        present = np.zeros((count, steps), dtype=bool)
        for labels, index, vals in items:
            row = self.rows[labels]
            values[row, index] = vals
            present[row, index] = True
        before = np.zeros(count, dtype=bool)
        before[:len(self.was_present)] = self.was_present
        stale = np.concatenate([before[:, None], present[:, :-1]], axis=1) & ~present
        values[stale] = STALE_NAN
        self.was_present = present[:, -1].copy()
        send = present | stale
        rows = np.flatnonzero(send.any(axis=1))
        if not len(rows):
            return None
        labels_list = list(self.rows)
        return Block([labels_list[i] for i in rows], [self.label_bytes[i] for i in rows], values[rows],
                     send[rows], stamps_ms)


class PrometheusEngine:
    """One scenario through one throwaway Prometheus."""

    def __init__(self, rules: RuleSet, *, chunk: float = 900.0, exact: bool = False,
                 batch_samples: int = 2_000_000, threads: int = 2, observe: tuple[str, ...] = OBSERVED,
                 produced: set[str] | None = None, scrape_lead_ms: int = SCRAPE_LEAD_MS) -> None:
        """`observe`: recording rules whose results to keep; `produced`: the series names the
        sources scrape (default: what a simulated node exports); `scrape_lead_ms`: samples stamped
        this long before the evaluations of their tick (0: on them, as in promtool's tests)."""
        self.all_rules = rules
        self.observe = observe
        self.rules = rules.needed(observe)
        self.waves = self.rules.levels()
        self.threads = max(1, threads)
        self.chunk = chunk
        self.exact = exact
        self.batch_samples = batch_samples
        exprs = [rule.expr for rule in self.rules.rules]
        self.referenced = set().union(*(names_in(expr) for expr in exprs)) if exprs else set()
        self.wanted = self.referenced & (producible_names() if produced is None else produced)
        self.selectors = selectors(exprs, self.wanted)
        self.produced = produced
        self.scrape_lead_ms = scrape_lead_ms

    def _for_exporter(self, exporter: str) -> None:
        """What the rules read of a fleet whose GPUs are behind `exporter` (scenario `fleet.exporter`)."""
        produced = producible_names() if self.produced is None else self.produced
        if exporter != "agent":
            produced = agent_names(produced) | field_names(uses_flopwatch_counters(exporter))
        self.wanted = self.referenced & produced
        self.selectors = selectors([rule.expr for rule in self.rules.rules], self.wanted)

    # -- writing ---------------------------------------------------------------------------------
    def _write(self, url: str, block: Block | None) -> int:
        if block is None:
            return 0
        per_series = max(1, int(block.present.sum(axis=1).mean()))
        batch = max(1, self.batch_samples // per_series)
        written = 0
        for lo in range(0, len(block.label_bytes), batch):
            hi = lo + batch
            request = encode_request(block.label_bytes[lo:hi], block.values[lo:hi], block.present[lo:hi],
                                     block.timestamps_ms)
            try:
                remote_write.post(url + "/api/v1/write", request)
            except remote_write.RemoteWriteError as error:
                raise EngineError(str(error)) from None
            written += int(block.present[lo:hi].sum())
        return written

    # -- the run ---------------------------------------------------------------------------------
    def run(self, scenario: Scenario, progress: Progress | None = None) -> RunResult:
        fleet = Fleet(scenario, START_UNIX)
        self._for_exporter(scenario.fleet.exporter)
        try:
            sampler = FleetSampler(fleet, self.wanted, exact_nodes_for(scenario), self.exact)
        except DcgmExporterError as error:
            raise EngineError(f"{scenario.name}: {error}") from None
        result = self.evaluate(_FleetSource(fleet, sampler), scenario.duration, scenario.scrape_interval,
                               scenario.name, progress)
        return RunResult(scenario, fleet.truth.as_dict(), START_UNIX, result.episodes, result.observed,
                         result.stats, sampler.exact_nodes)

    def evaluate(self, source: SampleSource, duration: float, dt: float, name: str,
                 progress: Progress | None = None) -> Evaluation:
        """Scrape `source` every `dt` for `duration` into a throwaway Prometheus, a stretch at a time,
        and run every rule over each stretch."""
        recorder = Recorder(keep_by(self.selectors.wants))
        prometheus = Prometheus(remote_write_receiver=True, out_of_order_window="2h", extra_args=[
            "--query.max-samples=500000000", "--query.timeout=10m", "--storage.tsdb.retention.time=3650d"])
        trackers = {id(rule): AlertTracker(rule.name, rule.hold, rule.keep_firing) for rule in self.rules.alerting}
        rows = {id(rule): _SeriesRows() for rule in self.rules.recording}
        observed: dict[str, list[tuple[dict[str, str], np.ndarray, np.ndarray]]] = {n: [] for n in self.observe}
        stats = {"sim_s": 0.0, "write_s": 0.0, "eval_s": 0.0, "raw_samples": 0, "rule_samples": 0,
                 "raw_series": 0, "ticks": 0}
        ticks = round(duration / dt)
        per_chunk = max(1, round(self.chunk / dt))
        with prometheus, ThreadPoolExecutor(self.threads, thread_name_prefix="bench-eval") as pool:
            client = PromClient(prometheus.url, timeout=600)
            done = 0
            while done < ticks:
                started = time.perf_counter()
                lo = source.now_unix
                for _ in range(min(per_chunk, ticks - done)):
                    source.advance(dt)
                    recorder.add(round(source.now_unix * 1000) - self.scrape_lead_ms, source.sample())
                    done += 1
                hi = source.now_unix
                block = recorder.flush()
                stats["sim_s"] += time.perf_counter() - started
                started = time.perf_counter()
                stats["raw_samples"] += self._write(prometheus.url, block)
                stats["write_s"] += time.perf_counter() - started
                started = time.perf_counter()

                def evaluate(rule: Rule, lo: float = lo, hi: float = hi) -> int:
                    if rule.kind == "record":
                        return self._record(client, prometheus.url, rule, lo, hi, rows[id(rule)], observed)
                    self._alert(client, rule, lo, hi, trackers[id(rule)])
                    return 0

                for wave in self.waves:
                    stats["rule_samples"] += sum(pool.map(evaluate, wave))
                stats["eval_s"] += time.perf_counter() - started
                if progress is not None:
                    progress(done / ticks, name)
            stats["ticks"] = done
            stats["raw_series"] = len(recorder.labels)
        episodes = sorted((e for tracker in trackers.values() for e in tracker.episodes),
                          key=lambda e: (e.fired_at, e.alertname))
        return Evaluation(episodes, observed, stats)

    # -- rules -----------------------------------------------------------------------------------
    @staticmethod
    def _steps(rule: Rule, lo: float, hi: float) -> np.ndarray:
        """Evaluation times of `rule` in (lo, hi]: multiples of its interval after START_UNIX."""
        first = math.floor((lo - START_UNIX) / rule.interval + 1e-9) + 1
        last = math.floor((hi - START_UNIX) / rule.interval + 1e-9)
        return START_UNIX + np.arange(first, last + 1) * rule.interval

    def _query(self, client: PromClient, rule: Rule, steps: np.ndarray) -> list[dict[str, Any]]:
        try:
            return client.query_range(rule.expr, float(steps[0]), float(steps[-1]), rule.interval)
        except PromError as error:
            raise EngineError(f"rule {rule.name} ({rule.source}): {error}") from None

    @staticmethod
    def _points(item: dict[str, Any], steps: np.ndarray, interval: float) -> tuple[np.ndarray, np.ndarray]:
        pairs = item["values"]
        stamps = np.fromiter((p[0] for p in pairs), dtype=np.float64, count=len(pairs))
        values = np.fromiter((float(p[1]) for p in pairs), dtype=np.float64, count=len(pairs))
        index = np.rint((stamps - steps[0]) / interval).astype(np.intp)
        return index, values

    def _record(self, client: PromClient, url: str, rule: Rule, lo: float, hi: float, rows: _SeriesRows,
                observed: dict[str, list[tuple[dict[str, str], np.ndarray, np.ndarray]]]) -> int:
        steps = self._steps(rule, lo, hi)
        if not len(steps):
            return 0
        items = []
        for item in self._query(client, rule, steps):
            metric = {k: v for k, v in item["metric"].items() if k != "__name__"}
            metric.update(rule.labels)
            metric["__name__"] = rule.name
            index, values = self._points(item, steps, rule.interval)
            items.append((tuple(sorted(metric.items())), index, values))
            if rule.name in observed:
                observed[rule.name].append((metric, steps[index], values))
        return self._write(url, rows.block(items, np.rint(steps * 1000).astype(np.int64)))

    def _alert(self, client: PromClient, rule: Rule, lo: float, hi: float, tracker: AlertTracker) -> None:
        steps = self._steps(rule, lo, hi)
        if not len(steps):
            return
        at_step: list[list[tuple[Labels, float]]] = [[] for _ in steps]
        for item in self._query(client, rule, steps):
            metric = {k: v for k, v in item["metric"].items() if k != "__name__"}
            index, values = self._points(item, steps, rule.interval)
            for i, value in zip(index.tolist(), values.tolist(), strict=True):
                labels = dict(metric)
                labels.update({k: template_label(v, metric, value) for k, v in rule.labels.items()})
                labels["alertname"] = rule.name
                at_step[i].append((tuple(sorted(labels.items())), value))
        for ts, present in zip(steps.tolist(), at_step, strict=True):
            tracker.step(ts, present)
