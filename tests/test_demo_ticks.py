"""The demo's ticks between Prometheus's scrape rounds, and the report window they give: every
node's samples in it are the fleet's ticks, once each, or the demo says why not."""

from __future__ import annotations

import time

import pytest

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.sim.ticker import Gap, ScrapedFleet, report_span, widest_gap

SCENARIO = {"name": "ticks", "seed": 1, "duration": "1h", "scrape_interval": "5s",
            "fleet": {"nodes": 2, "gpus_per_node": 1, "gpu_model": "H100-SXM", "nics_per_node": 1},
            "jobs": [], "faults": []}


def test_the_gap_fits_a_tick_and_holds_a_whole_second_with_room():
    # gaps: 0.1-0.3 (too short), 0.3-2.9 (holds 1 and 2: 2 has 0.9 s either side), 2.9-4.0, 4.0-0.1
    assert widest_gap([0.1, 0.3, 2.9, 4.0], 5.0, 0.05) == Gap(1, pytest.approx(2.6))
    # two nodes scraped at once leave no gap between them: the other way round is the whole interval
    assert widest_gap([1.0, 1.0], 5.0, 0.05).length == pytest.approx(5.0)
    assert widest_gap([3.3], 5.0, 0.05) == Gap(0, pytest.approx(5.0))
    # the longest gap (0.95 -> 2.05) has its whole seconds 0.05 s from its ends: 2.05 -> 3.1 wins
    assert widest_gap([0.1, 0.95, 2.05], 3.0, 0.05) == Gap(2, pytest.approx(1.05))


def test_without_a_whole_second_interval_the_longest_gap():
    assert widest_gap([0.1, 0.4, 1.2], 1.5, 0.05) == Gap(1, pytest.approx(0.8))


def fleet_with_scrapes(rounds: dict[int, list[tuple[float, int]]]) -> ScrapedFleet:
    server = ScrapedFleet(Fleet(parse(SCENARIO), start_unix=0.0))
    for node, scrapes in rounds.items():
        server.scrapes[node] = scrapes
    return server


def test_the_window_holds_each_nodes_ticks_once():
    base = float(int(time.time())) - 1000.0          # node 0 at .2, node 1 at .7 of each 5 s; ticks at .9
    ticks = 12
    scrapes = {n: [(base + offset + 5 * k, max(0, k - 1)) for k in range(ticks + 3)] for n, offset in
               ((0, 0.2), (1, 0.7))}
    start, end, caveat = report_span(fleet_with_scrapes(scrapes), ticks, 5.0)
    assert caveat == ""
    # tick k is first scraped at base + 5 (k + 1) + 0.2: the window's ends are whole seconds in the
    # gap after node 1's scrape (at .7), before tick 1's first scrape and after tick 12's last, a
    # minute apart (the shortest report)
    assert base + 5.7 < start < base + 10.2 and end == base + 66 and end - start == 60
    for node in scrapes.values():
        assert sorted(g for t, g in node if start < t <= end) == list(range(1, ticks + 1))


def test_scrapes_out_of_turn_or_a_short_demo_are_said():
    base = float(int(time.time())) - 1000.0
    ticks = 12
    scrapes = {n: [(base + offset + 5 * k, max(0, k - 1)) for k in range(ticks + 3)] for n, offset in
               ((0, 0.2), (1, 0.7))}
    scrapes[1][5] = (scrapes[1][5][0], 3)           # node 1 saw tick 3 twice and never tick 4
    assert "did not line up" in report_span(fleet_with_scrapes(scrapes), ticks, 5.0)[2]
    short = {n: [(base + offset + 5 * k, max(0, k - 1)) for k in range(5)] for n, offset in ((0, 0.2), (1, 0.7))}
    start, end, caveat = report_span(fleet_with_scrapes(short), 3, 5.0)
    assert end - start == 60 and "under the minute a report covers" in caveat
