"""report.html (self-contained), report.md and the CSV files, and how values read."""

from __future__ import annotations

import csv
import math

from flopwatch.report import render
from flopwatch.report.format import change, fmt, sentence
from flopwatch.report.model import Chart, Column, Figure, Report, Section, Series, Table

T0 = 1_790_000_000.0


def report() -> Report:
    table = Table("jobs", "Per job", [Column("job_id", "Job"), Column("gpu_hours", "GPU-hours", "hours"),
                                      Column("mfu", "MFU", "pct"), Column("first", "From", "time"),
                                      Column("cost", "Cost", "money"), Column("gpus", "GPUs", "int")])
    table.rows = [{"job_id": "a|<b>", "gpu_hours": 1234.5, "mfu": 0.4213, "first": T0, "cost": 99.5, "gpus": 64.0},
                  {"job_id": "c", "gpu_hours": 2.0, "mfu": None, "first": None, "cost": math.nan, "gpus": 8}]
    chart = Chart("trend", "Trend", "line", "pct", [Series("x", [T0, T0 + 3600], [0.1, 0.2])])
    section = Section("usage", "GPU-hours", intro="Intro & more", figures=[Figure("MFU", 0.31, "pct", "all GPUs")],
                      charts=[chart], tables=[table, Table("none", "Nothing", [Column("x", "X")], empty="no rows")],
                      notes=["A note."], items=["Do this."])
    return Report("FlopWatch utilization report", "http://127.0.0.1:9090", T0 - 7 * 86400, T0, T0, 600.0, "€",
                  sections=[section])


def test_html_is_self_contained_and_escaped():
    html = render.html(report())
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html and "<link" not in html and "<img" not in html
    assert "a|&lt;b&gt;" in html and "Intro &amp; more" in html
    assert '<td class="n">1,234</td>' in html and "42.1%" in html and "€99.50" in html
    assert "2026-" in html and "<svg" in html and 'class="note">A note.' in html and "<li>Do this.</li>" in html
    assert "No rows." in html


def test_markdown_tables_and_notes():
    markdown = render.markdown(report())
    assert "# FlopWatch utilization report" in markdown and "## GPU-hours" in markdown
    assert "| a\\|<b> | 1,234 | 42.1% |" in markdown
    assert "> **Note:** A note." in markdown and "- Do this." in markdown and "- **MFU:** 31.0% (all GPUs)" in markdown
    assert "*Chart: Trend (in report.html).*" in markdown and "*No rows.*" in markdown


def test_csv_keeps_raw_numbers(tmp_path):
    written = render.write_all(report(), tmp_path)
    assert sorted(p.name for p in written) == ["jobs.csv", "none.csv", "report.html", "report.md"]
    rows = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    assert rows[0] == {"job_id": "a|<b>", "gpu_hours": "1234.5", "mfu": "0.4213", "first": "2026-09-21T14:13:20Z",
                       "cost": "99.5", "gpus": "64"}
    assert rows[1]["mfu"] == "" and rows[1]["cost"] == "" and rows[1]["first"] == ""


def test_value_formats():
    assert fmt(None, "pct") == "—" and fmt(math.nan, "hours") == "—"
    assert fmt(0.123, "pct") == "12.3%" and fmt(12.345, "hours") == "12.3" and fmt(1234.5, "kwh") == "1,234"
    assert fmt(2.5e9, "si") == "2.50 G" and fmt(7200, "duration") == "2 h" and fmt(3.0, "int") == "3"
    assert change(0.42, 0.40, "pct") == "+2.0 pp" and change(110, 100, "hours") == "+10.0%"
    assert change(5, 0, "int") == "new" and change(None, 1, "int") == "n/a"
    assert sentence("GPU lost") == "GPU lost" and sentence("this Prometheus") == "This Prometheus"
