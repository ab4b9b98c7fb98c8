"""The remediator's /-/ready: 503 until its first pass has settled the journal and read
Alertmanager, so that what starts it (flopwatch.stack.RemediateProcess, a Kubernetes probe) never
sends an alert that the first read, not the webhook, would act on. Served by the real HTTP server
on loopback; no scheduler is called (the pass itself is not run: `started` is what it sets)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from flopwatch.remediate.journal import Journal
from flopwatch.remediate.service import Remediator, state_path
from flopwatch.remediate.settings import load
from flopwatch.remediate.web import serve


class NoScheduler:
    name = "none"

    def __getattr__(self, attribute: str) -> object:
        raise AssertionError(f"readiness called the scheduler's {attribute}")


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_ready_only_after_the_first_pass(tmp_path: Path) -> None:
    settings = load(None, {}, {"state_dir": str(tmp_path)})
    remediator = Remediator(settings, NoScheduler(), Journal(state_path(settings)))  # type: ignore[arg-type]
    server = serve(remediator, "127.0.0.1", 0, None)
    try:
        url = f"http://127.0.0.1:{server.port}/-/ready"
        before = status(url)
        remediator.started.set()
        after = status(url)
    finally:
        server.stop()
    assert (before, after) == (503, 200)
