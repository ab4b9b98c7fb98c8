"""Turning a simulated fleet into the samples a Prometheus scraping it every tick would store.

Two ways to read a node, with the same output (series with the scrape's `job` and `instance`
labels plus `up`): `ExactSampler` renders the node's real agent and parses the text, exactly what a
scrape returns; `FastSampler` (fast_sampler.py) reads the fleet state in bulk. `Recorder` collects
ticks into blocks of (series x ticks) with Prometheus's stale markers where a series disappears,
keeping only the series the rules select.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from flopwatch.detect.dcgm_sampler import DcgmSampler, agent_names
from flopwatch.detect.fast_sampler import SCRAPE_JOB, FastSampler, Group, Labels, supported_names
from flopwatch.detect.remote_write import STALE_NAN, encode_labels
from flopwatch.sim.dcgm_exposition import field_names, uses_flopwatch_counters
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_series(text: str, node: str) -> Labels:
    """`name{a="b",...}` (exposition text) -> sorted labels with job and instance added."""
    brace = text.find("{")
    if brace < 0:
        name, pairs = text, {}
    else:
        name = text[:brace]
        pairs = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                 for k, v in _LABEL.findall(text[brace + 1:-1])}
    pairs["job"] = SCRAPE_JOB
    pairs["instance"] = node
    return tuple(sorted([("__name__", name), *pairs.items()]))


class ExactSampler:
    """Nodes read through their own SimNodeAgent: the exposition a scrape would get, parsed."""

    def __init__(self, fleet: Fleet, nodes: list[int]) -> None:
        self.fleet = fleet
        self.agents = [SimNodeAgent(fleet, fleet.nodes[i]) for i in nodes]
        self._parsed: dict[str, Labels] = {}
        self._last: dict[int, tuple[list[str], tuple[Labels, ...]]] = {}

    def sample(self) -> Iterator[Group]:
        for position, agent in enumerate(self.agents):
            node = agent.agent.node
            texts: list[str] = [f'up{{node="{node}"}}']
            values: list[float] = [1.0]
            for line in agent.render().decode().split("\n"):
                if not line or line[0] == "#":
                    continue
                series, _, value = line.rpartition(" ")
                texts.append(series)
                values.append(float(value))
            last = self._last.get(position)
            if last is None or last[0] != texts:
                labels = tuple(self._labels(text, node) for text in texts)
                last = self._last[position] = (texts, labels)
            yield last[1], values

    def _labels(self, text: str, node: str) -> Labels:
        labels = self._parsed.get(text)
        if labels is None:
            labels = self._parsed[text] = parse_series(text, node)
        return labels


class FleetSampler:
    """Every node of a fleet, through the fast path except `exact_nodes` (and all of them when
    `exact` is set or the rules read a series the fast path does not produce). With the fleet's
    `exporter` a dcgm-exporter mode, every node's GPUs come from dcgm_sampler.py instead, and the
    agent part serves the rest (no lost-GPU state machine to run: no exact nodes needed)."""

    def __init__(self, fleet: Fleet, wanted: set[str], exact_nodes: Iterable[int] = (), exact: bool = False) -> None:
        everyone = range(len(fleet.nodes))
        self.parts: list[ExactSampler | FastSampler | DcgmSampler] = []
        exporter = fleet.scenario.fleet.exporter
        if exporter != "agent":
            self.parts.append(DcgmSampler(fleet, list(everyone), wanted, uses_flopwatch_counters(exporter)))
            wanted, exact_nodes = agent_names(wanted) - field_names(True), ()
        exact_set = set(everyone) if exact or not wanted <= supported_names() else set(exact_nodes)
        fast = [i for i in everyone if i not in exact_set]
        self.exact_nodes = sorted(exact_set)
        if fast:
            self.parts.append(FastSampler(fleet, fast, wanted))
        if exact_set:
            self.parts.append(ExactSampler(fleet, sorted(exact_set)))

    def sample(self) -> Iterator[Group]:
        for part in self.parts:
            yield from part.sample()


@dataclass
class Block:
    """Samples of a stretch of ticks: series i has `labels[i]` and the samples where present[i]."""

    labels: list[Labels]
    label_bytes: list[bytes]
    values: np.ndarray        # (series, ticks), stale markers included
    present: np.ndarray       # (series, ticks) bool: a sample (or stale marker) to write
    timestamps_ms: np.ndarray

    @property
    def samples(self) -> int:
        return int(self.present.sum())


class Recorder:
    """Collects sampled ticks; `flush()` returns them as one Block and starts the next."""

    def __init__(self, keep: Callable[[Labels], bool]) -> None:
        self.keep = keep
        self.columns: dict[Labels, int] = {}
        self.labels: list[Labels] = []
        self.label_bytes: list[bytes] = []
        self._groups: dict[int, tuple[tuple[Labels, ...], np.ndarray, np.ndarray]] = {}
        self._ticks: list[tuple[int, list[tuple[np.ndarray, np.ndarray]]]] = []
        self._was_present = np.zeros(0, dtype=bool)

    def add(self, timestamp_ms: int, groups: Iterable[Group]) -> None:
        parts = []
        for labels, values in groups:
            cached = self._groups.get(id(labels))
            if cached is None or cached[0] is not labels:
                cached = self._groups[id(labels)] = (labels, *self._map(labels))
            _, index, columns = cached
            if not len(columns):
                continue
            array = np.asarray(values, dtype=np.float64)
            parts.append((columns, array if len(index) == len(labels) else array[index]))
        self._ticks.append((timestamp_ms, parts))

    def _map(self, labels: tuple[Labels, ...]) -> tuple[np.ndarray, np.ndarray]:
        index, columns = [], []
        for i, series in enumerate(labels):
            column = self.columns.get(series)
            if column is None:
                if not self.keep(series):
                    continue
                column = self.columns[series] = len(self.labels)
                self.labels.append(series)
                self.label_bytes.append(encode_labels(series))
            index.append(i)
            columns.append(column)
        return np.array(index, dtype=np.intp), np.array(columns, dtype=np.intp)

    @property
    def pending_ticks(self) -> int:
        return len(self._ticks)

    def flush(self) -> Block | None:
        if not self._ticks:
            return None
        series, ticks = len(self.labels), len(self._ticks)
        values = np.zeros((series, ticks))
        present = np.zeros((series, ticks), dtype=bool)
        for j, (_, parts) in enumerate(self._ticks):
            for columns, array in parts:
                values[columns, j] = array
                present[columns, j] = True
        before = np.zeros(series, dtype=bool)
        before[:len(self._was_present)] = self._was_present
        previous = np.concatenate([before[:, None], present[:, :-1]], axis=1)
        stale = previous & ~present
        values[stale] = STALE_NAN
        self._was_present = present[:, -1].copy()
        stamps = np.array([stamp for stamp, _ in self._ticks], dtype=np.int64)
        self._ticks = []
        send = present | stale
        rows = np.flatnonzero(send.any(axis=1))
        return Block([self.labels[i] for i in rows], [self.label_bytes[i] for i in rows], values[rows],
                     send[rows], stamps)


def keep_by(selectors_wants: Callable[[str, dict[str, str]], bool]) -> Callable[[Labels], bool]:
    """A Recorder filter from a (name, labels) predicate such as rules.Selectors.wants."""
    def keep(labels: Labels) -> bool:
        pairs = dict(labels)
        return selectors_wants(pairs.get("__name__", ""), pairs)
    return keep
