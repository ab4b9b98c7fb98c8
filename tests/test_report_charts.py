"""Inline SVG charts: well-formed, self-contained, breaking lines at gaps, stacking areas."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from flopwatch.report import charts
from flopwatch.report.model import Chart, Series

DAY = 86400.0
SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    assert "script" not in svg and "href" not in svg
    return root


@pytest.mark.parametrize(("value", "nice"), [(0.42, 0.5), (0.51, 1.0), (130, 200), (2300, 2500), (0, 1.0),
                                             (1.0, 1.0), (7, 10)])
def test_nice_max(value, nice):
    assert charts.nice_max(value) == pytest.approx(nice)


def test_line_chart_breaks_at_gaps_and_draws_a_legend():
    times = [i * 3600.0 for i in range(48)]
    values = [0.4] * 10 + [math.nan] * 5 + [0.35] * 33
    chart = Chart("mfu", "MFU <over> time", "line", "pct",
                  [Series("fleet", times, values), Series("job a", times, [0.2] * 48)])
    root = parse(charts.render(chart))
    paths = root.findall(f"{SVG}path")
    assert len(paths) == 2
    assert paths[0].get("d").count("M") == 2   # the gap splits the line
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "fleet" in texts and "job a" in texts and "40%" in texts
    assert root.find(f"{SVG}title").text == "MFU <over> time"


def test_area_chart_stacks_layers():
    times = [0.0, DAY, 2 * DAY]
    chart = Chart("states", "GPUs", "area", "int", [Series("busy", times, [10, 10, 15]),
                                                    Series("idle", times, [5, 5, 0])])
    root = parse(charts.render(chart))
    polygons = root.findall(f"{SVG}polygon")
    assert len(polygons) == 2
    top_of_idle = [float(p.split(",")[1]) for p in polygons[1].get("points").split()[:3]]
    assert top_of_idle[0] == top_of_idle[2]   # 10 + 5 on the first day, 15 + 0 on the last: equal heights


def test_bar_chart_labels_and_values():
    chart = Chart("xids", "XIDs", "bar", "int", bars=[("XID 79", 3.0), ("XID 13", 1.0)])
    root = parse(charts.render(chart))
    widths = [float(r.get("width")) for r in root.findall(f"{SVG}rect")[1:]]
    assert widths[0] == pytest.approx(3 * widths[1], rel=0.01)
    assert [t.text for t in root.iter(f"{SVG}text")] == ["XID 79", "3", "XID 13", "1"]


def test_charts_without_data_say_so():
    for chart in (Chart("a", "A", "line", series=[Series("x", [0.0, 1.0], [math.nan, math.nan])]),
                  Chart("b", "B", "bar", bars=[("x", 0.0)]), Chart("c", "C", "area")):
        svg = charts.render(chart)
        parse(svg)
        assert "chart-empty" in svg and "no data for this chart" in svg
