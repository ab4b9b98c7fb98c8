"""Windows and evaluation intervals from the scrape interval the rules are built for
(`scrape_interval`, default 5s: the interval the templates' literal durations are written for).

A rule that reads a range of samples needs enough of them in it. With samples every `s`, a range
of length `w` holds floor(w/s) of them when a sample falls exactly on its start and the range is
left-open (Prometheus 3 leaves that sample out), floor(w/s) or ceil(w/s) otherwise; Prometheus 2
closes the range and counts that sample too. So floor(w/s) is what a range holds on both releases,
and a scrape that fails, or lands in storage after the evaluation that reads it, takes one more
away. From that, four rules (docs/rules.md, "Scrape interval"):

- `span`: a window that slides with each evaluation (rate, increase, *_over_time, and windows
  given in the settings) is at least 4 scrapes: max(w, 4 x s). It holds 4 samples, 3 when one is
  missing, where 2 are needed for a difference and several for a mean (Prometheus's own advice for
  rate(); the windows written for 5s hold 6 or more already). A window over a recorded series counts
  that group's evaluations, never more than 2 x s apart (the tile), so it holds 2 or more of them.
- `tile`: a difference a group takes over its own interval and sums or averages over its
  evaluations (goodput's `increase15s` family: the window, the group's interval, the `offset` that
  reads the evaluation before and the divisor that turns it into a rate) is max(15s, 2 x s): the
  tiles must neither overlap nor leave gaps, so window and interval are one duration, and 2 x s is
  the shortest that always holds the two samples a difference needs. Against `offset`, a missed
  scrape moves its change into the next tile; against a window, the tile that loses a sample gives
  no value and drops out of the 5-minute means, which weigh the tiles that remain: a gap, not a
  bias. (4 x s tiles would leave one tile in 5 minutes at a 60s scrape.)
- `settled`: a tiled difference of scraped series reads them one tile in the past, the tile before
  the evaluation's. A scrape's samples carry the moment it started and reach storage when it ends,
  up to its timeout (at most s) later, plus the parsing and appending: an evaluation reading a
  counter now can miss the scrape in flight, and the next tile, reading that same moment as its
  start after the scrape landed, never counts the change between them. The share lost is the
  scrapes' duration over the tile (0.6 s scrapes lost 4.3%: tests/integration/test_slow_scrapes.py).
  A tile back (at least 2 x s) every scrape an evaluation reads has landed, and the tiles stay on
  the group's own evaluation grid; goodput is one tile later. Each end reads through a failed
  scrape: its stale marker leaves a lookup empty, and a node missing from a tile that sums nodes
  reads its job short (a bias, not a gap), so where the scrape after it landed, the one before
  stands in.
- `every`: a group's interval is at least the scrape interval: max(interval, s); more often only
  reads the same samples again. A `for:` that counts evaluations ("held two evaluations") is a
  multiple of its group's interval and scales with it.
- Windows of 5m and more are left as written: 4 scrapes of 60s and 2 tiles of 2m fit in them.

Supported: 1s to 60s. Coarser, the 5-minute windows would need widening too, and the rules that
compare a 5-minute figure with its own recent past would change meaning.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flopwatch.durations import format_duration, parse_duration

#: The scrape interval the templates' literal windows and intervals are written for.
BASE_SECONDS = 5.0
#: The supported range of `scrape_interval`, in seconds.
MINIMUM_SECONDS, MAXIMUM_SECONDS = 1.0, 60.0
#: Samples a sliding window holds at least, and a tile.
SPAN_SCRAPES, TILE_SCRAPES = 4, 2
#: The tile at the base scrape interval (the `15s` of the `increase15s` records).
TILE_SECONDS = 15.0
#: Settings written into a template as `c.<path> | span` (windows a user chooses).
_SETTING_SPAN = re.compile(r"\bc\.([a-z_][a-z0-9_.]*)\s*\|\s*span\b")


def seconds(duration: str) -> float:
    return parse_duration(duration, "duration", bare_seconds=False)


@dataclass(frozen=True)
class Scrape:
    """The windows and intervals of one build; the template environment's `scrape`."""

    #: Seconds between two scrapes of FlopWatch's targets.
    interval: float = BASE_SECONDS

    @classmethod
    def of(cls, scrape_interval: str) -> Scrape:
        return cls(seconds(scrape_interval))

    def _at_least(self, literal: str, least: float) -> str:
        """`literal` as written when it is `least` or more (the default build stays byte for byte
        the same), else `least` as a Prometheus duration."""
        return literal if seconds(literal) >= least else format_duration(least)

    def span(self, literal: str) -> str:
        """A sliding window: max(literal, 4 x scrape)."""
        return self._at_least(literal, SPAN_SCRAPES * self.interval)

    def widens(self, literal: str) -> bool:
        """Whether `span` reads a longer window than `literal`."""
        return self.span(literal) != literal

    @property
    def tile(self) -> str:
        """Window, interval, offset and divisor of a tiled difference: max(15s, 2 x scrape)."""
        return self._at_least(format_duration(TILE_SECONDS), TILE_SCRAPES * self.interval)

    @property
    def settled_tile(self) -> str:
        """Where a settled tile starts: two tiles back (it ends one tile back, at `tile`)."""
        return format_duration(2 * seconds(self.tile))

    def settled(self, counter: str) -> str:
        """A settled tile of `counter`: its value a tile back minus its value two tiles back.

        A failed scrape leaves a stale marker, and a lookup in the scrape interval after it reads
        no sample: the node drops out of both tiles that share that point, and a job on several
        nodes reads short. So where the lookup is empty but the counter has a sample a scrape
        interval later (the scrape after the failed one), the value a scrape interval before the
        point stands in, in both tiles, which still add up to the counter's growth. A counter that
        ended (its job or its agent gone) has no later sample and stays out, as before."""
        return f"{self._at(counter, self.tile)} - {self._at(counter, self.settled_tile)}"

    def _at(self, counter: str, back: str) -> str:
        """`counter` `back` in the past, or the scrape before that where a failed scrape is there."""
        before, after = (format_duration(seconds(back) + sign * self.interval) for sign in (1, -1))
        return f"({counter} offset {back} or ({counter} offset {before} and {counter} offset {after}))"

    def tile_seconds(self) -> float:
        """The tile in seconds (the goodput group's interval, for readers of its records)."""
        return seconds(self.tile)

    def every(self, literal: str, evaluations: int = 1) -> str:
        """A group's interval, max(literal, scrape); times `evaluations` for a `for:` that holds
        that many intervals."""
        interval = self._at_least(literal, self.interval)
        return interval if evaluations == 1 else format_duration(evaluations * seconds(interval))


def narrow_settings(config: Any, scrape: Scrape, templates: Iterable[str]) -> list[str]:
    """One line per setting that a template reads as a sliding window (`c.<key> | span`) and that
    holds fewer than 4 scrapes: the build reads the wider window instead, and says so."""
    lines = []
    keys = sorted({match.group(1) for text in templates for match in _SETTING_SPAN.finditer(text)})
    for key in keys:
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part)
        if scrape.widens(value):
            written = ".".join(part.rstrip("_") for part in key.split("."))
            lines.append(f"{written}: {value} holds fewer than {SPAN_SCRAPES} samples at scrape_interval "
                         f"{format_duration(scrape.interval)}; the rules read {scrape.span(value)} instead "
                         f"(set {written} to {scrape.span(value)} or more to say so)")
    return lines
