"""`flopwatch remediate`'s own series: what it did to which node, what it refused, and whether it
is halted. `node` is the node acted on for per-node families, the remediator's host otherwise."""

from flopwatch.catalog.metric import Metric

ACTIONS = Metric(
    "flopwatch_remediation_actions_total", "counter", "",
    "Actions on a node by outcome: done, dry_run (planned, not run), or a failure (unknown_node, failed, "
    "timeout); action is drain, resume or health_check.",
    ("action", "outcome"),
)
NODE_DRAINED = Metric(
    "flopwatch_remediation_node_drained", "gauge", "",
    "1 for each node the scheduler shows drained by FlopWatch (its reason starts with flopwatch:), as last read.",
)
NODE_HELD = Metric(
    "flopwatch_remediation_node_held", "gauge", "",
    "1 for each node FlopWatch holds back from an action, by why: lemon, hold_down, switch, halted, other.",
    ("why",),
)
HALTED = Metric(
    "flopwatch_remediation_halted", "gauge", "",
    "1 while the circuit breaker holds every drain back (remediation halted is paged).",
)
WEBHOOK_REQUESTS = Metric(
    "flopwatch_remediation_webhook_requests_total", "counter", "",
    "Webhook and /metrics answers by status code: 401 wrong or missing credentials, 400 a malformed "
    "payload, 413 a body over max_body.",
    ("code",),
)
TLS_FAILURES = Metric(
    "flopwatch_remediation_tls_handshake_failures_total", "counter", "",
    "TLS handshakes the webhook refused or lost, by reason (as the agent's "
    "flopwatch_http_tls_handshake_failures_total).",
    ("reason",),
)
RECONCILE_ERRORS = Metric(
    "flopwatch_remediation_reconcile_errors_total", "counter", "",
    "Reconciliations that could not read Alertmanager or the scheduler.",
)
LAST_RECONCILE = Metric(
    "flopwatch_remediation_last_reconcile_timestamp_seconds", "gauge", "seconds",
    "Unix time of the last reconciliation against Alertmanager's API that succeeded.",
)
