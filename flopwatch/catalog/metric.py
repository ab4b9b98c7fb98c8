"""One metric family's spec (the catalogue's unit): name, type, unit, help, labels, and the
checks of FlopWatch's naming rules that run when a family is defined."""

from __future__ import annotations

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


def metrics_of(module: ModuleType) -> list[Metric]:
    """The metric families a catalogue module defines."""
    return [value for value in vars(module).values() if isinstance(value, Metric)]
