"""The one metric catalogue: every series FlopWatch exports, with type, unit, help and labels.

Collectors build their families from these specs, `docs/metrics.md` is generated from them and
tests read them, so a metric name is spelled exactly once in the code base. Each family lives in
its own module (gpu, nic, fabric, host, train, job, agent) so capabilities can grow independently.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

from flopwatch.catalog.metric import COMMON_LABELS, Metric, MetricType, metrics_of

__all__ = ["COMMON_LABELS", "Metric", "MetricType", "all_metrics", "by_name", "metrics_of"]


def _modules() -> list[ModuleType]:
    from flopwatch.catalog import agent, fabric, gpu, host, job, nic, remediate, sink, train

    return [agent, gpu, nic, fabric, host, job, train, sink, remediate]


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
