"""A small client for Prometheus's HTTP query API (also spoken by VictoriaMetrics).

Used by the demo, the report, the benchmarks and the tests; errors come back as PromError with a
message that says what to check, never a stack trace from urllib.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any


class PromError(RuntimeError):
    """The query server could not be reached or rejected the query; `status` is the HTTP status
    of a rejection (None when no answer came), for callers that wait out a busy server (503)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class PromClient:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        query = urllib.parse.urlencode(params)
        target = f"{self.url}{path}?{query}"
        try:
            with urllib.request.urlopen(target, timeout=self.timeout) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as error:
            try:
                detail = json.load(error).get("error", "")
            except (ValueError, AttributeError):
                detail = ""
            raise PromError(f"{self.url}: HTTP {error.code} for {params.get('query', path)!r}: "
                            f"{detail}", status=error.code) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise PromError(f"cannot reach Prometheus at {self.url} ({reason}); check the URL and "
                            "that the server is running") from None
        if body.get("status") != "success":
            raise PromError(f"{self.url}: {body.get('errorType', 'error')}: {body.get('error', '')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        return [Sample(item["metric"], float(item["value"][1])) for item in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Matrix result: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
        data = self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})
        return data["result"]

    def scalar(self, expr: str, default: float | None = None) -> float | None:
        samples = self.query(expr)
        return samples[0].value if samples else default

    def targets(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/targets", {"state": "active"})["activeTargets"]

    def alerts(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/alerts", {})["alerts"]
