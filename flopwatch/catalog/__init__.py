"""The one metric catalogue: every series FlopWatch exports, with type, unit, help and labels.

Collectors build their families from these specs, `docs/metrics.md` is generated from them and
tests read them, so a metric name is spelled exactly once in the code base. Each family lives in
its own module (gpu, nic, fabric, host, train, job, agent) so capabilities can grow independently.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

MetricType = Literal["gauge", "counter", "histogram"]

#: Every series carries the node (host name) it came from; Prometheus owns `job`/`instance`.
COMMON_LABELS: tuple[str, ...] = ("node",)


@dataclass(frozen=True, eq=False)
class Metric:
    """One exported metric family. `name` is the full exposition name (counters end in _total).

    Compared and hashed by identity: each metric is defined once, and collectors key per-cycle
    dictionaries by it on the hot path."""

    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    #: When the value is absent: the reason a user sees in docs (e.g. "GPM: Hopper and newer").
    availability: str = ""
    #: Histograms only: the upper bounds (`le`) of the finite buckets, ascending.
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.startswith("flopwatch_"):
            raise ValueError(f"{self.name}: every FlopWatch metric starts with flopwatch_")
        if (self.type == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters and only counters end in _total")
        if self.unit and self.unit not in self.name:
            raise ValueError(f"{self.name}: the unit {self.unit!r} belongs in the name")
        if (self.type == "histogram") != bool(self.buckets):
            raise ValueError(f"{self.name}: histograms and only histograms have buckets")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"{self.name}: buckets must be strictly ascending")
        if self.type == "histogram" and self.name.endswith(("_bucket", "_count", "_sum")):
            raise ValueError(f"{self.name}: a histogram's name must not end in _bucket, _count or _sum")
        for reserved in ("job", "instance", "cluster"):
            if reserved in self.labels:
                raise ValueError(f"{self.name}: label {reserved!r} is owned by Prometheus")

    @property
    def all_labels(self) -> tuple[str, ...]:
        return COMMON_LABELS + self.labels

    def family(self) -> GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily:
        """A fresh, empty family for one collect() call (custom-collector pattern)."""
        if self.type == "histogram":
            return HistogramMetricFamily(self.name, self.help, labels=self.all_labels)
        if self.type == "counter":
            return CounterMetricFamily(self.name, self.help, labels=self.all_labels)
        return GaugeMetricFamily(self.name, self.help, labels=self.all_labels)


def _modules() -> list[ModuleType]:
    from flopwatch.catalog import agent, fabric, gpu, host, job, nic, sink, train

    return [agent, gpu, nic, fabric, host, job, train, sink]


def metrics_of(module: ModuleType) -> list[Metric]:
    return [value for value in vars(module).values() if isinstance(value, Metric)]


def all_metrics() -> Iterator[tuple[str, Metric]]:
    """(family module name, metric) for every metric, in catalogue order."""
    seen: set[str] = set()
    for module in _modules():
        section = module.__name__.rsplit(".", 1)[-1]
        for metric in metrics_of(module):
            if metric.name in seen:
                raise ValueError(f"{metric.name} is defined twice in the catalogue")
            seen.add(metric.name)
            yield section, metric


def by_name() -> dict[str, Metric]:
    return {metric.name: metric for _, metric in all_metrics()}
