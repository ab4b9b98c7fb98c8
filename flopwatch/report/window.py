"""The span a report covers (`--last 7d` or `--from T --to T`) and the grid its trends sit on.

Times are unix seconds. `--from/--to` take ISO 8601 (a date, or a date and time; no offset means
UTC), unix seconds, or `now`. The grid divides the window into a few hundred buckets no finer
than twice the sample spacing, so every bucket holds at least two samples of every series and a
week of a large cluster is 168 points per series, not forty thousand; the buckets tile the window
exactly, so nothing before its start is counted.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from flopwatch import durations

#: Buckets per window the grid aims at: one an hour for a week. Trends and straggler detection
#: live on the grid; GPU-hours, MFU and energy totals do not depend on it. Each range query costs
#: Prometheus one evaluation per bucket, so this is the report's main cost lever.
TARGET_BUCKETS = 168
MIN_STEP_S = 60
#: The shortest window: a demo's few minutes are a report too (its figures say what they cover).
MIN_WINDOW_S = 60


class WindowError(ValueError):
    """The requested span is wrong; the message says what to write instead."""


def parse_duration(text: str, flag: str = "--last") -> float:
    """'7d' -> 604800.0 (Prometheus's grammar, flopwatch/durations.py); plain numbers are seconds."""
    try:
        seconds = durations.parse_duration(text, flag)
    except durations.DurationError:
        raise WindowError(f"{flag} {text!r}: expected a duration like 24h, 7d or 2w") from None
    if seconds < MIN_WINDOW_S:
        raise WindowError(f"{flag} {text!r}: a report covers at least 1m")
    return seconds


def parse_time(text: str, flag: str, now: float | None = None) -> float:
    """ISO 8601 (UTC unless an offset is given), unix seconds, or 'now'."""
    value = str(text).strip()
    if value.lower() == "now":
        return float(now if now is not None else time.time())
    if re.fullmatch(r"\d{9,11}(\.\d+)?", value):
        return float(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise WindowError(f"{flag} {text!r}: expected a time like 2026-11-23, 2026-11-23T08:00Z or unix "
                          "seconds") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


@dataclass(frozen=True)
class Window:
    """The half-open span (start, end] in whole unix seconds."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    def previous(self) -> Window:
        """The span of equal length just before this one (week-over-week)."""
        return Window(self.start - self.seconds, self.start)

    def range(self) -> str:
        """The window as a PromQL range, e.g. '604800s'."""
        return f"{int(self.seconds)}s"


def resolve(last: str | None, start: str | None, end: str | None, now: float | None = None) -> Window:
    """The window from the command-line flags: --last alone, or --from and --to (default now)."""
    now = float(int(now if now is not None else time.time()))
    if last is not None and (start is not None or end is not None):
        raise WindowError("give either --last or --from/--to, not both")
    if start is None and end is not None:
        raise WindowError("--to needs --from (or use --last)")
    if start is None:
        return Window(now - parse_duration(last or "7d"), now)
    begin = float(int(parse_time(start, "--from", now)))
    finish = float(int(parse_time(end, "--to", now))) if end is not None else now
    if finish <= begin:
        raise WindowError(f"--to ({format_time(finish)}) must come after --from ({format_time(begin)})")
    if finish - begin < MIN_WINDOW_S:
        raise WindowError("the window from --from to --to must be at least 1m")
    return Window(begin, finish)


@dataclass(frozen=True)
class Grid:
    """Buckets of `step` seconds ending at `end`: point k is at first + k*step and covers the step
    before it, so the n points cover (end - n*step, end]."""

    end: float
    step: float
    n: int

    @property
    def first(self) -> float:
        return self.end - (self.n - 1) * self.step

    @property
    def times(self) -> np.ndarray:
        return self.first + self.step * np.arange(self.n)

    @property
    def covered_start(self) -> float:
        return self.end - self.n * self.step

    def index(self, t: float) -> int:
        return round((t - self.first) / self.step)

    def range(self) -> str:
        """The bucket as a PromQL range: a millisecond short of the step, so that Prometheus 2's
        closed ranges ([t - step, t]) do not count a sample on a boundary in two buckets; each
        bucket is (t - step, t] as in Prometheus 3."""
        return f"{int(self.step * 1000) - 1}ms"


def grid_for(window: Window, spacing: float | None) -> Grid:
    """About TARGET_BUCKETS buckets, each at least twice the sample spacing and a minute, that tile
    the window exactly: a bucket reaching before the window's start would count samples from
    before it. The step is the whole-minute step those bounds give when it divides the window
    (a week, a day, an hour), else the next longer one that does, in whole milliseconds."""
    step = max(window.seconds / TARGET_BUCKETS, 2 * (spacing or 0), MIN_STEP_S)
    step = float(math.ceil(step / MIN_STEP_S) * MIN_STEP_S)
    millis = round(window.seconds * 1000)
    n = max(1, math.floor(window.seconds / step + 1e-9))
    while millis % n:
        n -= 1
    return Grid(window.end, millis / n / 1000, n)


def format_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def format_duration(seconds: float) -> str:
    """'2 h 05 min', '45 min', '3 d 4 h'."""
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
