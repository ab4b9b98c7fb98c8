"""The remediator's HTTP side: Alertmanager's webhook (`POST /alerts`), `/metrics` and `/-/ready`,
on the agent's HTTP server (flopwatch/exporters/http.py) behind the agent's web config (TLS,
basic auth: flopwatch/exporters/webconfig.py). Refused credentials (401), TLS handshakes, bodies
over `max_body` (413) and malformed payloads (400) are answered before anything is acted on and
counted in flopwatch_remediation_webhook_requests_total / _tls_handshake_failures_total.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric as Family

from flopwatch.catalog import remediate as catalog
from flopwatch.exporters.http import HttpServer, Response
from flopwatch.exporters.webconfig import WebAccess
from flopwatch.remediate.alerts import PayloadError, from_webhook
from flopwatch.remediate.service import Remediator

log = logging.getLogger("flopwatch.remediate")
WEBHOOK_PATH = "/alerts"
HELD_KINDS = (("lemon", "lemon"), ("hold-down", "hold_down"), ("switch", "switch"), ("halted", "halted"))


class RemediatorCollector:
    """The remediator's series, fresh on every scrape (custom-collector pattern)."""

    def __init__(self, remediator: Remediator, server: HttpServer, host: str) -> None:
        self.remediator, self.server, self.host = remediator, server, host

    def collect(self) -> Iterator[Family]:
        r = self.remediator
        actions = catalog.ACTIONS.family()
        for (node, action, outcome), count in sorted(r.actions.items()):
            actions.add_metric([node, action, outcome], count)
        drained = catalog.NODE_DRAINED.family()
        for node, state in sorted(r.nodes.items()):
            if state.ours:
                drained.add_metric([node], 1)
        held = catalog.NODE_HELD.family()
        for node, why in sorted(r.plan.holds.items()):
            kind = next((label for word, label in HELD_KINDS if word in why), "other")
            held.add_metric([node, kind], 1)
        halted = catalog.HALTED.family()
        halted.add_metric([self.host], 1 if r.plan.halted else 0)
        requests = catalog.WEBHOOK_REQUESTS.family()
        for code, count in sorted(self.server.responses.items()):
            requests.add_metric([self.host, str(code)], count)
        tls = catalog.TLS_FAILURES.family()
        for reason, count in sorted(self.server.tls_failures.items()):
            tls.add_metric([self.host, reason], count)
        errors = catalog.RECONCILE_ERRORS.family()
        errors.add_metric([self.host], r.reconcile_errors)
        last = catalog.LAST_RECONCILE.family()
        if r.last_reconcile:
            last.add_metric([self.host], r.last_reconcile)
        yield from (actions, drained, held, halted, requests, tls, errors, last)


def serve(remediator: Remediator, host: str, port: int, access: WebAccess | None) -> HttpServer:
    """Start the webhook and /metrics server; returns it started (port 0 becomes a real port)."""
    registry = CollectorRegistry(auto_describe=False)

    def route(path: str) -> Response:
        if path == "/metrics":
            return Response(200, generate_latest(registry))
        if path == "/-/ready":  # only once the first pass has read the scheduler and Alertmanager
            if not remediator.started.is_set():
                return Response(503, b"starting: settling the journal and reading Alertmanager\n", "text/plain")
            return Response(200, b"ready\n", "text/plain")
        return Response(404, b"not found\n", "text/plain")

    def post(path: str, body: bytes) -> Response:
        if path != WEBHOOK_PATH:
            return Response(404, f"POST Alertmanager's webhook to {WEBHOOK_PATH}\n".encode(), "text/plain")
        try:
            alerts = from_webhook(body)
        except PayloadError as error:
            log.warning("webhook: refused a payload: %s", error)
            return Response(400, f"not an Alertmanager notification: {error}\n".encode(), "text/plain")
        remediator.receive(alerts)
        return Response(200, b"ok\n", "text/plain")

    server = HttpServer(host, port, route, access, post=post, max_body=remediator.settings["max_body"])
    registry.register(RemediatorCollector(remediator, server, socket.gethostname()))
    server.start()
    return server
