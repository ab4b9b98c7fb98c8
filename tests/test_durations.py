"""flopwatch/durations.py: Prometheus's duration grammar for every file and flag."""

from __future__ import annotations

import pytest

from flopwatch.durations import DurationError, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("1m30s", 90), ("1h", 3600), ("500ms", 0.5), ("2w", 14 * 86400), ("1y", 365 * 86400), ("0", 0),
    ("1d12h", 1.5 * 86400), ("1h0m0s", 3600), ("90s", 90), (" 5m ", 300), ("1s500ms", 1.5),
])
def test_prometheus_durations(text, seconds):
    assert parse_duration(text, "x", bare_seconds=False) == seconds


@pytest.mark.parametrize("text", ["", "5", "1.5m", "30 s", "m", "1s1m", "1h1h", "5M", "-5m", "soon", "1e3s"])
def test_what_prometheus_refuses_is_refused_with_where_and_an_example(text):
    with pytest.raises(DurationError, match=r"^scrape\.interval: .*(expected a duration like 30s|negative)"):
        parse_duration(text, "scrape.interval", bare_seconds=False)


def test_bare_numbers_are_seconds_where_the_caller_allows_them():
    assert parse_duration(90, "x") == 90 and parse_duration(2.5, "x") == 2.5 and parse_duration("3600", "x") == 3600
    with pytest.raises(DurationError, match="cannot be negative"):
        parse_duration(-1, "x")
    with pytest.raises(DurationError, match="expected a duration"):
        parse_duration(True, "x")
    with pytest.raises(DurationError, match="expected a duration"):
        parse_duration(90, "x", bare_seconds=False)
