"""Inline SVG charts: no JavaScript, no fonts or images to fetch, so report.html reads the same
offline, printed to PDF and in mail clients that show SVG. Each chart is a plain <svg> element with
a <title>, a fixed palette and a legend drawn inside it.

Lines break at buckets without data (NaN) rather than drawing through gaps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from html import escape

import numpy as np

from flopwatch.report.format import fmt
from flopwatch.report.model import Chart

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
AREA_PALETTE = ("#2ca02c", "#ffbb78", "#c7c7c7", "#1f77b4", "#d62728")
WIDTH, HEIGHT = 880, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 30
LEGEND_ROW = 18
FONT = 'font-family="Helvetica, Arial, sans-serif" font-size="11"'


def nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above value."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * power * (1 + 1e-9):
            return factor * power
    return 10 * power


def _axis_label(value: float, unit: str, currency: str) -> str:
    if unit == "pct":
        return f"{100 * value:.0f}%"
    if unit == "money":
        return fmt(value, "money", currency)
    if abs(value) >= 1000:
        return f"{value / 1000:,.1f}k".replace(".0k", "k")
    return f"{value:,.2f}".rstrip("0").rstrip(".") if value else "0"


def _time_ticks(start: float, end: float) -> list[tuple[float, str]]:
    span = end - start
    if span >= 2 * 86400:
        step = 86400 * max(1, round(span / 86400 / 8))
        fmt_ = "%b %d"
    elif span >= 12 * 3600:
        step, fmt_ = 6 * 3600, "%d %H:%M"
    else:
        step, fmt_ = 3600 * max(1, round(span / 3600 / 6)), "%H:%M"
    first = math.ceil(start / step) * step
    ticks = []
    t = first
    while t <= end:
        ticks.append((t, datetime.fromtimestamp(t, UTC).strftime(fmt_)))
        t += step
    return ticks


def _frame(chart: Chart, legend: list[tuple[str, str]], body: list[str], y_max: float, unit: str,
           t0: float, t1: float, currency: str, time_axis: bool = True) -> str:
    rows = math.ceil(len(legend) / 3) if legend else 0
    height = HEIGHT + rows * LEGEND_ROW
    plot_h = HEIGHT - TOP - BOTTOM
    plot_w = WIDTH - LEFT - RIGHT
    parts = _svg_open(chart, height)
    intervals = 4 if f"{y_max:e}".startswith("2.0") else 5   # round labels: 0.5 steps of 2, 0.2 of 1
    for i in range(intervals + 1):
        value = y_max * i / intervals
        y = TOP + plot_h - plot_h * i / intervals
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555" {FONT}>'
                     f"{escape(_axis_label(value, unit, currency))}</text>")
    if time_axis and t1 > t0:
        for t, label in _time_ticks(t0, t1):
            x = LEFT + plot_w * (t - t0) / (t1 - t0)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#f0f0f0"/>')
            parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" fill="#555" {FONT}>'
                         f"{escape(label)}</text>")
    parts.extend(body)
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#999"/>')
    parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" stroke="#999"/>')
    for i, (name, color) in enumerate(legend):
        x = LEFT + (i % 3) * (plot_w / 3)
        y = HEIGHT + (i // 3) * LEGEND_ROW
        parts.append(f'<rect x="{x:.1f}" y="{y - 9}" width="12" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 17:.1f}" y="{y}" fill="#222" {FONT}>{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _scale(t0: float, t1: float, y_max: float) -> tuple[Callable[[float], float], Callable[[float], float]]:
    plot_h = HEIGHT - TOP - BOTTOM
    plot_w = WIDTH - LEFT - RIGHT
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return LEFT + plot_w * (t - t0) / span

    def y(v: float) -> float:
        return TOP + plot_h - plot_h * min(v, y_max) / y_max

    return x, y


def line(chart: Chart, currency: str = "$") -> str:
    series = [s for s in chart.series if np.isfinite(np.asarray(s.values, dtype=float)).any()]
    if not series:
        return empty(chart)
    times = np.asarray(series[0].times, dtype=float)
    t0, t1 = float(times.min()), float(times.max())
    top = max(float(np.nanmax(np.asarray(s.values, dtype=float))) for s in series)
    y_max = chart.y_max or nice_max(top)
    x, y = _scale(t0, t1, y_max)
    body, legend = [], []
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        legend.append((s.name, color))
        path, pen = [], "M"
        for t, v in zip(s.times, s.values, strict=True):
            if v is None or not math.isfinite(v):
                pen = "M"
                continue
            path.append(f"{pen}{x(t):.1f},{y(max(v, 0.0)):.1f}")
            pen = "L"
        body.append(f'<path d="{" ".join(path)}" fill="none" stroke="{color}" stroke-width="1.6" '
                    'stroke-linejoin="round"/>')
    return _frame(chart, legend, body, y_max, chart.unit, t0, t1, currency)


def area(chart: Chart, currency: str = "$") -> str:
    """Stacked areas, first series at the bottom."""
    if not chart.series or not any(np.nansum(np.asarray(s.values, dtype=float)) for s in chart.series):
        return empty(chart)
    times = np.asarray(chart.series[0].times, dtype=float)
    t0, t1 = float(times.min()), float(times.max())
    stack = np.zeros(times.size)
    layers = []
    for s in chart.series:
        bottom = stack.copy()
        stack = stack + np.nan_to_num(np.asarray(s.values, dtype=float))
        layers.append((s.name, bottom, stack.copy()))
    y_max = chart.y_max or nice_max(float(stack.max()))
    x, y = _scale(t0, t1, y_max)
    body, legend = [], []
    for i, (name, bottom, top) in enumerate(layers):
        color = AREA_PALETTE[i % len(AREA_PALETTE)]
        legend.append((name, color))
        upper = [f"{x(t):.1f},{y(v):.1f}" for t, v in zip(times, top, strict=True)]
        lower = [f"{x(t):.1f},{y(v):.1f}" for t, v in zip(times[::-1], bottom[::-1], strict=True)]
        body.append(f'<polygon points="{" ".join(upper + lower)}" fill="{color}" stroke="none"/>')
    return _frame(chart, legend, body, y_max, chart.unit, t0, t1, currency)


def bar(chart: Chart, currency: str = "$") -> str:
    """Horizontal bars with their labels and values."""
    bars = [(label, value) for label, value in chart.bars if value is not None and math.isfinite(value)]
    if not bars or not any(v > 0 for _, v in bars):
        return empty(chart)
    row, label_w = 26, 150
    height = TOP + row * len(bars) + 10
    top = max(v for _, v in bars)
    plot_w = WIDTH - label_w - 110
    parts = _svg_open(chart, height)
    for i, (label, value) in enumerate(bars):
        y = TOP + i * row
        w = plot_w * max(value, 0.0) / top
        parts.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" fill="#222" {FONT}>'
                     f"{escape(label)}</text>")
        parts.append(f'<rect x="{label_w}" y="{y + 4}" width="{max(w, 1):.1f}" height="{row - 8}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}"/>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" fill="#222" {FONT}>'
                     f"{escape(fmt(value, chart.unit, currency))}</text>")
    parts.append("</svg>")
    return "".join(parts)


def empty(chart: Chart) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-empty" data-chart="{escape(chart.name)}" '
            f'viewBox="0 0 {WIDTH} 60" width="{WIDTH}" height="60" role="img" aria-label="{escape(chart.title)}">'
            f"<title>{escape(chart.title)}</title>"
            f'<rect x="0.5" y="0.5" width="{WIDTH - 1}" height="59" fill="#fafafa" stroke="#ddd"/>'
            f'<text x="{WIDTH / 2}" y="35" text-anchor="middle" fill="#777" {FONT}>no data for this chart</text>'
            "</svg>")


def render(chart: Chart, currency: str = "$") -> str:
    return {"line": line, "area": area, "bar": bar}[chart.kind](chart, currency)


def _svg_open(chart: Chart, height: float) -> list[str]:
    """The chart's <svg> element, its title (for screen readers) and a white background."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{escape(chart.name)}" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="{escape(chart.title)}">',
        f"<title>{escape(chart.title)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>',
    ]
