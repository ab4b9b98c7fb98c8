"""Running dashboard panels the way Grafana would, against a real Prometheus: shared by the tests
that check the dashboards on FlopWatch's agents (test_dashboard_queries.py) and on dcgm-exporter
(test_dashboards_dcgm.py), so both judge a panel by the same rules.

No Grafana server runs in the tests: each target's template variables are substituted as Grafana
writes them (a multi-value selection as a regex alternation, All as `.*`, $__rate_interval and
$__range as durations) and the query goes to Prometheus as its panel sends it (range queries for
graphs, instant queries for stats and tables).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from flopwatch import dashboards
from flopwatch.dashboards.common import LEGEND_LABEL
from flopwatch.promql import PromClient, PromError
from flopwatch.stack import releases

ROOT = Path(__file__).resolve().parents[2]
#: Every rule file of alerts/: panels on recording rules and ALERTS need them.
RULE_FILES = sorted(p for p in (ROOT / "alerts").glob("*.yml") if p.name != "alertmanager.yml")
#: Grafana's $__rate_interval for a 1 s scrape interval and $__range for the checked span.
BUILTINS = {"__rate_interval": "10s", "__range": "5m", "__interval": "2s"}


@dataclass(frozen=True)
class Target:
    """One query of one panel, with its expression as Grafana would send it."""

    uid: str
    panel: dict
    target: dict
    expr: str

    @property
    def key(self) -> tuple[str, str]:
        return self.uid, self.panel["title"]


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with the chosen variable values and the built-ins; fails on a variable left over."""
    expr = dashboards.expand(expr, {**values, **BUILTINS})
    assert "$" not in expr.replace("$1", ""), f"unsubstituted variable in {expr}"
    return expr


def all_targets(variables: dict[str, dict[str, str]]) -> list[Target]:
    """Every query of every dashboard, substituted with `variables[uid]`."""
    out = []
    for uid, dashboard in dashboards.build_all().items():
        for panel in dashboards.panels(dashboard):
            for target in panel.get("targets", []):
                out.append(Target(uid, panel, target, substitute(target["expr"], variables[uid])))
    return out


def promtool_parses(targets: list[Target], tmp_path: Path) -> None:
    """Each substituted query as a recording rule; `promtool check rules` must parse them all."""
    promtool = releases.binary("promtool")
    rules = [{"record": f"dashboard:{t.uid.replace('-', '_')}:panel{t.panel['id']}_{t.target['refId']}",
              "expr": t.expr} for t in targets]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def run(client: PromClient, start: float, target: Target) -> tuple[str, list[dict]]:
    """The series `target` returns now (instant) or since `start` (range), and '' or an error."""
    try:
        if target.target.get("instant"):
            return "", [s.labels for s in client.query(target.expr)]
        return "", [s["metric"] for s in client.query_range(target.expr, start, time.time(), 2)]
    except PromError as error:
        return f"error: {error}", []


def check_target(client: PromClient, start: float, target: Target) -> tuple[str, list[dict]]:
    """'' when the target returns series with its legend's labels, else what is wrong; and the series."""
    problem, series = run(client, start, target)
    if problem:
        return problem, []
    if not series:
        return "no series", []
    wanted = set(LEGEND_LABEL.findall(target.target.get("legendFormat", "")))
    missing = sorted({label for labels in series for label in wanted if label not in labels})
    if missing:
        return f"series without legend label(s) {missing}", series
    return "", series


def table_columns(panel: dict) -> list[str]:
    """The label columns a table panel shows, in order ([] for other panels)."""
    for transformation in panel.get("transformations", []):
        if transformation["id"] == "organize":
            return list(transformation["options"]["indexByName"])
    return []


def problems(client: PromClient, start: float, targets: list[Target],
             unfilled: dict[tuple[str, str, str], str]) -> list[str]:
    """What is wrong with `targets` now: queries without series or legend labels, and table columns of
    their panels that no series fills (unless listed in `unfilled` as (uid, title, column))."""
    out, seen = [], {}
    for target in targets:
        problem, series = check_target(client, start, target)
        seen.setdefault(target.key, set()).update(label for labels in series for label in labels)
        if problem:
            out.append(f"{target.uid} / {target.panel['title']} / {target.target['refId']}: {problem}\n"
                       f"    {target.expr[:300]}")
    panels = {target.key: target.panel for target in targets}
    for (uid, title), panel in panels.items():
        for column in table_columns(panel):
            if column not in seen[(uid, title)] and (uid, title, column) not in unfilled:
                out.append(f"{uid} / {title}: no series has the column label {column!r}")
    return out


def until_clean(client: PromClient, start: float, targets: list[Target],
                unfilled: dict[tuple[str, str, str], str], deadline_s: float) -> list[str]:
    """`problems()` polled until there are none or `deadline_s` passes (rules need a few evaluations)."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = problems(client, start, targets, unfilled)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(3)
