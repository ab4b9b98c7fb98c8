"""The weekly utilization report (`flopwatch report`): where the GPU-hours and the energy went, and
what they bought, from any Prometheus holding FlopWatch series.

Modules, one job each: window (the span and its grid), settings (prices, thresholds), queries (the
PromQL), fetch (running it), facts (numbers per cluster and job), incidents (stragglers, hardware,
lemon nodes), sections and recommend (what the report says), charts (inline SVG), render (HTML,
Markdown, CSV), pdf (Chromium), build (all of it in order).
"""

from flopwatch.report.build import build, write
from flopwatch.report.fetch import Unreachable
from flopwatch.report.settings import ReportSettings, SettingsError
from flopwatch.report.window import Window, WindowError, resolve

__all__ = ["ReportSettings", "SettingsError", "Unreachable", "Window", "WindowError", "build", "resolve", "write"]
