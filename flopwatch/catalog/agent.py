"""The agent's own health: how long each collector takes, how often it fails, what version runs."""

from flopwatch.catalog.metric import Metric

COLLECTOR_DURATION = Metric(
    "flopwatch_collector_duration_seconds", "gauge", "seconds",
    "Wall time of the collector's last update on the agent's clock.", ("collector",),
)
COLLECTOR_ERRORS = Metric(
    "flopwatch_collector_errors_total", "counter", "",
    "Errors met by a collector (a failed read, a timed-out call, a whole failed update).",
    ("collector",),
)
COLLECTOR_LAST_SUCCESS = Metric(
    "flopwatch_collector_last_success_timestamp_seconds", "gauge", "seconds",
    "Unix time of the collector's last update that finished without an error.", ("collector",),
)
BUILD_INFO = Metric(
    "flopwatch_build_info", "gauge", "",
    "Always 1; labels carry the FlopWatch version, the GPU backend in use and the Python version.",
    ("version", "backend", "python"),
)
HTTP_RESPONSES = Metric(
    "flopwatch_http_responses_total", "counter", "",
    "HTTP answers of the metrics endpoint by status code (400/405/413/431 count malformed requests, "
    "401 wrong or missing credentials, 429 password checks refused while too many were queued).",
    ("code",),
)
HTTP_TLS_FAILURES = Metric(
    "flopwatch_http_tls_handshake_failures_total", "counter", "",
    "TLS handshakes the metrics endpoint refused or lost (web config with TLS), by reason: no_client_cert, "
    "bad_client_cert, plain_http, client_alert, protocol, timeout, closed.",
    ("reason",),
)
