"""Incidents from flagged buckets and counters: runs, exact counter events, causes, lemon nodes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flopwatch.report import incidents as inc
from flopwatch.report.fetch import Outcome, Results
from flopwatch.report.queries import Query
from flopwatch.report.window import Grid

NAN = math.nan
GRID = Grid(end=6000.0, step=600.0, n=10)   # buckets end at 600 ... 6000


def matrix(name: str, series: list[tuple[dict[str, str], list[float]]], start: float | None = None) -> Outcome:
    first = start if start is not None else GRID.first
    data = [{"metric": labels, "values": [[first + i * GRID.step, str(v)] for i, v in enumerate(values)
                                          if not math.isnan(v)]} for labels, values in series]
    return Outcome(Query(name, name, "e", "range", start=start), data)


def test_runs_bridge_one_quiet_bucket():
    flags = np.array([0, 1, 1, 0, 1, 0, 0, 1, 0, 0], dtype=bool)
    assert inc.runs(flags) == [(1, 4, 3), (7, 7, 1)]
    assert inc.runs(flags, max_gap=0) == [(1, 2, 2), (4, 4, 1), (7, 7, 1)]
    assert inc.runs(np.zeros(4, dtype=bool)) == []


def test_counter_events_count_new_series_resets_and_gaps():
    times = np.arange(6.0)
    assert inc.counter_events(np.array([2, 2, 3, 3, NAN, 5]), times) == [(2.0, 1.0), (5.0, 2.0)]
    assert inc.counter_events(np.array([NAN, NAN, 1, 1, 1, 1]), times) == [(2.0, 1.0)]  # a new series counts
    assert inc.counter_events(np.array([4, 4, 1, 2, 2, 2]), times) == [(2.0, 1.0), (3.0, 1.0)]  # a reset


@pytest.mark.parametrize(("signals", "cause"), [
    ({"thermal": 1, "power": 1}, "thermal"),
    ({"power": 1, "pcie": 12}, "power"),
    ({"hw_slowdown": 1}, "hw_slowdown"),
    ({"pcie": 12.0, "nvlink": 5.0}, "pcie"),
    ({"nvlink": 5.0, "nic": 900}, "nvlink"),
    ({"nic": 720.0}, "nic"),
    ({"nic": 3.0, "host_cpu": 0.97}, "host_cpu"),
    ({"arrival_rank": 1.2, "arrival_median": 1.0, "data_rank": 0.15, "data_median": 0.02}, "dataloader"),
    ({"arrival_rank": 1.2, "arrival_median": 1.0, "data_rank": 0.03, "data_median": 0.02}, "unknown"),
    ({"arrival_rank": 1.2, "arrival_median": 1.0, "other_rank": 0.16, "other_median": 0.0}, "host_stall"),
    ({"arrival_rank": 1.2, "arrival_median": 1.0, "other_rank": 0.16, "other_median": 0.0, "host_cpu": 0.95},
     "host_cpu"),
    ({"thermal": 0.0, "nvlink": 0.2}, "unknown"),
])
def test_classify_takes_the_strongest_evidence(signals, cause):
    assert inc.classify(signals) == cause


def test_detail_gives_the_score_and_the_whole_job_waiting():
    incident = inc.Incident("straggler", "", "node0001", 0.0, 7200.0, ["3"], job_id="j", ranks=["11"])
    inc.apply_detail(incident, {"arrival_rank": 1.1, "arrival_median": 1.0, "thermal": 1.0}, job_gpus=64,
                     arrival_share=0.8, with_cause=True)
    assert incident.score == pytest.approx(1.1)
    assert incident.cause == "thermal"
    slow = 0.1 * 0.8
    assert incident.gpu_hours_lost == pytest.approx(64 * 2 * slow / (1 + slow))


def arrivals(job: str, ranks: int, slow: dict[int, dict[int, float]]) -> list[tuple[dict[str, str], list[float]]]:
    """Arrival seconds per step per bucket: 10.0 (+/- 0.5%) for every rank, `slow[rank][bucket]` where given."""
    rows = []
    for rank in range(ranks):
        values = [10.0 * (1 + 0.005 * ((rank * 7 + b * 3) % 5 - 2)) for b in range(GRID.n)]
        for bucket, factor in slow.get(rank, {}).items():
            values[bucket] = 10.0 * factor
        rows.append(({"job_id": job, "rank": str(rank), "node": f"n{rank // 8}", "gpu": str(rank % 8)}, values))
    return rows


def test_scores_are_over_the_job_median_with_a_robust_spread():
    data = {(c["job_id"], c["rank"]): np.array(v) for c, v in arrivals("big", 16, {5: {2: 1.1}})}
    keyed = {("", job, rank, "n", "g"): values for (job, rank), values in data.items()}
    score, spread = inc.scores(keyed)[("", "big", "5", "n", "g")]
    assert score[2] == pytest.approx(1.1 / np.median([data[("big", str(r))][2] / 10 for r in range(16)]), rel=1e-6)
    assert 0 < spread[2] < 0.01
    few = inc.scores({("", "tiny", str(r), "n", "g"): np.ones(3) for r in range(4)})
    assert all(np.isnan(s).all() for s, _ in few.values())   # a median of 4 ranks says little


def test_stragglers_need_enough_ranks_and_buckets():
    series = arrivals("big", 64, {5: {1: 1.1, 2: 1.12, 4: 1.1}, 9: {8: 1.05}}) + arrivals("tiny", 4, {0: {0: 1.5}})
    res = Results({"straggler_arrivals": matrix("straggler_arrivals", series)})
    found = inc.stragglers_from_arrivals(res, GRID, "cluster", excess=0.03, min_buckets=2)
    assert len(found) == 1
    assert (found[0].node, found[0].gpus, found[0].ranks, found[0].job_id) == ("n0", ["5"], ["5"], "big")
    assert (found[0].start, found[0].end, found[0].buckets) == (GRID.times[1] - 600, GRID.times[4], 3)
    assert found[0].score == pytest.approx(1.107, abs=0.01)


def test_a_noisy_job_needs_more_than_the_threshold():
    noisy = [({**labels, "job_id": "noisy"}, [v * (1 + 0.04 * ((i * 5) % 3 - 1)) for v in values])
             for i, (labels, values) in enumerate(arrivals("noisy", 32, {}))]
    noisy[3][1][2] = noisy[3][1][3] = 10.6     # 6% slower: within 5 robust sigmas of a +/- 4% job
    res = Results({"straggler_arrivals": matrix("straggler_arrivals", noisy)})
    assert inc.stragglers_from_arrivals(res, GRID, "cluster", excess=0.03, min_buckets=2) == []


def test_stragglers_from_alerts_keep_the_alerts_cause_and_merge_a_node():
    rank = {"job_id": "j", "node": "n1"}
    series = [({**rank, "rank": "8", "gpu": "0", "cause": "dataloader"}, [NAN, 1, 1, 1] + [NAN] * 6),
              ({**rank, "rank": "9", "gpu": "1", "cause": "dataloader"}, [NAN, NAN, 1, 1] + [NAN] * 6),
              ({**rank, "rank": "9", "gpu": "1", "cause": "unknown"}, [NAN, 1] + [NAN] * 8)]
    res = Results({"straggler_alerts": matrix("straggler_alerts", series)})
    found = inc.stragglers_from_alerts(res, GRID, "cluster")
    assert len(found) == 1
    assert found[0].cause == "dataloader" and found[0].gpus == ["0", "1"] and found[0].ranks == ["8", "9"]


def test_hardware_incidents_from_counters_and_flags():
    base = GRID.first - GRID.step
    port = {"node": "n4", "device": "mlx5_0", "port": "1"}
    res = Results({
        "xid": matrix("xid", [({"node": "n1", "gpu": "2", "xid": "48"}, [NAN] * 4 + [1.0] * 7),
                              ({"node": "n2", "gpu": "0", "xid": "13"}, [3.0] * 11)], start=base),
        "ecc": matrix("ecc", [({"node": "n1", "gpu": "2"}, [NAN] * 4 + [1.0] * 7)], start=base),
        "lost": matrix("lost", [({"node": "n3", "gpu": "4"}, [NAN, 0, 0, NAN, NAN, NAN, NAN, NAN, NAN, NAN])]),
        "ib_bad": matrix("ib_bad", [(port, [NAN] * 5 + [150, 120] + [NAN] * 3)]),
        "ib_down": matrix("ib_down", [(port, [NAN] * 6 + [2] + [NAN] * 3)]),
    })
    found = inc.hardware(res, GRID, "cluster")
    kinds = [(i.kind, i.node) for i in found]
    assert kinds == [("gpu_lost", "n3"), ("ecc", "n1"), ("xid", "n1"), ("infiniband", "n4")]
    xid = next(i for i in found if i.kind == "xid")
    assert (xid.code, xid.count, xid.end) == ("48", 1.0, GRID.times[3])   # the old XID 13 is not counted
    ib = next(i for i in found if i.kind == "infiniband")
    assert ib.device == "mlx5_0:1" and ib.count == 2 and "link down 2x" in ib.detail and "900 errors/h" in ib.detail


def test_lemon_nodes_repeat_on_separate_occasions():
    def at(kind: str, node: str, start: float) -> inc.Incident:
        return inc.Incident(kind, "", node, start, start + 600, ["1"])

    items = [at("xid", "n1", 0), at("gpu_lost", "n1", 300),         # one occasion: an XID 79 losing the GPU
             at("straggler", "n2", 0), at("xid", "n2", 20_000), at("ecc", "n2", 20_100)]
    lemons = inc.lemons(items, threshold=2)
    assert [(lemon.node, lemon.occasions) for lemon in lemons] == [("n2", 2)]
    assert lemons[0].kinds == {"straggler": 1, "xid": 1, "ecc": 1}
