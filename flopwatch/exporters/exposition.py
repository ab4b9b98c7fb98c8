"""Fast Prometheus text-format (0.0.4) rendering with a cache of each series' label prefix.

`prometheus_client.generate_latest` escapes and formats every label of every sample on every
call (about 13 µs a sample here). The agent renders the same series every cycle, so this keeps
the rendered `name{labels} ` prefix of each series from the previous render and only formats the
value. Output is equivalent to generate_latest's (a test parses both and compares); the cache holds
only the series seen in the last render, so label churn cannot grow it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import Metric as Family
from prometheus_client.samples import Sample

from flopwatch.catalog import Metric as CatalogMetric

#: How generate_latest names and types a family in the 0.0.4 text format.
_SUFFIX = {"counter": "_total", "info": "_info"}
_TEXT_TYPE = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
              "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(family: Family) -> str:
    name = family.name + _SUFFIX.get(family.type, "")
    kind = _TEXT_TYPE.get(family.type, "untyped")
    return f"# HELP {name} {_escape_help(family.documentation)}\n# TYPE {name} {kind}\n"


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class ExpositionRenderer:
    """Renders families to bytes; keep one instance per exposition to benefit from its cache."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, tuple[str, ...]], str] = {}
        self._headers: dict[tuple[str, str, str], str] = {}

    def render(self, families: Iterable[Family]) -> bytes:
        out: list[str] = []
        self.render_into(families, out)
        return "".join(out).encode()

    def render_into(self, families: Iterable[Family], out: list[str]) -> None:
        old, new = self._prefixes, {}
        append = out.append
        for family in families:
            kind = family.type
            header_key = (family.name, family.documentation, kind)
            header = self._headers.get(header_key)
            if header is None:
                header = self._headers[header_key] = _header(family)
            append(header)
            for sample in family.samples:
                if kind == "counter" and sample.name.endswith("_created"):
                    continue
                key = (sample.name, tuple(sample.labels.values()))
                prefix = old.get(key)
                if prefix is None:
                    if sample.labels:
                        labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sample.labels.items())
                        prefix = f"{sample.name}{{{labels}}} "
                    else:
                        prefix = f"{sample.name} "
                new[key] = prefix
                value = sample.value
                if value.__class__ is float and math.isfinite(value):
                    append(prefix + repr(value) + "\n")
                else:
                    append(prefix + format_value(value) + "\n")
        self._prefixes = new


class Blocks:
    """Samples of one collect() grouped per catalogue metric, as parallel lists.

    Collectors that fill these instead of prometheus_client families let the renderer reuse a
    whole metric's text as a `%` template when its series are the same as last time (the common
    case), which is what lets one simulator process serve thousands of nodes. `families()` gives
    the same samples as ordinary families for prometheus_client's registry.
    """

    def __init__(self, node: str) -> None:
        self.node = node
        self.series: dict[CatalogMetric, list[tuple[str, ...]]] = {}
        self.values: dict[CatalogMetric, list[float]] = {}
        self.suffixes: dict[CatalogMetric, list[str]] = {}

    def add(self, metric: CatalogMetric, labels: Sequence[str], value: float | bool | None) -> None:
        """One sample; `labels` follow metric.labels (node is added); None means absent."""
        if value is None:
            return
        series = self.series.get(metric)
        if series is None:
            series = self.series[metric] = []
            self.values[metric] = []
        series.append((self.node, *labels))
        self.values[metric].append(float(value))

    def lists(self, metric: CatalogMetric) -> tuple[list[tuple[str, ...]], list[float]]:
        """The series and values lists of `metric`, for collectors that append in bulk; series
        tuples must start with the node, values must be floats."""
        series = self.series.get(metric)
        if series is None:
            series = self.series[metric] = []
            self.values[metric] = []
        return series, self.values[metric]

    def add_histogram(self, metric: CatalogMetric, labels: Sequence[str],
                      cumulative: Sequence[tuple[float, float]], total: float) -> None:
        """A histogram: (upper bound, cumulative count) pairs ending with +Inf, and the sum."""
        series, suffixes = histogram_series(self.node, labels, [bound for bound, _ in cumulative])
        values = [*(float(count) for _, count in cumulative), float(cumulative[-1][1]), float(total)]
        # new lists, not extended in place: a collector may have handed over lists it keeps
        self.suffixes[metric] = self.suffixes.get(metric, []) + suffixes
        self.series[metric] = self.series.get(metric, []) + series
        self.values[metric] = self.values.get(metric, []) + values

    def families(self) -> Iterator[Family]:
        for metric, series in self.series.items():
            family = metric.family()
            suffixes = self.suffixes.get(metric)
            names = metric.all_labels
            for i, (labels, value) in enumerate(zip(series, self.values[metric], strict=True)):
                suffix = suffixes[i] if suffixes else ""
                label_names = (*names, "le") if suffix == "_bucket" else names
                family.samples.append(Sample(metric.name + suffix, dict(zip(label_names, labels, strict=True)),
                                             value, None, None))
            yield family


def histogram_series(node: str, labels: Sequence[str],
                     bounds: Sequence[float]) -> tuple[list[tuple[str, ...]], list[str]]:
    """A histogram's label tuples and name suffixes, in the order Blocks.add_histogram adds its
    values: one bucket per bound (the last +Inf), then _count and _sum."""
    base = (node, *labels)
    series = [(*base, "+Inf" if math.isinf(bound) else repr(float(bound))) for bound in bounds]
    return [*series, base, base], ["_bucket"] * len(bounds) + ["_count", "_sum"]


class _MetricText:
    """One metric's last rendering: its series, its `%` template, the values and the text (UTF-8)."""

    __slots__ = ("series", "suffixes", "template", "text", "values")

    def __init__(self, series: list[tuple[str, ...]], suffixes: list[str] | None, template: str) -> None:
        self.series, self.suffixes, self.template = series, suffixes, template
        self.values: list[float] = []
        self.text = b""


class BlockRenderer:
    """Renders Blocks, one cached `%` template per metric, reused while its series are unchanged
    (the same list object, as the simulator's collectors hand back, is not compared item by item),
    and the metric's last text, reused while its values are unchanged too (info series, limits,
    counters that did not move: over half of a GPU node's samples between two cycles). Texts are
    kept encoded, so an unchanged metric is not encoded again either."""

    def __init__(self) -> None:
        self._texts: dict[CatalogMetric, _MetricText] = {}

    def render(self, blocks: Blocks, out: list[bytes]) -> None:
        last, texts = self._texts, {}
        all_values, all_suffixes, append = blocks.values, blocks.suffixes, out.append
        for metric, series in blocks.series.items():
            suffixes = all_suffixes.get(metric) if all_suffixes else None
            values = all_values[metric]
            text = last.get(metric)
            if text is None or (text.series is not series and text.series != series) or text.suffixes != suffixes:
                text = _MetricText(series, suffixes, _template(metric, series, suffixes))
            if text.values != values or not text.text:   # NaN never equals itself: re-rendered each time
                text.values = list(values)
                text.text = _fill(text.template, values).encode()
            texts[metric] = text
            append(text.text)
        self._texts = texts


def _fill(template: str, values: list[float]) -> str:
    """The metric's text: its `%` template filled with the values as the 0.0.4 format writes them."""
    if math.isfinite(sum(values)):   # no NaN or infinity (a sum that overflows takes the slow path)
        first = values[0] if len(values) > 1 else 0.0
        if first and first.__class__ is float and values.count(first) == len(values):
            return template % ((str(first),) * len(values))   # one value (every rank's step count): one repr
        return template % tuple(values)
    return template % tuple(map(format_value, values))


def _template(metric: CatalogMetric, series: list[tuple[str, ...]], suffixes: list[str] | None) -> str:
    """The header and every series' name and labels, with a `%s` where each value goes."""
    family = metric.family()
    lines = [_header(family).replace("%", "%%")]
    for i, labels in enumerate(series):
        suffix = suffixes[i] if suffixes else ""
        names = (*metric.all_labels, "le") if suffix == "_bucket" else metric.all_labels
        text = ",".join(f'{name}="{_escape_value(value)}"' for name, value in zip(names, labels, strict=True))
        lines.append(f"{metric.name}{suffix}{{{text.replace('%', '%%')}}} %s\n")
    return "".join(lines)
