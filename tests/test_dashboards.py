"""The generated dashboards: committed JSON matches the code, stable uids, what every panel carries,
template variables, links between dashboards and to the runbooks, names from the catalogue.

The queries themselves run against a real Prometheus in tests/integration/test_dashboard_queries.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from flopwatch import dashboards
from flopwatch.catalog import by_name
from flopwatch.cli import main
from flopwatch.dashboards import common

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "dashboards"
UIDS = ["flopwatch-fleet", "flopwatch-job", "flopwatch-node", "flopwatch-network", "flopwatch-fabric",
        "flopwatch-reliability"]
VARIABLES = {
    "flopwatch-fleet": {"datasource", "job_id"},
    "flopwatch-job": {"datasource", "job_id", "node", "gpu"},
    "flopwatch-node": {"datasource", "node", "gpu"},
    "flopwatch-network": {"datasource", "node"},
    "flopwatch-fabric": {"datasource", "level", "switch"},
    "flopwatch-reliability": {"datasource", "job_id", "node"},
}
BUILT = dashboards.build_all()


def data_panels():
    for uid, dashboard in BUILT.items():
        for panel in dashboards.panels(dashboard):
            yield uid, panel


def alert_rules() -> dict[str, dict]:
    rules = {}
    for path in sorted((ROOT / "alerts").glob("*.yml")):
        if path.name == "alertmanager.yml":
            continue
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                rules.setdefault(rule.get("alert") or rule["record"], rule)
    return rules


# --- the committed files -------------------------------------------------------------------------
@pytest.mark.parametrize("uid", UIDS)
def test_committed_json_matches_the_code(uid: str) -> None:
    path = COMMITTED / dashboards.filename(uid)
    assert path.is_file(), f"{path} missing: run `flopwatch dashboards build`"
    assert path.read_text(encoding="utf-8") == dashboards.render(BUILT[uid]), (
        f"{path} differs from flopwatch/dashboards/: run `flopwatch dashboards build` and commit the result")


def test_no_stray_dashboard_files() -> None:
    assert sorted(p.name for p in COMMITTED.glob("*.json")) == sorted(dashboards.filename(u) for u in UIDS)


def test_build_is_deterministic() -> None:
    assert dashboards.build_all() == BUILT


# --- uids, ids, layout ----------------------------------------------------------------------------
def test_uids_are_stable_and_valid() -> None:
    assert list(BUILT) == UIDS
    for uid, dashboard in BUILT.items():
        assert dashboard["uid"] == uid and len(uid) <= 40 and re.fullmatch(r"[a-z0-9-]+", uid)
        assert dashboard["title"].startswith("FlopWatch / ")
        assert common.TAG in dashboard["tags"]
        assert dashboard["schemaVersion"] >= 39, "Grafana 11 schema expected (SDK pinned to 11.6)"


def test_panel_ids_unique_and_grid_fits() -> None:
    for uid, dashboard in BUILT.items():
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)) and min(ids) >= 1, uid
        for panel in dashboard["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, f"{uid} / {panel['title']} overflows the grid"


# --- what every panel carries --------------------------------------------------------------------------
def test_every_panel_has_description_unit_and_the_datasource_variable() -> None:
    for uid, panel in data_panels():
        where = f"{uid} / {panel['title']}"
        assert len(panel.get("description", "")) >= 40, f"{where}: say what to look for"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), f"{where}: refIds {refs}"
        for target in panel["targets"]:
            assert target["expr"].strip(), where


def test_mfu_panels_use_percentunit_and_the_published_bands() -> None:
    mfu = [(uid, p) for uid, p in data_panels() if re.search(r"\bMFU\b", p["title"]) and p["type"] != "table"]
    assert len(mfu) >= 4
    for uid, panel in mfu:
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["unit"] == "percentunit", f"{uid} / {panel['title']}"
        steps = [(s["value"], s["color"]) for s in defaults["thresholds"]["steps"]]
        assert steps == [(None, "red"), (0.2, "orange"), (0.3, "yellow"), (0.4, "green")]
        assert "40-55%" in panel["description"]


def test_heatmap_and_state_timelines() -> None:
    panels = {(uid, p["title"]): p for uid, p in data_panels()}
    heatmap = panels[("flopwatch-job", "Compute seconds per step by rank")]
    assert heatmap["type"] == "heatmap" and heatmap["options"]["calculate"] is False
    assert heatmap["fieldConfig"]["defaults"]["unit"] == "s"
    for reading in ("hot cell", "band", "scattered"):
        assert reading in heatmap["description"]
    assert "job_id_rank:flopwatch_compute_seconds_per_step:rate1m" in heatmap["targets"][0]["expr"]
    reasons = panels[("flopwatch-node", "Clock-event reasons")]
    assert reasons["type"] == "state-timeline"
    assert reasons["targets"][0]["legendFormat"] == "GPU {{gpu}} {{reason}}"
    assert panels[("flopwatch-job", "Throttle reasons")]["type"] == "state-timeline"


def test_rank_rows_sort_in_rank_order() -> None:
    """Applies the generated label_replace calls (innermost first) as Prometheus would."""
    steps = re.findall(r'"rank", "(0*)\$1", "rank", "([^"]+)"', common.rank_rows("x"))
    assert len(steps) == 4
    padded = []
    for rank in ("7", "42", "123", "1024", "10000"):
        value = rank
        for zeros, pattern in steps:
            match = re.fullmatch(pattern, value)
            if match:
                value = zeros + match.group(1)
        padded.append(value)
    assert padded == ["00007", "00042", "00123", "01024", "10000"]
    assert padded == sorted(padded)


# --- template variables ---------------------------------------------------------------------------
def test_template_variables() -> None:
    union = set()
    for uid, dashboard in BUILT.items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert set(variables) == VARIABLES[uid], uid
        union |= set(variables)
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for name, variable in variables.items():
            if name == "datasource":
                continue
            assert variable["type"] == "query" and variable["datasource"]["uid"] == "${datasource}"
            assert variable["query"].startswith("label_values(") and f", {name})" in variable["query"]
            if variable.get("multi"):
                assert variable["includeAll"] and variable["allValue"] == ".*", f"{uid} ${name}"
        exprs = [t["expr"] for p in dashboards.panels(dashboard) for t in p["targets"]]
        for name in set(variables) - {"datasource"}:
            assert any(f"${name}" in expr for expr in exprs), f"{uid}: ${name} is offered but unused"
            # equality breaks on multi-select and All: selectors on variables are regex matches
            assert not any(re.search(rf'[^=!]="\${name}"', expr) for expr in exprs), f"{uid} ${name}"
    assert union == {"datasource", "job_id", "node", "gpu", "level", "switch"}


# --- links --------------------------------------------------------------------------------------------
def test_dashboards_link_to_each_other_keeping_variables_and_time() -> None:
    for uid, dashboard in BUILT.items():
        (dropdown,) = [link for link in dashboard["links"] if link["type"] == "dashboards"]
        assert dropdown["tags"] == [common.TAG] and dropdown["includeVars"] and dropdown["keepTime"], uid


def _data_links(panel: dict) -> list[dict]:
    links = list(panel["fieldConfig"]["defaults"].get("links", []))
    for override in panel["fieldConfig"].get("overrides", []):
        for prop in override["properties"]:
            if prop["id"] == "links":
                links += prop["value"]
    return links


def test_data_links_open_existing_dashboards_with_their_variables() -> None:
    targets = 0
    for uid, panel in data_panels():
        for link in _data_links(panel):
            parts = urlsplit(link["url"])
            if not parts.path.startswith("/d/"):
                continue
            target = parts.path.removeprefix("/d/")
            assert target in BUILT, f"{uid} / {panel['title']}: link to unknown dashboard {target}"
            defined = {v["name"] for v in BUILT[target]["templating"]["list"]}
            params = {key.removeprefix("var-") for key in parse_qs(parts.query) if key.startswith("var-")}
            assert params and params <= defined, f"{uid} / {panel['title']} -> {target}: {params}"
            assert "${__url_time_range}" in link["url"]
            targets += 1
    assert targets >= 8


def test_runbook_links_match_the_alerts_runbook_urls() -> None:
    rules = alert_rules()
    alerts = {name: rule for name, rule in rules.items() if "alert" in rule}
    assert set(alerts) == set(common.ALERTS), "alerts/*.yml and common.ALERTS disagree: add the new alert there"
    linked = set()
    for uid, panel in data_panels():
        for link in panel.get("links", []):
            anchor = link["url"].split("runbooks.md#", 1)[1]
            assert link["url"] == f"{common.DOCS_URL}/runbooks.md#{anchor}"
            matches = [name for name in alerts if name.lower() == anchor]
            assert len(matches) == 1, f"{uid} / {panel['title']}: #{anchor} is no alert"
            alert = matches[0]
            assert alerts[alert]["annotations"]["runbook_url"].endswith(f"runbooks.md#{anchor}")
            linked.add(alert)
    assert linked == set(common.ALERTS), f"alerts without a panel linking their runbook: {set(common.ALERTS) - linked}"
    runbooks = ROOT / "docs" / "runbooks.md"
    if runbooks.is_file():  # written by the rules work; once there, every anchor must resolve
        headings = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip()).lower().replace(" ", "-")
                    for line in runbooks.read_text().splitlines() if line.startswith("#")}
        assert {a.lower() for a in common.ALERTS} <= headings


def test_docs_url_is_configurable() -> None:
    other = dashboards.build("flopwatch-node", "https://docs.example.internal/flopwatch")
    urls = [link["url"] for p in dashboards.panels(other) for link in p.get("links", [])]
    assert urls and all(u.startswith("https://docs.example.internal/flopwatch/runbooks.md#") for u in urls)


def test_alerts_table_links_each_alert_to_its_anchor() -> None:
    (table,) = [p for uid, p in data_panels() if p["title"] == "FlopWatch alerts"]
    expr = table["targets"][0]["expr"]
    for alert in common.ALERTS:
        assert f'"runbook", "{alert.lower()}", "alertname", "{alert}"' in expr
    assert any(link["url"].endswith("runbooks.md#${__data.fields.runbook}") for link in _data_links(table))


# --- names ---------------------------------------------------------------------------------------------
def test_queries_use_catalogue_metrics_and_contract_rules_only() -> None:
    catalogue = by_name()
    series = set(catalogue)
    for name, metric in catalogue.items():
        if metric.type == "histogram":
            series |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    records = {name for name, rule in alert_rules().items() if "record" in rule}
    assert set(common.RULES) <= records, f"rules the dashboards read but alerts/ lacks: {set(common.RULES) - records}"
    used_rules = set()
    rule_name = re.compile(r"\b\w+:flopwatch_\w+:\w+")
    for uid, panel in data_panels():
        for target in panel["targets"]:
            expr = re.sub(r'"[^"]*"', '""', target["expr"])  # label values are not names
            for rule in rule_name.findall(expr):
                assert rule in common.RULES, f"{uid} / {panel['title']}: {rule} is not a contract rule"
                used_rules.add(rule)
            for name in re.findall(r"\bflopwatch_\w+", rule_name.sub(" ", expr)):
                assert name in series, f"{uid} / {panel['title']}: {name} is not in the catalogue"
    assert used_rules == set(common.RULES), f"contract rules listed but unused: {set(common.RULES) - used_rules}"


# --- the build command ------------------------------------------------------------------------------
def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`flopwatch dashboards ARGS` in-process (the console script calls the same main)."""
    try:
        code = main(["dashboards", *args])
    except SystemExit as exit_:  # --help
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_build_command_writes_and_checks(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert run_cli(capsys, "build", "--out", str(out))[0] == 0
    for uid in UIDS:
        written = (out / dashboards.filename(uid)).read_text(encoding="utf-8")
        assert written == (COMMITTED / dashboards.filename(uid)).read_text(encoding="utf-8")
    assert run_cli(capsys, "build", "--check", "--out", str(out))[0] == 0
    (out / "flopwatch-job.json").write_text("{}\n")
    code, _, err = run_cli(capsys, "build", "--check", "--out", str(out))
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("flopwatch dashboards: ")
    assert "flopwatch-job.json differ from the code" in err and "Traceback" not in err


def test_build_command_unwritable_out_is_one_line(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(capsys, "build", "--out", str(blocker / "sub"))
    assert code == 1 and err.strip() == f"flopwatch dashboards: cannot write to {blocker / 'sub'}: Not a directory"


def test_dashboards_help_and_usage(capsys) -> None:
    assert run_cli(capsys, "--help")[0] == 0
    for action in ("build", "push"):
        code, out, _ = run_cli(capsys, action, "--help")
        assert code == 0 and "usage: flopwatch dashboards " + action in out
    code, _, err = run_cli(capsys)
    assert code == 2 and "build" in err and "push" in err


def test_console_script_runs_the_command() -> None:
    result = subprocess.run([sys.executable, "-m", "flopwatch", "dashboards", "build", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_expand_substitutes_like_grafana() -> None:
    values = {"node": "node0001", "node_pool": "p", "gpu": "(3|5)", "__rate_interval": "20s"}
    assert dashboards.expand('x{node=~"$node", gpu=~"${gpu}", pool="$node_pool"}[$__rate_interval]', values) == (
        'x{node=~"node0001", gpu=~"(3|5)", pool="p"}[20s]')
    assert dashboards.expand('label_replace(x, "a", "0$1", "b", "(.)")', values) == (
        'label_replace(x, "a", "0$1", "b", "(.)")')
