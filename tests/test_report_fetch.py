"""Running queries: results laid on the grid, and an unreachable Prometheus said in one line."""

from __future__ import annotations

import math

import pytest

from flopwatch.promql import PromClient, Sample
from flopwatch.report.fetch import Fetcher, Outcome, Results, Unreachable
from flopwatch.report.queries import Query
from flopwatch.report.window import Grid
from flopwatch.stack import free_port

GRID = Grid(end=1000.0, step=100.0, n=4)   # points at 700, 800, 900, 1000


def results(**outcomes: Outcome) -> Results:
    return Results(dict(outcomes))


def test_matrix_lays_points_on_the_grid_with_gaps():
    data = [{"metric": {"cluster": "", "job_id": "a"}, "values": [[700, "1"], [900, "3"]]},
            {"metric": {"job_id": "b"}, "values": [[1000, "5"], [1100, "9"]]}]
    got = results(x=Outcome(Query("x", "x", "e", "range"), data)).matrix("x", GRID, "cluster", "job_id")
    assert got[("", "a")][[0, 2]].tolist() == [1.0, 3.0]
    assert math.isnan(got[("", "a")][1]) and math.isnan(got[("", "a")][3])
    assert got[("", "b")][3] == 5.0  # the point past the grid is dropped


def test_matrix_with_its_own_start_keeps_the_baseline_point():
    query = Query("c", "c", "e", "range", start=600.0)
    data = [{"metric": {"xid": "48"}, "values": [[600, "2"], [1000, "3"]]}]
    got = results(c=Outcome(query, data)).matrix("c", GRID, "xid")[("48",)]
    assert len(got) == 5 and got[0] == 2.0 and got[4] == 3.0


def test_vector_scalar_and_failed_queries():
    ok = Outcome(Query("v", "v", "e"), [Sample({"job_id": "a"}, 2.0), Sample({"job_id": "b"}, 3.0)])
    failed = Outcome(Query("f", "f", "e"), error="query processing would load too many samples")
    res = results(v=ok, f=failed)
    assert res.vector("v", "job_id") == {("a",): 2.0, ("b",): 3.0}
    assert res.vector("f", "job_id") == {} and res.matrix("f", GRID) == {}
    assert res.error("f").startswith("query processing")
    assert res.scalar("missing") is None


def test_unreachable_prometheus_is_one_line():
    fetcher = Fetcher(PromClient(f"http://127.0.0.1:{free_port()}", timeout=2))
    with pytest.raises(Unreachable) as caught:
        fetcher.check()
    assert "cannot reach Prometheus" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_batch_that_fails_entirely_checks_the_server():
    progress = []
    fetcher = Fetcher(PromClient(f"http://127.0.0.1:{free_port()}", timeout=2), GRID,
                      progress=lambda done, total, title: progress.append((done, total)))
    with pytest.raises(Unreachable):
        fetcher.run([Query("a", "a", "vector(1)"), Query("b", "b", "vector(2)", "range")])
    assert progress[-1] == (2, 2)


def test_rule_results_without_a_cluster_label_take_their_jobs_cluster():
    """A global tier's records sum each job over every shard and carry no cluster label; the
    job's raw series do. A job id seen in two clusters stays apart (it cannot be told which)."""
    import numpy as np

    from flopwatch.report.fetch import job_clusters, with_job_clusters

    clusters = job_clusters([("eu-1", "span"), ("eu-1", "local"), ("us-1", "twice"), ("eu-1", "twice")])
    assert clusters == {"span": "eu-1", "local": "eu-1"}
    lost = {("", "span"): np.ones(2), ("us-1", "local"): np.zeros(2), ("", "twice"): np.ones(2)}
    moved = with_job_clusters(lost, clusters)
    assert set(moved) == {("eu-1", "span"), ("us-1", "local"), ("", "twice")}
    assert moved[("eu-1", "span")] is lost[("", "span")]
