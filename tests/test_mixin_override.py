"""An override config cannot silently break a rule: `flopwatch rules build` with another agent and
dcgm-exporter selector, cluster label, dtype, thresholds, severities and URLs writes rules that real promtool
accepts and whose promtool tests (rendered with the same settings, input series relabelled for the
selectors) pass; every raw series in every expression carries its selector; Alertmanager's config
passes amtool, routes the renamed severities and groups and inhibits by the renamed cluster label,
which the report groups by too when it reads the same file. Real promtool and amtool (Debian packages
`prometheus`, `prometheus-alertmanager`)."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import program

from flopwatch.cli import main
from flopwatch.commands import report as report_command
from flopwatch.mixin import render
from flopwatch.mixin.config import load

#: Settings a fleet might change, each away from its default (the promtool cases' inputs sit on the
#: same side of these thresholds; their expected texts follow the settings).
OVERRIDE = """\
selectors:
  agent: job="gpu-agents"
  dcgm: job="dcgm-gpus"
labels: {cluster: site}
dtype: fp16
severities: {page: critical, ticket: warning}
urls:
  runbooks: https://wiki.example.internal/gpu/runbooks
  docs: https://wiki.example.internal/gpu
jobs:
  mfu_regression: {ratio: 0.8}
  goodput_low: {target: 0.7}
agent: {collector_errors_per_second: 0.05}
network: {symbol_errors_per_hour: 100}
stragglers: {host_cpu_busy: 0.85}
"""
RAW = re.compile(rf"(?<![\w:\"'])({render.SERIES['agent']}|{render.SERIES['dcgm']})(?![\w:])(\{{[^}}]*\}})?")




@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("override")
    (root / "fw.yml").write_text(OVERRIDE)
    assert main(["rules", "build", "--config", str(root / "fw.yml"), "--out", str(root / "alerts")]) == 0
    return root


def rule_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "alerts").glob("*.yml") if p.name != "alertmanager.yml")


def rules(root: Path) -> list[dict]:
    return [rule for path in rule_files(root) for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


@pytest.mark.slow
@pytest.mark.slow
def test_override_rules_pass_promtool_and_their_tests(built: Path) -> None:
    promtool = program("promtool")
    check = subprocess.run([promtool, "check", "rules", *map(str, rule_files(built))], capture_output=True,
                           text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = sorted(p.name for p in (built / "alerts" / "tests").glob("*.yml"))
    assert len(tests) >= 9
    result = subprocess.run([promtool, "test", "rules", *tests], cwd=built / "alerts" / "tests",
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert result.stdout.count("SUCCESS") == len(tests)


def _without_comments(expr: str) -> str:
    return "\n".join(line for line in expr.split("\n") if not line.lstrip().startswith("#"))


def test_every_raw_series_selects_its_exporter(built: Path) -> None:
    seen = set()
    for rule in rules(built):
        for name, matchers in RAW.findall(_without_comments(rule["expr"])):
            wanted = "job='dcgm-gpus'" if name.startswith("DCGM_") else "job='gpu-agents'"
            assert matchers.startswith("{" + wanted), f"{rule.get('record') or rule.get('alert')}: {name}{matchers}"
            seen.add(name[:4])
    assert seen == {"flop", "DCGM"}
    agent_down = next(rule for rule in rules(built) if rule.get("alert") == "FlopWatchAgentDown")
    assert "up{job='gpu-agents'}" in agent_down["expr"]


def test_settings_reach_the_expressions_labels_and_annotations(built: Path) -> None:
    text = "\n".join(path.read_text() for path in rule_files(built))
    peak = "node_gpu_dtype:flopwatch_gpu_peak_dense_flops:max"   # what MFU divides by
    assert text.count(peak + '{dtype="fp16"}') >= 4 and peak + '{dtype="bf16"}' not in text
    by_alert = {rule["alert"]: rule for rule in rules(built) if "alert" in rule}
    assert "< on (job_id) 0.8 * quantile_over_time" in by_alert["FlopWatchJobMfuRegression"]["expr"]
    assert by_alert["FlopWatchGoodputLow"]["expr"].split("\n")[0].endswith("< 0.7")
    assert "(target 70%)" in by_alert["FlopWatchGoodputLow"]["annotations"]["summary"]
    assert {rule["labels"]["severity"] for rule in by_alert.values()} == {"critical", "warning"}
    assert all(rule["annotations"]["runbook_url"] == f"https://wiki.example.internal/gpu/runbooks#{name.lower()}"
               for name, rule in by_alert.items())
    dashboards = "\n".join(p.read_text() for p in (built / "dashboards").glob("*.json"))
    assert "https://wiki.example.internal/gpu/runbooks.md#" in dashboards
    assert "github.com/flopwatch" not in dashboards


def test_override_alertmanager_config_routes_the_renamed_severities(built: Path) -> None:
    amtool = program("amtool")
    result = subprocess.run([amtool, "check-config", "alertmanager.yml"], cwd=built / "alerts",
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for severity, receiver in (("critical", "page"), ("warning", "ticket")):
        routed = subprocess.run([amtool, "config", "routes", "test", "--config.file", "alertmanager.yml",
                                 f"severity={severity}"], cwd=built / "alerts", capture_output=True, text=True,
                                timeout=60, check=False)
        assert routed.stdout.strip() == receiver, routed.stdout + routed.stderr


def test_the_cluster_label_reaches_alertmanager_the_notification_and_the_report(
        built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = yaml.safe_load((built / "alerts" / "alertmanager.yml").read_text())
    assert config["route"]["group_by"] == ["site", "job_id", "node"]
    assert all(rule["equal"][0] == "site" for rule in config["inhibit_rules"])
    assert "cluster" not in str(config["route"]) + str(config["inhibit_rules"])
    assert 'index .GroupLabels "site"' in (built / "alerts" / "templates" / "flopwatch.tmpl").read_text()
    monkeypatch.setenv("FLOPWATCH_RULES_CONFIG", str(built / "fw.yml"))   # the environment names the file
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    args = parser.parse_args(["--prometheus", "http://127.0.0.1:9", "--out", str(built / "report")])
    settings = report_command.load_settings(args)
    assert (settings.cluster_label, settings.dtype) == ("site", "fp16")
    (built / "report.yml").write_text("cluster_label: region\n")        # the report's own file wins
    args = parser.parse_args(["--prometheus", "http://127.0.0.1:9", "--out", str(built / "report"),
                              "--config", str(built / "report.yml")])
    assert (report_command.load_settings(args).cluster_label, report_command.load_settings(args).dtype) == \
        ("region", "fp16")


def test_the_override_file_is_read_as_written(built: Path) -> None:
    config = load(built / "fw.yml")
    assert (config.selectors.agent, config.labels.cluster, config.dtype, config.network.symbol_errors_per_hour) == \
        ('job="gpu-agents"', "site", "fp16", 100)
