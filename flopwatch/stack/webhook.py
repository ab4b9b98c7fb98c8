"""A webhook receiver for Alertmanager notifications (the demo's and the tests' "pager").

Alertmanager POSTs JSON ({"alerts": [{"status", "labels", "annotations", ...}], ...}); every
alert is kept in order of arrival. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

MAX_BODY = 10 * 1024 * 1024


class WebhookReceiver:
    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        self.payloads: list[dict[str, Any]] = []   # whole notifications (receiver, groupKey, status, ...)
        self.posts = 0
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_BODY:
                    self.send_error(400, "expected a JSON body")
                    return
                try:
                    payload = json.loads(self.rfile.read(length))
                    alerts = payload["alerts"]
                except (ValueError, KeyError, TypeError):
                    self.send_error(400, "not an Alertmanager webhook payload")
                    return
                with receiver._arrived:
                    receiver.posts += 1
                    receiver.payloads.append(payload)
                    for alert in alerts:
                        alert["received_at"] = time.time()
                        receiver.alerts.append(alert)
                    receiver._arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:  # keep stderr for FlopWatch's own logs
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/alerts"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def firing(self) -> list[dict[str, Any]]:
        with self._lock:
            return [alert for alert in self.alerts if alert.get("status") == "firing"]

    def wait_for(self, predicate: Any, timeout: float) -> dict[str, Any] | None:
        """The first received alert for which predicate(alert) is true, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for alert in self.alerts:
                    if predicate(alert):
                        return alert
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._arrived.wait(remaining)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
