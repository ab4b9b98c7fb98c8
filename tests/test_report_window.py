"""The report window (--last, --from/--to) and the grid its trends sit on."""

from __future__ import annotations

import pytest

from flopwatch.report.window import (
    Grid,
    Window,
    WindowError,
    format_duration,
    grid_for,
    parse_duration,
    parse_time,
    resolve,
)

NOW = 1_790_000_000.0


def test_last_is_a_span_ending_now():
    assert resolve("7d", None, None, now=NOW) == Window(NOW - 7 * 86400, NOW)
    assert resolve(None, None, None, now=NOW) == Window(NOW - 7 * 86400, NOW)  # the default is a week
    assert resolve("36h", None, None, now=NOW).hours == 36


def test_from_and_to_accept_iso_dates_unix_seconds_and_now():
    window = resolve(None, "2026-11-16", "2026-11-23T00:00:00Z", now=NOW)
    assert window.seconds == 7 * 86400
    assert parse_time("2026-11-16T02:00:00+02:00", "--from") == parse_time("2026-11-16T00:00Z", "--from")
    assert parse_time("1790000000", "--to") == NOW
    assert resolve(None, str(int(NOW - 86400)), None, now=NOW) == Window(NOW - 86400, NOW)


@pytest.mark.parametrize(("last", "start", "end", "message"), [
    ("7d", "2026-11-16", None, "either --last or --from/--to"),
    (None, None, "2026-11-16", "--to needs --from"),
    ("seven days", None, None, "expected a duration like 24h, 7d or 2w"),
    ("30s", None, None, "at least 1m"),
    (None, str(int(NOW - 30)), None, "at least 1m"),
    (None, "2026-11-23", "2026-11-16", "must come after --from"),
    (None, "last tuesday", None, "expected a time like 2026-11-23"),
])
def test_bad_windows_say_what_to_write(last, start, end, message):
    with pytest.raises(WindowError, match=message):
        resolve(last, start, end, now=NOW)


def test_durations():
    assert parse_duration("2w") == 14 * 86400
    assert parse_duration("1h30m") == 5400
    assert format_duration(125 * 60) == "2 h 05 min"
    assert format_duration(45 * 60) == "45 min"
    assert format_duration(3 * 86400 + 4 * 3600) == "3 d 4 h"


def test_grid_has_a_few_hundred_buckets_of_whole_minutes():
    week = Window(NOW - 7 * 86400, NOW)
    grid = grid_for(week, spacing=15)
    assert grid.step == 3600 and grid.n == 168
    assert grid.end == NOW and grid.first == NOW - 167 * 3600
    assert grid.covered_start == week.start
    assert grid.index(grid.first + 3600) == 1


def test_grid_buckets_hold_at_least_two_samples():
    day = Window(NOW - 86400, NOW)
    assert grid_for(day, spacing=15).step == 540          # 86400 / 168 = 514 s, rounded up to minutes
    assert grid_for(day, spacing=600).step == 1200        # 10-minute scrapes: 20-minute buckets



def test_grid_tiles_the_window_exactly():
    """No bucket reaches before the window: it would count samples from before its start."""
    for seconds, spacing in ((100_000, None), (100_003, 15), (65, 5), (125, 5), (3 * 3600 + 7, 15), (60, 30)):
        grid = grid_for(Window(NOW - seconds, NOW), spacing)
        assert grid.covered_start == pytest.approx(NOW - seconds, abs=1e-6), seconds
        assert grid.step >= min(seconds, 60), seconds
        assert round(grid.step * 1000) == pytest.approx(grid.step * 1000, abs=1e-6), seconds  # whole ms
        if spacing:
            assert grid.step >= min(seconds, 2 * spacing), seconds
    assert grid_for(Window(NOW - 65, NOW), 5).n == 1                    # a demo's 65 s: one bucket
    assert grid_for(Window(NOW - 100_000, NOW), None).step == 625      # next longer step that divides it


def test_grid_times():
    grid = Grid(end=1000.0, step=100.0, n=3)
    assert grid.times.tolist() == [800.0, 900.0, 1000.0]
    assert grid.range() == "99999ms"
