"""Alerts as remediation reads them, from Alertmanager's webhook notifications and from its API
(`GET /api/v2/alerts`), and the pages remediation sends back (`POST /api/v2/alerts`).

A webhook body is `{"version": "4", "status", "alerts": [{"status", "labels", "annotations",
"startsAt", "endsAt", "fingerprint", ...}], ...}`; the API returns a list of alerts with
`status: {"state": "active"|"suppressed"|"unprocessed"}` instead of a status string. Both become
`Alert`s; anything else is a `PayloadError` (the webhook answers 400 and acts on nothing).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

#: Labels the remediator's own pages carry, so it never acts on them when it reads them back.
SOURCE_LABEL = ("source", "flopwatch-remediate")
MAX_ALERTS = 10_000
API_TIMEOUT_S = 10.0


class PayloadError(ValueError):
    """Not an Alertmanager notification (or alert list); the message says what was wrong."""


class AlertmanagerError(RuntimeError):
    """Alertmanager could not be read or written; the message names the URL."""


@dataclass(frozen=True)
class Alert:
    name: str
    labels: Mapping[str, str]
    firing: bool
    starts_at: float
    fingerprint: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def node(self) -> str:
        return self.labels.get("node", "")

    @property
    def key(self) -> str:
        """The alert's identity (Alertmanager's fingerprint when given, else its labels)."""
        return self.fingerprint or json.dumps(sorted(self.labels.items()))


def _time(text: Any) -> float:
    if not isinstance(text, str) or not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise PayloadError(f"not a time: {text[:40]!r}") from None


def _labels(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PayloadError(f"{what}: expected a mapping of strings")
    return dict(value)


def _alert(item: Any, firing: bool | None) -> Alert:
    if not isinstance(item, Mapping):
        raise PayloadError("an alert is not an object")
    labels = _labels(item.get("labels"), "labels")
    if not labels.get("alertname"):
        raise PayloadError("an alert has no alertname label")
    if firing is None:  # the webhook's own status string
        status = item.get("status")
        if status not in ("firing", "resolved"):
            raise PayloadError(f"alert status {str(status)[:20]!r}: expected firing or resolved")
        firing = status == "firing"
    return Alert(labels["alertname"], labels, firing, _time(item.get("startsAt")), str(item.get("fingerprint") or ""),
                 _labels(item.get("annotations") or {}, "annotations"))


def from_webhook(body: bytes) -> list[Alert]:
    """The alerts of one webhook notification; PayloadError when it is not one."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise PayloadError("the body is not JSON") from None
    if not isinstance(payload, Mapping) or not isinstance(payload.get("alerts"), list):
        raise PayloadError("expected an Alertmanager notification: an object with an alerts list")
    if len(payload["alerts"]) > MAX_ALERTS:
        raise PayloadError(f"more than {MAX_ALERTS} alerts in one notification")
    return [_alert(item, None) for item in payload["alerts"]]


def from_api(items: Any) -> list[Alert]:
    """The firing alerts of `GET /api/v2/alerts` (silenced and inhibited ones included: a silence
    stops the page, not the fault)."""
    if not isinstance(items, list):
        raise PayloadError("expected a list of alerts")
    return [_alert(item, True) for item in items]


def fetch(url: str, timeout: float = API_TIMEOUT_S) -> list[Alert]:
    """Every active alert Alertmanager holds (`url` is its base URL)."""
    try:
        with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true&silenced=true&inhibited=true",
                                    timeout=timeout) as answer:
            return from_api(json.load(answer))
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise AlertmanagerError(f"{url}/api/v2/alerts: {error}") from None


@dataclass(frozen=True)
class Page:
    """An alert remediation raises itself: the switch it suspects, the breaker that tripped, an
    action that keeps failing. `key` tells pages of one name apart (a switch, a node)."""

    name: str
    key: str
    summary: str
    description: str
    nodes: tuple[str, ...] = ()
    runbook: str = ""

    def labels(self) -> dict[str, str]:
        return {"alertname": self.name, "severity": "page", "key": self.key, SOURCE_LABEL[0]: SOURCE_LABEL[1]}


def post(url: str, pages: Sequence[Page], lifetime_s: float, timeout: float = API_TIMEOUT_S) -> None:
    """Send (or refresh) `pages` as alerts that end after `lifetime_s` unless sent again, the way
    Prometheus keeps its alerts firing."""
    if not pages:
        return
    ends = (datetime.now(UTC) + timedelta(seconds=lifetime_s)).isoformat()
    body = json.dumps([{"labels": page.labels(), "endsAt": ends, "annotations": {
        "summary": page.summary, "description": page.description, "nodes": ",".join(page.nodes),
        **({"runbook_url": page.runbook} if page.runbook else {})}} for page in pages]).encode()
    request = urllib.request.Request(f"{url}/api/v2/alerts", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            pass
    except (urllib.error.URLError, OSError) as error:
        raise AlertmanagerError(f"{url}/api/v2/alerts: {error}") from None


def not_ours(alerts: Iterable[Alert]) -> list[Alert]:
    """The alerts that are not remediation's own pages."""
    return [alert for alert in alerts if alert.labels.get(SOURCE_LABEL[0]) != SOURCE_LABEL[1]]
