"""The service loop around the decision: alerts in (webhook, and Alertmanager's API on start and
every `reconcile_interval`), the scheduler read, the plan decided (decide.py), then carried out
through the scheduler adapter, journaled and audited, or only written down in dry-run.

Audit: every action is a log line (`remediate: drain node02: scontrol update ...`), a journal line
(journal.py), a counter (flopwatch_remediation_actions_total) and, in the scheduler, the reason
text. A failing action (an unknown node, a command that fails or times out) is logged and counted,
retried after `backoff` (doubled each time) and paged once it failed `retries` times.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from flopwatch.remediate import alerts as am
from flopwatch.remediate.alerts import Alert, Page
from flopwatch.remediate.decide import FAILING, Plan, decide
from flopwatch.remediate.health import check_agent
from flopwatch.remediate.journal import Journal
from flopwatch.remediate.scheduler import NodeState, Scheduler, SchedulerError, run
from flopwatch.remediate.settings import Settings
from flopwatch.topology.model import Fabric

log = logging.getLogger("flopwatch.remediate")
#: The loop looks at the scheduler at least this often (hold-downs and backoffs end between alerts).
TICK_S = 5.0


@dataclass
class Failure:
    count: int
    retry_at: float
    message: str


class Remediator:
    def __init__(self, settings: Settings, scheduler: Scheduler, journal: Journal, *, fabric: Fabric | None = None,
                 clock: Callable[[], float] = time.time, fetch: Callable[[str], list[Alert]] = am.fetch,
                 post: Callable[[str, Sequence[Page], float], None] = am.post) -> None:
        self.settings, self.scheduler, self.journal, self.fabric = settings, scheduler, journal, fabric
        self.clock, self._fetch, self._post = clock, fetch, post
        self.firing: dict[str, Alert] = {}
        self.nodes: dict[str, NodeState] = {}
        self.plan = Plan()
        self.actions: Counter[tuple[str, str, str]] = Counter()   # (node, action, outcome)
        self.failures: dict[tuple[str, str], Failure] = {}
        self.reconcile_errors = 0
        self.last_reconcile = 0.0
        self.wake = threading.Event()
        self.started = threading.Event()   # set after the first pass: journal settled, Alertmanager read
        self._lock = threading.Lock()
        self._checks = ThreadPoolExecutor(2, thread_name_prefix="health")
        self._checking: set[str] = set()
        self._posted: dict[tuple[str, str], Page] = {}
        self._posted_at = 0.0

    @property
    def dry_run(self) -> bool:
        return bool(self.settings["dry_run"])

    # -- alerts in ---------------------------------------------------------------------------------
    def receive(self, alerts: Sequence[Alert]) -> None:
        """A webhook notification: firing alerts are remembered, resolved ones forgotten."""
        with self._lock:
            for alert in am.not_ours(alerts):
                if alert.firing:
                    self.firing[alert.key] = alert
                else:
                    self.firing.pop(alert.key, None)
        self.wake.set()

    def reconcile(self, keep_received: bool = False) -> None:
        """Replace what is known to fire with Alertmanager's own list (a missed webhook, a restart);
        `keep_received`: add it to what webhooks brought instead (right after a webhook, so that the
        decision sees every alert of a burst that Alertmanager sends as several notifications: the
        breaker judges them together instead of draining the first ones to arrive)."""
        url = self.settings["alertmanager"]
        if not url:
            return
        try:
            fetched = am.not_ours(self._fetch(url))
        except (am.AlertmanagerError, am.PayloadError) as error:
            self.reconcile_errors += 1
            log.warning("reconcile: cannot read Alertmanager: %s", error)
            return
        with self._lock:
            fresh = {alert.key: alert for alert in fetched}
            self.firing = {**self.firing, **fresh} if keep_received else fresh
        self.last_reconcile = self.clock()
        log.debug("reconciled: %d alerts firing", len(fetched))

    # -- one pass ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Settle what a previous run left half done, as the scheduler shows it."""
        try:
            nodes = self.scheduler.nodes()
        except SchedulerError as error:
            log.warning("cannot read the scheduler at start: %s", error)
            return
        for line in self.journal.settle(self.clock(), nodes):
            log.info("remediate: %s", line)

    def step(self) -> Plan:
        try:
            self.nodes = self.scheduler.nodes()
        except SchedulerError as error:
            self.reconcile_errors += 1
            log.warning("cannot read the scheduler: %s", error)
            return self.plan
        now = self.clock()
        with self._lock:
            firing = list(self.firing.values())
        plan = decide(firing, self.nodes, self.journal.history(), self.settings, now, self.fabric)
        self.plan = plan
        self._write_plan(plan)
        if self.dry_run:
            for drain in plan.drains:
                self._count(drain.node, "drain", "dry_run")
                log.info("remediate: dry-run: would run %s", self.scheduler.describe("drain", drain.node, drain.reason))
            for node in plan.resumes:
                self._count(node, "resume", "dry_run")
                log.info("remediate: dry-run: would run %s", self.scheduler.describe("resume", node))
            return plan
        for node in plan.cleared:
            self.journal.append(now, "cleared", node)
        for node in plan.recurred:
            self.journal.append(now, "recurred", node)
        for drain in plan.drains:
            self._act("drain", drain.node, drain.reason)
        for node in plan.unknown:
            self._failed("drain", node, SchedulerError("unknown_node", f"the scheduler knows no node {node!r}"))
        for node in plan.checks:
            self._check(node)
        for node in plan.resumes:
            self._act("resume", node)
        self._page(plan.pages + self._failing_pages())
        return plan

    def _write_plan(self, plan: Plan) -> None:
        data = plan.as_dict() | {"dry_run": self.dry_run, "commands": [
            *(self.scheduler.describe("drain", d.node, d.reason) for d in plan.drains),
            *(self.scheduler.describe("resume", node) for node in plan.resumes)]}
        path = self.settings.state_dir / "plan.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        temporary.replace(path)

    # -- actions ---------------------------------------------------------------------------------------
    def _count(self, node: str, action: str, outcome: str) -> None:
        with self._lock:
            self.actions[(node, action, outcome)] += 1

    def _act(self, action: str, node: str, reason: str = "") -> None:
        failure = self.failures.get((action, node))
        if failure is not None and self.clock() < failure.retry_at:
            return
        command = self.scheduler.describe(action, node, reason)
        self.journal.append(self.clock(), "intent", node, action=action, reason=reason)
        try:
            if action == "drain":
                self.scheduler.drain(node, reason)
            else:
                self.scheduler.resume(node)
        except SchedulerError as error:
            self.journal.append(self.clock(), "dropped", node, action=action)
            self._failed(action, node, error)
            return
        self.journal.append(self.clock(), action, node, reason=reason)
        self.failures.pop((action, node), None)
        self._count(node, action, "done")
        log.info("remediate: %s %s: %s", action, node, command)

    def _failed(self, action: str, node: str, error: SchedulerError) -> None:
        before = self.failures.get((action, node))
        if before is not None and self.clock() < before.retry_at:
            return
        count = before.count + 1 if before else 1
        wait = self.settings["backoff"] * 2 ** (count - 1)
        self.failures[(action, node)] = Failure(count, self.clock() + wait, str(error))
        self._count(node, action, error.kind)
        log.warning("remediate: %s %s failed (%s, attempt %d, next in %.0fs): %s", action, node, error.kind,
                    count, wait, error)

    def _failing_pages(self) -> list[Page]:
        return [Page(FAILING, node, f"FlopWatch cannot {action} {node}: {failure.count} attempts failed",
                     failure.message, (node,))
                for (action, node), failure in sorted(self.failures.items())
                if failure.count >= self.settings["retries"]]

    def _check(self, node: str) -> None:
        """Run the health check for `node` on a worker; its outcome is journaled and wakes the loop."""
        with self._lock:
            if node in self._checking:
                return
            self._checking.add(node)
        self._checks.submit(self._run_check, node)

    def _run_check(self, node: str) -> None:
        passed, why = self.health_check(node)
        self.journal.append(self.clock(), "health_passed" if passed else "health_failed", node, detail=why[:300])
        self._count(node, "health_check", "done" if passed else "failed")
        log.info("remediate: health check of %s %s (%s)", node, "passed" if passed else "failed", why)
        with self._lock:
            self._checking.discard(node)
        self.wake.set()

    def health_check(self, node: str) -> tuple[bool, str]:
        """(passed, why): the node's agent (`return.agent`), then the configured command
        (`return.health_check`); each one set must pass."""
        timeout, said = self.settings["return.health_timeout"], []
        if self.settings["return.agent"]:
            passed, why = check_agent(self.settings["return.agent"], node, timeout)
            if not passed:
                return False, why
            said.append(why)
        if self.settings["return.health_check"]:
            argv = [part.replace("{node}", node) for part in shlex.split(self.settings["return.health_check"])]
            try:
                run(argv, timeout)
            except SchedulerError as error:
                return False, str(error)
            said.append("exit 0")
        return True, "; ".join(said)

    def _page(self, pages: list[Page]) -> None:
        """Send pages that are new or changed; refresh the others every reconcile interval."""
        url = self.settings["alertmanager"]
        current = {(page.name, page.key): page for page in pages}
        fresh = self.clock() - self._posted_at < self.settings["reconcile_interval"]
        if not url or (current == self._posted and fresh):
            return
        try:
            self._post(url, list(current.values()), 3 * self.settings["reconcile_interval"] + 60)
            gone = [page for key, page in self._posted.items() if key not in current]
            self._post(url, gone, 0.0)
        except am.AlertmanagerError as error:
            log.warning("cannot page through Alertmanager: %s", error)
            return
        for page in current.values():
            if (page.name, page.key) not in self._posted:
                log.warning("remediate: paged %s: %s", page.name, page.summary)
        self._posted, self._posted_at = current, self.clock()

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.start()
        next_reconcile = 0.0
        while not stop.is_set():
            woken = self.wake.is_set()
            self.wake.clear()
            if time.monotonic() >= next_reconcile:
                self.reconcile()
                next_reconcile = time.monotonic() + self.settings["reconcile_interval"]
            elif woken:
                self.reconcile(keep_received=True)
            self.step()
            self.started.set()
            self.wake.wait(min(TICK_S, max(0.05, next_reconcile - time.monotonic())))
        self._checks.shutdown(wait=False, cancel_futures=True)


def state_path(settings: Settings) -> Path:
    return settings.state_dir / "journal.jsonl"
