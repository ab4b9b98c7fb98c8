"""The InfluxDB sink: every sample the agent exports, also written to an InfluxDB v2 write API.

The agent hands the sink each cycle's rendered exposition and the cycle's time (`on_cycle`, a
non-blocking put into a bounded queue), so the sink sees exactly what /metrics serves and never
touches hardware. Two threads do the rest: `influx-spool` turns a cycle into line protocol and
appends it to the outage buffer (influx_buffer.py); `influx-send` writes the oldest buffered
points with influxdb-client's write API (gzip, retries with backoff on 429/5xx, honouring
Retry-After) and removes them only once the server accepted them.

Mapping (stable; docs/influxdb.md):

    flopwatch_gpu_power_watts{node="n1",gpu="0"} 312.5         (scraped at 2026-01-01T00:00:05Z)
    -> flopwatch_gpu_power_watts,gpu=0,node=n1 value=312.5 1767225605000

measurement = the exposition's sample name (counters keep `_total`; histograms give `_bucket` with
an `le` tag, `_sum` and `_count`), tags = the labels (sorted; empty ones omitted), one float field
`value`, timestamp = the collection cycle's start in milliseconds. NaN and infinite values cannot
be written in line protocol: they are skipped and counted.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import queue
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import Metric as Family

from flopwatch.catalog import sink as m
from flopwatch.config import InfluxOptions
from flopwatch.exporters.influx_buffer import SegmentBuffer

log = logging.getLogger(__name__)

DROP_REASONS = ("buffer_full", "queue_full", "rejected", "non_finite")
QUEUE_CYCLES = 64           # cycles waiting to be spooled before new ones are dropped
MAX_BACKOFF = 10.0          # seconds between write attempts while the server is away
REQUEST_TIMEOUT_MS = 5_000  # per HTTP request
CLOSE_TIMEOUT = 5.0         # seconds spent flushing at shutdown; the rest stays in the buffer
GZIP_LEVEL = 1

_NON_FINITE = {b"NaN", b"+Inf", b"-Inf", b"Inf"}
_LABEL = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_PROM_ESCAPE = re.compile(rb"\\(.)")
_PROM_UNESCAPED = {b"n": b"\n", b"\\": b"\\", b'"': b'"'}
_TAG_SPECIAL = re.compile(rb"([,= \\])")


class SinkError(Exception):
    """The sink cannot start (bad token file, missing client library); one line for the user."""


class WriteFailed(Exception):
    """A write request failed; `keep` says whether its points stay buffered for another try."""

    def __init__(self, message: str, *, keep: bool) -> None:
        super().__init__(message)
        self.keep = keep


class Writer(Protocol):
    def write(self, body: bytes) -> None: ...

    def close(self) -> None: ...


# -- exposition -> line protocol -------------------------------------------------------------------
def _unescape(value: bytes) -> bytes:
    return _PROM_ESCAPE.sub(lambda match: _PROM_UNESCAPED.get(match.group(1), match.group(0)), value)


def _tag_escape(value: bytes) -> bytes:
    # line protocol cannot carry a newline in a tag: keep it visible as the two characters \n
    return _TAG_SPECIAL.sub(rb"\\\1", value).replace(b"\n", b"\\n")


def series_prefix(series: bytes) -> bytes:
    """`name{a="x",b="y"}` -> `name,a=x,b=y value=` (tags sorted, empty values omitted)."""
    brace = series.find(b"{")
    name = series if brace < 0 else series[:brace]
    tags = []
    if brace >= 0:
        for match in _LABEL.finditer(series, brace):
            value = _unescape(match.group(2))
            if value:
                tags.append(match.group(1) + b"=" + _tag_escape(value))
    tags.sort()
    measurement = name.replace(b",", b"\\,").replace(b" ", b"\\ ")
    return b",".join([measurement, *tags]) + b" value="


class LineProtocolEncoder:
    """Converts a text exposition to line protocol, caching each series' converted prefix (the
    agent exports the same series every cycle); the cache holds only the last cycle's series."""

    def __init__(self) -> None:
        self._prefixes: dict[bytes, bytes] = {}

    def encode(self, exposition: bytes, timestamp_ms: int) -> tuple[bytes, int, int]:
        """(line protocol, points, non-finite samples skipped)."""
        old, new = self._prefixes, {}
        suffix = b" %d\n" % timestamp_ms
        out: list[bytes] = []
        skipped = 0
        for line in exposition.split(b"\n"):
            if not line or line[0] == 35:  # '#': HELP/TYPE
                continue
            brace = line.rfind(b"}")
            cut = line.find(b" ", brace + 1)
            if cut < 0:
                continue
            series = line[:cut]
            prefix = old.get(series) or new.get(series) or series_prefix(series)
            new[series] = prefix
            value = line[cut + 1:].split(b" ", 1)[0]
            if value in _NON_FINITE:
                skipped += 1
                continue
            out += (prefix, value, suffix)
        self._prefixes = new
        return b"".join(out), len(out) // 3, skipped


def sample_count(exposition: bytes) -> int:
    return sum(1 for line in exposition.split(b"\n") if line and not line.startswith(b"#"))


# -- the HTTP side ---------------------------------------------------------------------------------
class InfluxWriter:
    """influxdb-client's write service (the call its WriteApi makes), one request per batch, each
    with a fresh WritesRetry (the client's backoff on 429/5xx, honouring Retry-After).

    Not the client's batching mode: that retries in the background and reports failures through
    callbacks, which cannot keep a disk buffer in order or say exactly which points arrived. Nor
    its synchronous WriteApi.write: it takes no per-request retry policy, and a WritesRetry given
    to the client once measures its time budget from the client's creation."""

    def __init__(self, options: InfluxOptions, token: str | None) -> None:
        try:
            from influxdb_client import InfluxDBClient, WriteService
        except ImportError:
            raise SinkError("influx.url needs influxdb-client: pip install 'flopwatch[influx]'") from None
        self.options = options
        # gzip is done here, at level 1: the client's level 9 costs more CPU than a collection cycle
        # (bench/RESULTS.md) for a body about a third smaller
        self.client = InfluxDBClient(url=options.url, token=token, org=options.org,
                                     timeout=REQUEST_TIMEOUT_MS, enable_gzip=False)
        self.service = WriteService(self.client.api_client)
        # the sink reports an outage once; the client would warn on every retry of every batch
        logging.getLogger("influxdb_client.client.write.retry").setLevel(logging.ERROR)

    def write(self, body: bytes) -> None:
        from influxdb_client import WritePrecision
        from influxdb_client.client.write.retry import WritesRetry
        from influxdb_client.rest import ApiException

        # WritesRetry's time budget starts when it is built: one per request
        retries = WritesRetry(total=2, retry_interval=0.5, exponential_base=2, max_retry_delay=4,
                              max_retry_time=15, allowed_methods=["POST"])
        try:
            extra = {"content_encoding": "gzip"} if self.options.gzip else {}
            self.service.post_write(org=self.options.org, bucket=self.options.bucket,
                                    body=gzip.compress(body, GZIP_LEVEL) if self.options.gzip else body,
                                    precision=WritePrecision.MS, content_type="text/plain; charset=utf-8",
                                    urlopen_kw={"retries": retries}, **extra)
        except ApiException as error:
            raise _api_failure(error, self.options) from None
        except Exception as error:  # unreachable, timed out, 429/5xx after the retries
            reason = getattr(error, "reason", None) or error
            raise WriteFailed(f"cannot write to {self.options.url}: {reason}", keep=True) from None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        # drop the last references now: the client's __del__ fails if it first runs at interpreter exit
        self.service = self.client = None


def _api_failure(error: Any, options: InfluxOptions) -> WriteFailed:
    status = error.status or 0
    detail = (error.body or error.reason or "").strip() if isinstance(error.body or "", str) else error.reason
    detail = str(detail).replace("\n", " ")[:300]
    if status in (401, 403):
        return WriteFailed(f"{options.url} refused the token (HTTP {status}): check FLOPWATCH_INFLUX_TOKEN "
                           f"or influx.token_file; points stay buffered", keep=True)
    if status == 404:
        return WriteFailed(f"{options.url}: org {options.org!r} or bucket {options.bucket!r} not found "
                           f"(HTTP 404: {detail}); points stay buffered", keep=True)
    if status == 429 or status >= 500:
        return WriteFailed(f"{options.url} answered HTTP {status}: {detail}", keep=True)
    return WriteFailed(f"{options.url} rejected a batch (HTTP {status}: {detail})", keep=False)


def read_token(options: InfluxOptions) -> str | None:
    """The API token from FLOPWATCH_INFLUX_TOKEN or influx.token_file (never both)."""
    if options.token and options.token_file:
        raise SinkError("both FLOPWATCH_INFLUX_TOKEN and influx.token_file are set: keep one")
    if options.token_file:
        try:
            token = Path(options.token_file).read_text().strip()
        except OSError as error:
            raise SinkError(f"influx.token_file {options.token_file}: cannot read it ({error.strerror})") from None
        if not token:
            raise SinkError(f"influx.token_file {options.token_file} is empty")
        return token
    return options.token


# -- the sink ----------------------------------------------------------------------------------------
class InfluxSink:
    """A Collector (its `collect()` exports the sink's health) plus the agent's per-cycle listener."""

    name = "influx"

    def __init__(self, options: InfluxOptions, node: str, writer: Writer | None = None, *,
                 buffer: SegmentBuffer | None = None, queue_cycles: int = QUEUE_CYCLES,
                 max_backoff: float = MAX_BACKOFF) -> None:
        self.options, self.node = options, node
        self.writer = writer if writer is not None else InfluxWriter(options, read_token(options))
        self.buffer = buffer if buffer is not None else SegmentBuffer(options.buffer_dir, options.buffer_max_bytes)
        self.encoder = LineProtocolEncoder()
        self.max_backoff = max_backoff
        self.written = 0
        self.failures = 0
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.backoff = 0.0
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[float, bytes] | None] = queue.Queue(maxsize=queue_cycles)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._spool_thread = threading.Thread(target=self._spool, name="influx-spool", daemon=True)
        self._send_thread = threading.Thread(target=self._send, name="influx-send", daemon=True)
        self._spool_thread.start()
        self._send_thread.start()
        log.info("writing every sample to %s (org %s, bucket %s); outage buffer %s, at most %d MiB",
                 options.url, options.org, options.bucket, options.buffer_dir or "in memory",
                 options.buffer_max_bytes // 2**20)

    # -- the agent's side ----------------------------------------------------------------------
    def on_cycle(self, timestamp: float, exposition: bytes) -> None:
        """Called on the collection thread after each cycle: never blocks."""
        try:
            self._queue.put_nowait((timestamp, exposition))
        except queue.Full:
            with self._lock:
                self.dropped["queue_full"] += sample_count(exposition)

    def update(self) -> int:
        return 0  # the sink reads no source; its failures are in its own metrics

    def collect(self) -> Iterator[Family]:
        node = self.node
        with self._lock:
            written, failures, dropped = self.written, self.failures, dict(self.dropped)
        dropped["buffer_full"] += self.buffer.dropped
        family = m.INFLUX_POINTS_WRITTEN.family()
        family.add_metric([node], written)
        yield family
        family = m.INFLUX_POINTS_DROPPED.family()
        for reason in DROP_REASONS:
            family.add_metric([node, reason], dropped[reason])
        yield family
        family = m.INFLUX_WRITE_FAILURES.family()
        family.add_metric([node], failures)
        yield family
        for metric, value in ((m.INFLUX_BUFFER_BYTES, self.buffer.bytes), (m.INFLUX_BUFFER_POINTS, self.buffer.lines),
                              (m.INFLUX_BUFFER_ON_DISK, 1.0 if self.buffer.on_disk else 0.0)):
            family = metric.family()
            family.add_metric([node], value)
            yield family

    # -- threads -------------------------------------------------------------------------------
    def _spool(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            timestamp, exposition = item
            try:
                data, points, skipped = self.encoder.encode(exposition, round(timestamp * 1000))
                self.buffer.append(data, points)
            except Exception:  # keep spooling; the next cycle may do better
                log.exception("influx: cannot buffer a cycle")
                continue
            if skipped:
                with self._lock:
                    self.dropped["non_finite"] += skipped
            if self.buffer.lines >= self.options.batch_size:
                self._wake.set()

    def _send(self) -> None:
        while True:
            if self.backoff:
                if self._stop.wait(self.backoff):
                    return
            else:
                self._wake.wait(self.options.flush_interval)
                self._wake.clear()
                if self._stop.is_set():
                    return
            self._drain()

    def _drain(self, deadline: float | None = None) -> bool:
        """Write batches until the buffer is empty (True) or a write fails or time is up (False)."""
        while deadline is None or time.monotonic() < deadline:
            batch = self.buffer.peek(self.options.batch_size)
            if batch is None:
                return True
            try:
                self.writer.write(batch.data)
            except WriteFailed as error:
                if error.keep:
                    self.buffer.release()
                    self._failed(str(error))
                    return False
                self.buffer.commit(batch)
                with self._lock:
                    self.dropped["rejected"] += batch.lines
                log.error("influx: %s; dropped its %d points", error, batch.lines)
                continue
            except Exception as error:  # a bug in a writer must not kill the thread
                self.buffer.release()
                self._failed(f"unexpected write error: {error!r}")
                return False
            self.buffer.commit(batch)
            with self._lock:
                self.written += batch.lines
            if self.backoff:
                log.warning("influx: writing to %s again; replaying %d buffered points",
                            self.options.url, self.buffer.lines)
                self.backoff = 0.0
        return False

    def _failed(self, message: str) -> None:
        with self._lock:
            self.failures += 1
        if not self.backoff:
            log.error("influx: %s; buffering (%s), retrying every few seconds", message,
                      "on disk" if self.buffer.on_disk else "in memory")
        self.backoff = min(self.max_backoff, max(1.0, self.backoff * 2))

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is written; True on success (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.empty() and self.buffer.lines == 0:
                return True
            self._wake.set()
            time.sleep(0.05)
        return False

    def close(self) -> None:
        """Stop the threads; a short final flush; whatever is left stays in the buffer directory."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=CLOSE_TIMEOUT)
        self._spool_thread.join(CLOSE_TIMEOUT)
        self._stop.set()
        self._wake.set()
        self._send_thread.join(CLOSE_TIMEOUT + REQUEST_TIMEOUT_MS / 1000)
        if not self._send_thread.is_alive() and not self.backoff:
            self._drain(time.monotonic() + CLOSE_TIMEOUT)
        left = self.buffer.lines
        if left:
            where = f"kept in {self.options.buffer_dir} for the next start" if self.buffer.on_disk else "lost"
            log.warning("influx: %d points not written at shutdown: %s", left, where)
        self.buffer.close()
        try:
            self.writer.close()
        except Exception as error:
            log.debug("closing the influx client: %s", error)


def make_sink(options: InfluxOptions, node: str) -> InfluxSink:
    """The sink for `influx.*`, raising SinkError with a one-line reason when it cannot start."""
    return InfluxSink(options, node)
