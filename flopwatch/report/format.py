"""How values read in the HTML and Markdown reports (CSV files keep raw numbers)."""

from __future__ import annotations

import math
from typing import Any

from flopwatch.report.window import format_duration, format_time

MISSING = "—"


def sentence(text: str) -> str:
    """First letter up, the rest untouched (str.capitalize lowers the rest: "GPU" -> "gpu")."""
    return text[:1].upper() + text[1:]


def number(value: float, digits: int = 1) -> str:
    if abs(value) >= 100 or digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def si(value: float) -> str:
    """1.23e15 -> '1.23 P' (tokens, FLOPs)."""
    for factor, suffix in ((1e24, "Y"), (1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"),
                           (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:,.2f} {suffix}"
    return f"{value:,.0f}"


def fmt(value: Any, kind: str, currency: str = "$") -> str:
    """One cell or figure as text; None and NaN read as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, str):
        return value
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "int":
        return f"{round(value):,d}"
    if kind in ("hours", "kwh"):
        return number(value)
    if kind == "money":
        return f"{currency}{value:,.0f}" if abs(value) >= 100 else f"{currency}{value:,.2f}"
    if kind == "time":
        return format_time(value)
    if kind == "duration":
        return format_duration(value)
    if kind == "si":
        return si(value)
    if kind == "float":
        return number(value, 2)
    return str(value)


def change(now: float | None, before: float | None, kind: str) -> str:
    """Week-over-week change: percentage points for ratios, relative change for quantities."""
    if now is None or before is None:
        return "n/a"
    if kind == "pct":
        return f"{100 * (now - before):+.1f} pp"
    if before == 0:
        return "new" if now else "±0%"
    return f"{100 * (now - before) / abs(before):+.1f}%"
