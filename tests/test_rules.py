"""The rule files in alerts/: promtool accepts them and their unit tests pass, every alert carries
what a pager needs and has a firing and a must-not-fire test, names match the shared contract and
the metric catalogue, the XID selection equals flopwatch/xid.py, and Alertmanager's config passes
amtool. Real promtool and amtool (Debian packages `prometheus`, `prometheus-alertmanager`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import program

from flopwatch import xid
from flopwatch.catalog import by_name
from flopwatch.commands.demo import alertmanager_config
from flopwatch.mixin import names
from flopwatch.mixin.config import MixinConfig
from flopwatch.stack import releases

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "alerts"
RULE_FILES = sorted(p for p in ALERTS.glob("*.yml") if p.name != "alertmanager.yml")
TEST_FILES = sorted((ALERTS / "tests").glob("*.yml"))

#: The shared contract: names other work relies on (flopwatch/mixin/names.py, the one list).
CONTRACT_RECORDS = set(names.CONTRACT_RECORDS)
CONTRACT_ALERTS = set(names.ALERTS)
#: Where every runbook_url points with the default settings: <runbooks>#<alert in lower case>.
RUNBOOKS = MixinConfig().urls.runbooks
STRAGGLER_CAUSES = {"thermal", "power", "hw_slowdown", "pcie", "nvlink", "nic", "host_cpu", "dataloader", "host_stall",
                    "unknown"}


#: Each promtool and amtool check runs on both releases (flopwatch.stack.releases): Prometheus 2.42
#: and 3.x read the same rule files and tests differently at window edges.
on_both = pytest.mark.parametrize("release", releases.RELEASES)


def run(*command: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def alerts() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


def test_rule_files_exist() -> None:
    names = {p.name for p in RULE_FILES}
    assert {"flopwatch-mfu.yml", "flopwatch-goodput.yml", "flopwatch-stragglers.yml", "flopwatch-gpu.yml",
            "flopwatch-network.yml", "flopwatch-jobs.yml", "flopwatch-agent.yml"} <= names


@on_both
def test_promtool_check_rules_is_clean(release: str) -> None:
    promtool = program("promtool", release)
    result = run(promtool, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES), result.stdout


def test_every_rule_file_has_promtool_tests() -> None:
    tested = {rule_file for path in TEST_FILES for rule_file in yaml.safe_load(path.read_text())["rule_files"]}
    assert {f"../{p.name}" for p in RULE_FILES} <= tested


@pytest.mark.slow
@on_both
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path, release: str) -> None:
    """One promtool run per file and release, so that a failure names both."""
    promtool = program("promtool", release)
    result = run(promtool, "test", "rules", test_file.name, cwd=ALERTS / "tests")
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert result.stdout.count("SUCCESS") == 1, result.stdout


@pytest.mark.parametrize("generator", ["pipeline_cases", "straggler_cases"])
def test_generated_test_cases_are_committed_as_generated(generator: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(generator, ALERTS / "tests" / f"{generator}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look themselves up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    outputs = module.outputs() if hasattr(module, "outputs") else {module.OUT: module.render()}
    for out, text in outputs.items():
        assert out.read_text() == text, \
            f"{out.name}'s template is stale: run python alerts/tests/{generator}.py, then flopwatch rules build"


def test_straggler_medians_are_taken_over_peer_groups() -> None:
    """A rank is compared with the ranks of its own job and pipeline stage, never the whole job."""
    straggler_rules = [rule for rule in rules() if "straggler" in rule.get("record", "") or
                       "arrival" in rule.get("record", "") or "data_seconds" in rule.get("record", "")]
    medians = [rule["expr"] for rule in straggler_rules
               if "quantile" in rule["expr"] and "job_id_rank:" in rule["expr"]]
    assert medians and all("quantile by (job_id, stage)" in expr for expr in medians)
    joins = " ".join(rule["expr"] for rule in straggler_rules)
    assert "on (job_id) group_left ()" not in joins


def test_every_rule_file_has_a_unit_test_file() -> None:
    tested = {(ALERTS / "tests" / ref).resolve() for path in TEST_FILES
              for ref in yaml.safe_load(path.read_text())["rule_files"]}
    assert tested == {p.resolve() for p in RULE_FILES}


def test_every_alert_carries_severity_summary_description_and_runbook() -> None:
    for rule in alerts():
        name = rule["alert"]
        assert rule.get("labels", {}).get("severity") in ("page", "ticket"), name
        notes = rule.get("annotations", {})
        assert notes.get("summary") and notes.get("description"), name
        assert "{{" in notes["description"], f"{name}: the description should carry the numbers"
        assert notes.get("runbook_url") == f"{RUNBOOKS}#{name.lower()}", \
            f"{name}: runbook_url should be [[ runbooks ]]#{name.lower()} in its template (the mixin's urls.runbooks)"


def test_contract_names_are_all_defined() -> None:
    records = {rule["record"] for rule in rules() if "record" in rule}
    assert records >= CONTRACT_RECORDS, CONTRACT_RECORDS - records
    assert {rule["alert"] for rule in alerts()} == CONTRACT_ALERTS, "alert names live in flopwatch/mixin/names.py"


def test_every_alert_has_a_firing_and_a_must_not_fire_case() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert CONTRACT_ALERTS - fires == set(), "alerts without a test where they fire"
    assert CONTRACT_ALERTS - silent == set(), "alerts without a must-not-fire test"


def test_firing_cases_state_labels_and_annotations() -> None:
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                for expected in check.get("exp_alerts") or []:
                    assert expected.get("exp_labels", {}).get("severity"), (path.name, case["name"])
                    assert expected.get("exp_annotations", {}).get("summary"), (path.name, case["name"])


_FIGURE = re.compile(r"\d+\.\d+|\d+(?=%)")


def _significant_digits(figure: str) -> int:
    return len(figure.replace(".", "").lstrip("0")) or 1


def test_summaries_state_figures_to_three_significant_digits() -> None:
    """Every alert's firing cases (promtool checks the text exactly) state figures with at most 3
    significant digits, and no summary template formats a value with more (humanize: 4)."""
    checked = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                for expected in check.get("exp_alerts") or []:
                    summary = expected["exp_annotations"]["summary"]
                    for figure in _FIGURE.findall(summary):
                        assert _significant_digits(figure) <= 3, (path.name, summary)
                    checked.add(check["alertname"])
    assert checked == CONTRACT_ALERTS
    for rule in alerts():
        summary = rule["annotations"]["summary"]
        assert not re.search(r"humanize(Percentage)?\b|%\.[2-9]f", summary), (rule["alert"], summary)


def test_straggler_alerts_name_rank_and_cause() -> None:
    stragglers = [rule for rule in alerts() if rule["alert"] == "FlopWatchStraggler"]
    assert len(stragglers) == 7
    assert {rule["labels"]["detector"] for rule in stragglers} == {
        "corroborated", "data_phase", "other_phase", "rank_only", "own_history", "gpu_clock"}
    assert all(rule["annotations"].get("evidence") for rule in stragglers if rule["labels"]["detector"] != "gpu_clock")
    text = "\n".join(rule["expr"] for rule in stragglers)
    for cause in re.findall(r'"cause", "(\w+)"', text):
        assert cause in STRAGGLER_CAUSES
    causes = {rule["labels"]["cause"] for rule in rules()
              if rule.get("record") == "node_gpu:flopwatch_slowdown_cause:priority"}
    assert causes | {"dataloader", "host_stall", "unknown"} == STRAGGLER_CAUSES
    candidates = [rule["expr"] for rule in rules()
                  if rule.get("record") in ("job_id_rank:flopwatch_straggler_corroborated:ratio",
                                            "job_id_rank:flopwatch_straggler_uncorroborated:ratio")]
    candidates.append(next(rule["expr"] for rule in rules()
                           if rule.get("record") == "job_id_rank:flopwatch_straggler_own_history:ratio"))
    assert len(candidates) == 3
    assert all("job_id:flopwatch_straggler_job_ranks:max >= 8" in expr for expr in candidates)
    assert "job_id:flopwatch_gpus_scored:count >= 8" in text
    scored = next(rule["expr"] for rule in rules() if rule.get("record") == "job_id:flopwatch_gpus_scored:count")
    assert scored == "count by (job_id) (node_gpu:flopwatch_gpu_straggler_score:ratio)"


_RECORD = re.compile(r"\b[A-Za-z_]+:[A-Za-z0-9_]+:[a-z0-9_]+\b")
_METRIC = re.compile(r"(?<![:\w])flopwatch_[a-z0-9_]+\b")


def test_expressions_use_catalogued_metrics_and_defined_records() -> None:
    catalogue = set(by_name())
    histograms = {name + suffix for name, metric in by_name().items() if metric.type == "histogram"
                  for suffix in ("_bucket", "_sum", "_count")}
    records = {rule["record"] for rule in rules() if "record" in rule}
    for rule in rules():
        expr = rule["expr"]
        for name in _RECORD.findall(expr):
            assert name in records, f"{rule.get('record') or rule.get('alert')}: {name} is not recorded anywhere"
        for name in _METRIC.findall(_RECORD.sub("", expr)):
            assert name in catalogue | histograms, f"{rule.get('record') or rule.get('alert')}: {name} not catalogued"


def test_xid_selection_equals_the_table() -> None:
    by_alert = {rule["alert"]: rule for rule in alerts()}
    critical, ticket = by_alert["FlopWatchGpuXidCritical"], by_alert["FlopWatchGpuXid"]
    assert set(re.findall(r'xid=~"([^"]+)"', critical["expr"])) == {xid.page_regex()}
    assert set(re.findall(r'xid!~"([^"]+)"', ticket["expr"])) == {xid.page_regex()}
    assert "xid=~" not in ticket["expr"] and "xid!~" not in critical["expr"]
    assert xid.action_template("page") in " ".join(critical["annotations"]["description"].split())
    assert xid.action_template("ticket") in " ".join(ticket["annotations"]["description"].split())


def test_runbooks_have_one_anchor_per_alert() -> None:
    text = (ROOT / "docs" / "runbooks.md").read_text()
    headings = {line[3:].strip() for line in text.splitlines() if line.startswith("## ")}
    assert headings >= CONTRACT_ALERTS, CONTRACT_ALERTS - headings


def test_rules_doc_covers_every_recording_rule() -> None:
    text = (ROOT / "docs" / "rules.md").read_text()
    missing = {rule["record"] for rule in rules() if "record" in rule and rule["record"] not in text}
    assert not missing


@on_both
def test_alertmanager_config_passes_amtool(release: str) -> None:
    amtool = program("amtool", release)
    result = run(amtool, "check-config", "alertmanager.yml", cwd=ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    (["severity=page", "alertname=FlopWatchStraggler", "job_id=llm", "node=n1"], "page"),
    (["severity=ticket", "alertname=FlopWatchGpuXid"], "ticket"),
    (["alertname=SomethingElse"], "ticket"),
])
@on_both
def test_alertmanager_routes_by_severity(labels: list[str], receiver: str, release: str) -> None:
    amtool = program("amtool", release)
    result = run(amtool, "config", "routes", "test", "--config.file=alertmanager.yml", *labels, cwd=ALERTS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == receiver


def test_alertmanager_groups_by_job_and_node_and_inhibits_on_lost_gpus() -> None:
    config = yaml.safe_load((ALERTS / "alertmanager.yml").read_text())
    assert config["route"]["group_by"] == ["cluster", "job_id", "node"]
    assert all(rule["equal"][0] == "cluster" for rule in config["inhibit_rules"])
    sources = {tuple(rule["source_matchers"]) for rule in config["inhibit_rules"]}
    assert ('alertname="FlopWatchAgentDown"',) in sources and ('alertname="FlopWatchGpuLost"',) in sources


@pytest.mark.parametrize("template", ["flopwatch.title", "flopwatch.text"])
@on_both
def test_templates_render(template: str, release: str) -> None:
    amtool = program("amtool", release)
    result = run(amtool, "template", "render", "--template.glob=templates/*.tmpl",
                 f'--template.text={{{{ template "{template}" . }}}}', cwd=ALERTS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@on_both
def test_title_names_the_job_node_and_cluster(tmp_path: Path, release: str) -> None:
    amtool = program("amtool", release)
    labels = {"alertname": "FlopWatchStraggler", "severity": "page", "job_id": "4242", "node": "gpu-07",
              "cluster": "east"}
    alert = {"status": "firing", "labels": labels, "annotations": {"summary": "s"}, "startsAt": "2026-01-01T00:00:00Z",
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "1"}
    data = {"receiver": "page", "status": "firing", "alerts": [alert], "externalURL": "",
            "groupLabels": {k: labels[k] for k in ("cluster", "job_id", "node")}, "commonLabels": labels,
            "commonAnnotations": {}}
    (tmp_path / "data.json").write_text(json.dumps(data))
    result = run(amtool, "template", "render", "--template.glob=templates/*.tmpl",
                 f"--template.data={tmp_path / 'data.json'}", '--template.text={{ template "flopwatch.title" . }}',
                 cwd=ALERTS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[PAGE] Straggler job 4242 on gpu-07 (east)"


@on_both
def test_local_alertmanager_config_keeps_routing_and_talks_only_to_the_webhook(tmp_path: Path, release: str) -> None:
    amtool = program("amtool", release)
    config = alertmanager_config("http://127.0.0.1:9/alerts")
    for receiver in config["receivers"]:
        assert set(receiver) == {"name", "webhook_configs"}
        assert receiver["webhook_configs"][0]["url"] == "http://127.0.0.1:9/alerts"
    assert config["inhibit_rules"] == yaml.safe_load((ALERTS / "alertmanager.yml").read_text())["inhibit_rules"]
    path = tmp_path / "am.yml"
    path.write_text(yaml.safe_dump(config))
    result = run(amtool, "check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
