"""The InfluxDB sink's own health: what reached the server, what was dropped and why, what waits.

Present only while the agent writes to an InfluxDB v2 write API (`influx.url` set). Points are
counted as line-protocol lines: one per exported sample.
"""

from flopwatch.catalog.metric import Metric

INFLUX_POINTS_WRITTEN = Metric(
    "flopwatch_influx_points_written_total", "counter", "",
    "Points the InfluxDB write API accepted (HTTP 204).",
)
INFLUX_POINTS_DROPPED = Metric(
    "flopwatch_influx_points_dropped_total", "counter", "",
    "Points that will never be written, by reason: buffer_full (the oldest buffered points, dropped "
    "when the buffer outgrew influx.buffer_max_bytes during an outage), queue_full (the sink fell "
    "behind the collection clock), rejected (the server answered 4xx to the batch, e.g. HTTP 400 for "
    "a malformed point), non_finite (NaN or infinite values, which line protocol cannot carry).",
    ("reason",),
)
INFLUX_WRITE_FAILURES = Metric(
    "flopwatch_influx_write_failures_total", "counter", "",
    "Write requests that failed after the client's own retries (unreachable server, HTTP 429/5xx, "
    "401/403/404); their points stay buffered and are sent again.",
)
INFLUX_BUFFER_BYTES = Metric(
    "flopwatch_influx_buffer_bytes", "gauge", "bytes",
    "Line protocol waiting to be written, on disk and in memory.",
)
INFLUX_BUFFER_POINTS = Metric(
    "flopwatch_influx_buffer_points", "gauge", "",
    "Points waiting to be written, on disk and in memory.",
)
INFLUX_BUFFER_ON_DISK = Metric(
    "flopwatch_influx_buffer_on_disk", "gauge", "",
    "1 while the buffer writes to influx.buffer_dir, 0 while it holds points in memory because the "
    "directory is unset, unwritable or full.",
)
