"""The cluster-path stand-in (flopwatch/stack/vm_paths.py): which paths it maps where and which it
refuses, read from the rules alone; then through a real single-node VictoriaMetrics (both releases:
Debian's 1.79 and 1.151), a remote write to the insert URL read back from the select URL, a foreign
tenant refused without reaching the store, the store's dedup of an HA pair's identical series, and
the proxy down and back on its port.

Each test flushes the store before it reads (VictoriaMetrics.flush): a search for a series not yet
flushed can keep missing it for about 10 s."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from flopwatch.detect import remote_write
from flopwatch.promql import PromClient
from flopwatch.stack import VictoriaMetrics
from flopwatch.stack.vm_paths import ClusterPaths, Refused, upstream_path


@pytest.mark.parametrize(("path", "mapped"), [
    ("/insert/0/prometheus/api/v1/write", ("insert", "/api/v1/write")),
    ("/insert/0:0/prometheus", ("insert", "/api/v1/write")),                   # the short remote-write form
    ("//insert//0//prometheus//api/v1/write", ("insert", "/api/v1/write")),    # slashes collapse, as path.go's
    ("/insert/0/prometheus/api/v1/import/prometheus", ("insert", "/api/v1/import/prometheus")),
    ("/select/0/prometheus/api/v1/query", ("select", "/api/v1/query")),
    ("/select/0:0/prometheus/api/v1/label/job_id/values", ("select", "/api/v1/label/job_id/values")),
    ("/select/0/prometheus/federate", ("select", "/federate")),
])
def test_cluster_paths_of_tenant_0_map_to_the_single_nodes(path: str, mapped: tuple[str, str]) -> None:
    assert upstream_path(path) == mapped


@pytest.mark.parametrize(("path", "reason"), [
    ("/insert/1/prometheus/api/v1/write", "tenant '1'"),
    ("/select/7:3/prometheus/api/v1/query", "tenant '7:3'"),
    ("/select/prometheus/api/v1/query", "tenant 'prometheus'"),      # a tenant left to headers: not here
    ("/insert/0/prometheus/api/v1/query", "vminsert takes no"),
    ("/select/0/prometheus/api/v1/write", "vmselect takes no"),
    ("/select/0/graphite/render", "vmselect takes no"),
    ("/api/v1/query", "not a cluster path"),
    ("/insert/0", "expected /insert/<accountID>/<suffix>"),
])
def test_what_a_cluster_would_not_route_to_tenant_0_is_refused_saying_why(path: str, reason: str) -> None:
    with pytest.raises(Refused) as refused:
        upstream_path(path)
    assert reason in str(refused.value) and "\n" not in str(refused.value)


def write(url: str, name: str, labels: dict[str, str], samples: list[tuple[float, float]]) -> None:
    """One remote-write request (Prometheus's protocol, snappy framed) of one series."""
    stamps = np.array([round(t * 1000) for t, _ in samples], dtype=np.int64)
    values = np.array([[v for _, v in samples]])
    body = remote_write.encode_request([remote_write.encode_labels(remote_write.sorted_labels(name, labels))],
                                       values, np.ones_like(values, dtype=bool), stamps)
    remote_write.post(url, body, timeout=10)


def http_error(url: str) -> urllib.error.HTTPError:
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(url, timeout=10)
    return failed.value


@pytest.fixture
def store(server_release: str) -> VictoriaMetrics:
    with VictoriaMetrics(dedup_interval="5s") as vm:
        yield vm


@pytest.mark.integration
def test_a_remote_write_to_the_insert_url_reads_back_from_the_select_url(store: VictoriaMetrics) -> None:
    with ClusterPaths(store.url) as paths:
        now = float(int(time.time()))
        write(paths.insert_url, "fw_paths_test", {"cluster": "shard-1"}, [(now - 20, 3.0), (now - 10, 4.0)])
        store.flush()
        got = PromClient(paths.select_url, timeout=10).query("fw_paths_test", at=now)
        direct = PromClient(store.url, timeout=10).query("fw_paths_test", at=now)
    assert [(s.labels, s.value) for s in got] == [({"__name__": "fw_paths_test", "cluster": "shard-1"}, 4.0)]
    assert [(s.labels, s.value) for s in direct] == [(s.labels, s.value) for s in got]
    assert paths.forwarded["insert"] == 1 and paths.forwarded["select"] >= 1 and not paths.refused


@pytest.mark.integration
def test_another_tenant_is_refused_in_one_line_and_never_stored(store: VictoriaMetrics) -> None:
    with ClusterPaths(store.url) as paths:
        now = float(int(time.time()))
        with pytest.raises(remote_write.RemoteWriteError) as refused:
            write(paths.insert_url.replace("/insert/0/", "/insert/1/"), "fw_paths_foreign", {}, [(now - 10, 1.0)])
        query = http_error(f"{paths.url}/select/2/prometheus/api/v1/query?query=up")
        refused_counts = dict(paths.refused), sum(paths.forwarded.values())
        write(paths.insert_url, "fw_paths_after", {}, [(now - 10, 1.0)])   # written after the refused one
        store.flush()
        store_client = PromClient(store.url, timeout=10)
        stored = store_client.query("fw_paths_foreign", at=now), store_client.query("fw_paths_after", at=now)
    assert "HTTP 404" in str(refused.value) and "accountID 0 only" in str(refused.value)
    assert query.code == 404 and query.read().decode().count("\n") == 1
    assert stored[0] == [] and [sample.value for sample in stored[1]] == [1.0]
    assert refused_counts == ({"insert": 1, "select": 1}, 0)


@pytest.mark.integration
def test_the_store_keeps_one_sample_per_dedup_interval_of_an_ha_pairs_identical_series(store: VictoriaMetrics) -> None:
    """Both replicas of a shard write the same series (the replica label dropped) from scrapes a
    second apart (in one 5 s step of the store's grid, (5k, 5k + 5]): with -dedup.minScrapeInterval=5s a minute
    holds 12 samples, not 24."""
    start = float(5 * ((int(time.time()) - 70) // 5))
    replica_a = [(start + 1 + 5 * i, float(i)) for i in range(12)]
    replica_b = [(t + 1, v) for t, v in replica_a]
    with ClusterPaths(store.url) as paths:
        for samples in (replica_a, replica_b):
            write(paths.insert_url, "fw_paths_pair", {"cluster": "shard-1"}, samples)
        store.flush()
        counted = PromClient(paths.select_url, timeout=10).query("count_over_time(fw_paths_pair[1m])", at=start + 59.5)
    assert [s.value for s in counted] == [12.0]


@pytest.mark.integration
def test_down_and_back_on_the_same_port_and_a_store_that_does_not_answer(store: VictoriaMetrics) -> None:
    paths = ClusterPaths(store.url).start()
    port = paths.port
    try:
        with urllib.request.urlopen(paths.url + "/health", timeout=10) as answer:
            assert answer.status == 200
        paths.stop()
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        paths.start()
        assert paths.port == port
        with urllib.request.urlopen(paths.select_url + "/api/v1/query?query=1", timeout=10) as answer:
            assert answer.status == 200
        store.kill()
        failed = http_error(paths.select_url + "/api/v1/query?query=1")
    finally:
        paths.stop()
    assert failed.code == 502 and store.url in failed.read().decode()
    assert paths.failed["select"] == 1
