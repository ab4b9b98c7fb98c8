"""The InfluxDB sink: line-protocol mapping, influxdb-client writes with gzip and retries, what is
dropped and counted, secrets, and the agent wiring.

No server here can be told to answer 429, 503, 400 or 401 on demand, so these tests put a small
HTTP stand-in for InfluxDB's `POST /api/v2/write` on 127.0.0.1 (the narrowest seam: the real
influxdb-client and urllib3 retry logic run against it). The real server round trip, read back
through a query API, and the 60 s outage are in tests/integration/test_influx_vm.py.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from flopwatch import cli
from flopwatch import config as cfg
from flopwatch.catalog import sink as catalog
from flopwatch.exporters.influx import (
    InfluxSink,
    LineProtocolEncoder,
    SinkError,
    read_token,
    series_prefix,
)
from flopwatch.exporters.influx_buffer import SegmentBuffer
from flopwatch.exporters.wiring import build_agent


# -- a stand-in for the write endpoint ---------------------------------------------------------------
class WriteStub:
    """Answers POST /api/v2/write with scripted statuses (204 when the script is empty) and keeps
    every accepted body, un-gzipped, with the request's query and headers."""

    def __init__(self, answers: list[int | tuple[int, dict[str, str]]] | None = None) -> None:
        self.answers = list(answers or [])
        self.accepted: list[bytes] = []
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                url = urllib.parse.urlsplit(self.path)
                stub.requests.append({"path": url.path, "query": dict(urllib.parse.parse_qsl(url.query)),
                                      "headers": dict(self.headers), "at": time.monotonic()})
                answer = stub.answers.pop(0) if stub.answers else 204
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                if status == 204:
                    stub.accepted.append(body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                payload = b"" if status == 204 else json.dumps(
                    {"code": "invalid", "message": f"stub says {status}"}).encode()
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def lines(self) -> list[bytes]:
        return [line for body in self.accepted for line in body.split(b"\n") if line]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    server = WriteStub()
    yield server
    server.close()


def options(url: str, tmp_path, **extra) -> cfg.InfluxOptions:
    return cfg.InfluxOptions(url=url, buffer_dir=str(tmp_path / "buffer"), flush_interval=0.1, **extra)


def exposition(values: dict[str, float]) -> bytes:
    return "".join(f'flopwatch_test_gauge{{node="n1",gpu="{gpu}"}} {value!r}\n'
                   for gpu, value in values.items()).encode()


# -- an independent reading of line protocol, to check the encoder against ---------------------------
_LP = re.compile(rb"^((?:[^ ,\\]|\\.)+)((?:,(?:[^=\\]|\\.)+=(?:[^ ,\\]|\\.)*)*) value=(\S+) (\d+)$")
_TAG = re.compile(rb",((?:[^=\\]|\\.)+)=((?:[^ ,\\]|\\.)*)")


def parse_point(line: bytes) -> tuple[str, dict[str, str], float, int]:
    match = _LP.match(line)
    assert match, f"not line protocol: {line!r}"
    unescape = lambda text: re.sub(rb"\\(.)", rb"\1", text).decode()  # noqa: E731
    tags = {unescape(k): unescape(v) for k, v in _TAG.findall(match.group(2))}
    keys = list(tags)
    assert keys == sorted(keys), "tags are sorted"
    return unescape(match.group(1)), tags, float(match.group(3)), int(match.group(4))


def exported_samples(text: bytes) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """What prometheus_client's own parser reads from an exposition (its _created lines excluded)."""
    out = set()
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.value == sample.value and abs(sample.value) != float("inf"):
                out.add((sample.name, tuple(sorted(sample.labels.items())), sample.value))
    return out


# -- encoding ----------------------------------------------------------------------------------------
def test_a_whole_agent_exposition_maps_one_point_per_sample(sim_config, tmp_path):
    """Every sample of a real (simulated-GPU) agent exposition becomes exactly one point:
    measurement = sample name, tags = labels, field value, the cycle's timestamp in ms."""
    agent = build_agent(sim_config)
    try:
        agent.collect_once()
        agent.collect_once()
        text = agent.exposition()
    finally:
        agent.close()
    data, points, skipped = LineProtocolEncoder().encode(text, 1_767_225_605_123)
    parsed = [parse_point(line) for line in data.splitlines()]
    assert points == len(parsed) > 1000 and skipped == 0
    assert {ts for *_, ts in parsed} == {1_767_225_605_123}
    assert {(name, tuple(sorted(tags.items())), value) for name, tags, value, _ in parsed} == \
        exported_samples(text)
    names = {name for name, *_ in parsed}
    assert "flopwatch_gpu_power_watts" in names and "flopwatch_collector_errors_total" in names


def test_histograms_give_bucket_sum_and_count_measurements():
    text = (b'# TYPE flopwatch_x_seconds histogram\n'
            b'flopwatch_x_seconds_bucket{node="n",le="0.5"} 1.0\n'
            b'flopwatch_x_seconds_bucket{node="n",le="+Inf"} 3.0\n'
            b'flopwatch_x_seconds_count{node="n"} 3.0\nflopwatch_x_seconds_sum{node="n"} 2.5\n')
    data, points, _ = LineProtocolEncoder().encode(text, 5)
    assert points == 4
    assert data.splitlines() == [
        b"flopwatch_x_seconds_bucket,le=0.5,node=n value=1.0 5",
        b"flopwatch_x_seconds_bucket,le=+Inf,node=n value=3.0 5",
        b"flopwatch_x_seconds_count,node=n value=3.0 5",
        b"flopwatch_x_seconds_sum,node=n value=2.5 5",
    ]


@pytest.mark.parametrize("label, expected", [
    ("a b", b"a\\ b"), ("a,b", b"a\\,b"), ("a=b", b"a\\=b"), ('say "hi"', b'say\\ "hi"'),
    ("back\\slash", b"back\\\\slash"), ("two\nlines", b"two\\nlines"), ("ünï", "ünï".encode()),
])
def test_label_values_are_escaped_for_line_protocol(label, expected):
    prom = label.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    prefix = series_prefix(f'flopwatch_m{{node="n",job_id="{prom}"}}'.encode())
    assert prefix == b"flopwatch_m,job_id=" + expected + b",node=n value="


def test_empty_labels_are_omitted_and_unlabelled_series_have_no_tags():
    assert series_prefix(b'flopwatch_m{node="n",user=""}') == b"flopwatch_m,node=n value="
    assert series_prefix(b"flopwatch_up") == b"flopwatch_up value="


def test_non_finite_values_are_skipped_and_counted():
    text = b'a{node="n"} NaN\nb{node="n"} +Inf\nc{node="n"} -Inf\nd{node="n"} 1e+20\n'
    data, points, skipped = LineProtocolEncoder().encode(text, 1)
    assert (data, points, skipped) == (b"d,node=n value=1e+20 1\n", 1, 3)


def test_the_prefix_cache_keeps_only_the_last_cycles_series():
    encoder = LineProtocolEncoder()
    encoder.encode(exposition({"0": 1.0, "1": 2.0}), 1)
    data, _, _ = encoder.encode(exposition({"1": 3.0, "2": 4.0}), 2)
    assert data == b"flopwatch_test_gauge,gpu=1,node=n1 value=3.0 2\nflopwatch_test_gauge,gpu=2,node=n1 value=4.0 2\n"
    assert set(encoder._prefixes) == {b'flopwatch_test_gauge{node="n1",gpu="1"}',
                                      b'flopwatch_test_gauge{node="n1",gpu="2"}'}


# -- writing -----------------------------------------------------------------------------------------
def test_cycles_arrive_once_in_order_gzipped_with_token_org_bucket_and_ms(stub, tmp_path):
    sink = InfluxSink(options(stub.url, tmp_path, org="acme", bucket="gpus", token="s3cret"), "n1")
    try:
        for cycle in range(3):
            sink.on_cycle(1000.0 + cycle, exposition({"0": float(cycle), "1": cycle + 0.5}))
        assert sink.flush(10)
    finally:
        sink.close()
    assert stub.lines() == [b"flopwatch_test_gauge,gpu=%d,node=n1 value=%r %d" % (gpu, float(cycle + gpu / 2), ts)
                            for cycle, ts in enumerate((1_000_000, 1_001_000, 1_002_000)) for gpu in (0, 1)]
    request = stub.requests[0]
    assert request["path"] == "/api/v2/write"
    assert request["query"] == {"org": "acme", "bucket": "gpus", "precision": "ms"}
    assert request["headers"]["Authorization"] == "Token s3cret"
    assert request["headers"]["Content-Encoding"] == "gzip"
    assert sink.written == 6 and sink.failures == 0


def test_batches_respect_batch_size_and_gzip_can_be_off(stub, tmp_path):
    sink = InfluxSink(options(stub.url, tmp_path, batch_size=3, gzip=False), "n1")
    try:
        sink.on_cycle(1.0, exposition({str(gpu): gpu for gpu in range(8)}))
        assert sink.flush(10)
    finally:
        sink.close()
    assert [body.count(b"\n") for body in stub.accepted] == [3, 3, 2]
    assert all("Content-Encoding" not in request["headers"] for request in stub.requests)


@pytest.mark.slow
def test_5xx_is_retried_with_backoff_then_kept_and_sent_exactly_once(stub, tmp_path):
    stub.answers = [503, 503, 503]     # one request's three attempts fail; the next request succeeds
    sink = InfluxSink(options(stub.url, tmp_path), "n1")
    try:
        sink.on_cycle(1.0, exposition({"0": 1.0, "1": 2.0}))
        assert sink.flush(20)
    finally:
        sink.close()
    attempts = [request["at"] for request in stub.requests]
    assert len(attempts) == 4
    assert attempts[1] - attempts[0] >= 0.4 and attempts[2] - attempts[1] >= 0.9  # exponential backoff
    assert attempts[3] - attempts[2] >= 0.9                                          # the sink's own backoff
    assert stub.lines() == [b"flopwatch_test_gauge,gpu=0,node=n1 value=1.0 1000",
                            b"flopwatch_test_gauge,gpu=1,node=n1 value=2.0 1000"]
    assert (sink.written, sink.failures, sink.dropped["rejected"]) == (2, 1, 0)


def test_429_retry_after_is_honoured(stub, tmp_path):
    stub.answers = [(429, {"Retry-After": "1"})]
    sink = InfluxSink(options(stub.url, tmp_path), "n1")
    try:
        sink.on_cycle(1.0, exposition({"0": 1.0}))
        assert sink.flush(10)
    finally:
        sink.close()
    first, second = (request["at"] for request in stub.requests)
    assert second - first >= 1.0
    assert sink.written == 1 and sink.failures == 0


def test_a_rejected_batch_is_dropped_counted_and_the_next_goes_through(stub, tmp_path, caplog):
    stub.answers = [400]
    sink = InfluxSink(options(stub.url, tmp_path), "n1")
    try:
        sink.on_cycle(1.0, exposition({"0": 1.0, "1": 1.0}))
        assert sink.flush(10)
        sink.on_cycle(2.0, exposition({"0": 2.0, "1": 2.0}))
        assert sink.flush(10)
    finally:
        sink.close()
    assert sink.dropped["rejected"] == 2 and sink.written == 2
    assert stub.lines() == [b"flopwatch_test_gauge,gpu=0,node=n1 value=2.0 2000",
                            b"flopwatch_test_gauge,gpu=1,node=n1 value=2.0 2000"]
    assert "rejected a batch (HTTP 400: " in caplog.text and "stub says 400" in caplog.text


def test_a_refused_token_keeps_the_points_and_says_what_to_check(stub, tmp_path, caplog):
    stub.answers = [401]
    sink = InfluxSink(options(stub.url, tmp_path, token="wrong-one"), "n1")
    try:
        sink.on_cycle(1.0, exposition({"0": 1.0}))
        assert sink.flush(10)
    finally:
        sink.close()
    assert sink.written == 1 and sink.failures == 1 and sink.dropped["rejected"] == 0
    assert "refused the token (HTTP 401): check FLOPWATCH_INFLUX_TOKEN or influx.token_file" in caplog.text
    assert "wrong-one" not in caplog.text


class _StalledBuffer(SegmentBuffer):
    """A buffer whose first append waits (a disk that hangs), to show the agent never waits."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.entered, self.release_disk = threading.Event(), threading.Event()
        self.stuck = False                       # an append is waiting on the disk right now

    def append(self, data: bytes, lines: int) -> None:
        self.stuck = True
        self.entered.set()
        self.release_disk.wait(10)
        self.stuck = False
        super().append(data, lines)


def test_a_stalled_sink_never_blocks_collection_and_counts_what_it_drops(stub, tmp_path):
    buffer = _StalledBuffer(tmp_path / "buffer", 2**20)
    sink = InfluxSink(options(stub.url, tmp_path), "n1", buffer=buffer, queue_cycles=2)
    try:
        sink.on_cycle(1.0, exposition({"0": 1.0, "1": 1.0}))
        assert buffer.entered.wait(5)            # the spool thread is stuck inside append
        for cycle in range(2, 6):
            sink.on_cycle(float(cycle), exposition({"0": 1.0, "1": 1.0}))
        assert buffer.stuck                      # every cycle was handed over while the disk still hung
        assert sink.dropped["queue_full"] == 4   # two cycles of two samples did not fit
        buffer.release_disk.set()
        assert sink.flush(10)
    finally:
        sink.close()
    assert sink.written == 6


def test_sink_health_metrics_use_the_catalogue(stub, tmp_path):
    sink = InfluxSink(options(stub.url, tmp_path), "n1")
    try:
        sink.on_cycle(1.0, b'flopwatch_a{node="n1"} 1.0\nflopwatch_b{node="n1"} NaN\n')
        assert sink.flush(10)
        registry = CollectorRegistry()
        registry.register(sink)
        value = registry.get_sample_value
        assert value(catalog.INFLUX_POINTS_WRITTEN.name, {"node": "n1"}) == 1
        assert value(catalog.INFLUX_POINTS_DROPPED.name, {"node": "n1", "reason": "non_finite"}) == 1
        assert value(catalog.INFLUX_POINTS_DROPPED.name, {"node": "n1", "reason": "buffer_full"}) == 0
        assert value(catalog.INFLUX_WRITE_FAILURES.name, {"node": "n1"}) == 0
        assert value(catalog.INFLUX_BUFFER_POINTS.name, {"node": "n1"}) == 0
        assert value(catalog.INFLUX_BUFFER_ON_DISK.name, {"node": "n1"}) == 1
    finally:
        sink.close()


# -- secrets and configuration ---------------------------------------------------------------------
def test_the_token_comes_from_the_environment_or_a_file_never_a_config_file_or_flag(tmp_path):
    config = cfg.load(environ={"FLOPWATCH_INFLUX_TOKEN": "s3cret", "FLOPWATCH_INFLUX_URL": "http://db:8086"})
    assert config.influx.token == "s3cret"
    assert "s3cret" not in repr(config)
    assert config.values["influx.token"] == "(set)"
    written = tmp_path / "agent.yml"
    written.write_text("influx:\n  token: s3cret\n")
    with pytest.raises(cfg.ConfigError, match="must not be written in a config file") as error:
        cfg.load(written, environ={})
    assert "s3cret" not in str(error.value)
    with pytest.raises(cfg.ConfigError, match="cannot be given on the command line"):
        cfg.load(overrides={"influx.token": "s3cret"}, environ={})
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert read_token(cfg.InfluxOptions(url="http://db", token_file=str(token_file))) == "from-file"
    with pytest.raises(SinkError, match="keep one"):
        read_token(cfg.InfluxOptions(url="http://db", token="a", token_file=str(token_file)))
    with pytest.raises(SinkError, match=r"influx.token_file .*missing: cannot read it \(No such file"):
        read_token(cfg.InfluxOptions(url="http://db", token_file=str(tmp_path / "missing")))


@pytest.mark.parametrize("key, value, message", [
    ("influx.url", "influxdb:8086", "expected an InfluxDB v2 write API base URL"),
    ("influx.buffer_max_bytes", "12 parsecs", "expected bytes of buffered points"),
    ("influx.buffer_max_bytes", "10KiB", "1MiB to 1TiB"),
    ("influx.batch_size", 0, "points per write request"),
])
def test_bad_influx_settings_are_one_line_errors(key, value, message):
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.load(overrides={key: value}, environ={})


def test_buffer_size_units():
    config = cfg.load(overrides={"influx.buffer_max_bytes": "1.5GiB"}, environ={})
    assert config.influx.buffer_max_bytes == int(1.5 * 2**30)
    assert cfg.load(overrides={"influx.buffer_max_bytes": "512MB"}, environ={}).influx.buffer_max_bytes == 512 * 10**6


def test_build_agent_hands_each_cycle_to_the_sink(stub, tmp_path):
    config = cfg.load(overrides={"backend": "sim", "node": "n1", "interval": 1, "listen": "127.0.0.1:0",
                                 "influx.url": stub.url, "influx.buffer_dir": str(tmp_path / "b"),
                                 "influx.flush_interval": 0.1}, environ={})
    agent = build_agent(config)
    try:
        sink = next(c for c in agent.collectors if c.name == "influx")
        assert sink.on_cycle in agent.cycle_listeners
        agent.collect_once()
        first = agent.exposition()
        time.sleep(0.01)
        agent.collect_once()
        assert sink.flush(10)
    finally:
        agent.close()
    points = [parse_point(line) for line in stub.lines()]
    stamps = sorted({ts for *_, ts in points})
    assert len(stamps) == 2
    first_cycle = {(name, tuple(sorted(tags.items())), value) for name, tags, value, ts in points if ts == stamps[0]}
    assert first_cycle == exported_samples(first)
    assert b"flopwatch_influx_points_written_total" in first


def test_cli_once_writes_the_cycle_and_bad_settings_exit_2(stub, tmp_path, capsys):
    code = cli.main(["agent", "--backend", "sim", "--node", "cli-node", "--once", "--influx-url", stub.url,
                     "--influx-buffer-dir", str(tmp_path / "b"), "--influx-bucket", "b1"])
    assert code == 0
    assert stub.requests and stub.requests[0]["query"]["bucket"] == "b1"
    assert any(b"node=cli-node" in line for line in stub.lines())
    capsys.readouterr()
    code = cli.main(["agent", "--backend", "sim", "--once", "--influx-url", "ftp://x"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "influx.url = 'ftp://x' (command line): expected" in err


def test_a_missing_client_library_is_a_usage_error(sim_config, monkeypatch):
    """influxdb-client is an optional extra: without it the agent says how to install it."""
    monkeypatch.setitem(sys.modules, "influxdb_client", None)
    code = cli.main(["agent", "--backend", "sim", "--once", "--influx-url", "http://127.0.0.1:1"])
    assert code == 2
