"""The two tiers' rule sets and configs (flopwatch/mixin/tiers.py): the shard set is every rule
file without the job-level alerts, the global set holds exactly those alerts and the records they
read, the shards forward exactly what the global rules read and do not record, and promtool (and
vmalert, for the global set) accept the files on both releases."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers import program

from flopwatch.cli import main
from flopwatch.mixin import build, names, render, tiers
from flopwatch.mixin.config import MixinConfig, Selectors, load

ROOT = Path(__file__).resolve().parents[1]
WRITE = "http://vminsert:8480/insert/0/prometheus/api/v1/write"
SECTION = f"""\
topology:
  shards:
    - {{name: shard-1, replicas: [a, b], gpus: 5000}}
    - {{name: shard-2, replicas: [x]}}
  global:
    write_url: {WRITE}
    read_url: http://vmselect:8481/select/0/prometheus
  alertmanagers:
    - {{url: http://am-1:9093, peer: am-1:9094}}
    - {{url: https://am-2:9443/am, peer: am-2:9094}}
    - {{url: http://am-3:9093, peer: am-3:9094}}
"""


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiers") / "fw.yml"
    path.write_text(SECTION)
    return path


@pytest.fixture(scope="module")
def config(settings: Path) -> MixinConfig:
    return load(settings)


@pytest.fixture(scope="module")
def shard(config: MixinConfig) -> dict[str, str]:
    return tiers.shard_rules(config)


@pytest.fixture(scope="module")
def global_(config: MixinConfig) -> dict[str, str]:
    return tiers.global_rules(config)


@pytest.fixture(scope="module")
def forwarded(config: MixinConfig) -> list[str]:
    return tiers.forwarded_names(config)


def rules_of(text: str) -> dict[str, list[tuple[str, str]]]:
    """Group name -> [(kind, name)] of a rule file, in order."""
    return {group["name"]: [("alert", r["alert"]) if "alert" in r else ("record", r["record"]) for r in group["rules"]]
            for group in yaml.safe_load(text)["groups"]}


def whole_set() -> dict[str, str]:
    return {name: text for name, text in build.rules(MixinConfig()).items() if tiers.RULE_FILE.match(name)}


def test_the_job_alerts_are_six_named_alerts() -> None:
    assert len(tiers.JOB_ALERTS) == 6
    assert set(names.ALERTS) >= tiers.JOB_ALERTS


def test_the_shard_set_is_every_rule_file_without_the_job_alerts(shard: dict[str, str]) -> None:
    whole = whole_set()
    assert set(shard) == set(whole) - {"flopwatch-jobs.yml"}      # only job alerts in it: no file left
    for name, text in whole.items():
        expected = {group: [rule for rule in rules if rule[1] not in tiers.JOB_ALERTS]
                    for group, rules in rules_of(text).items()}
        assert (rules_of(shard[name]) if name in shard else {}) == {g: r for g, r in expected.items() if r}, name
    alerts = Counter(rule for text in shard.values() for rules in rules_of(text).values() for rule in rules
                     if rule[0] == "alert")
    assert {alert for _, alert in alerts} == set(names.ALERTS) - tiers.JOB_ALERTS
    assert alerts[("alert", "FlopWatchStraggler")] > 1                # every rule of a repeated alert kept


def test_the_cut_keeps_each_comment_with_its_rule(shard: dict[str, str]) -> None:
    text = shard["flopwatch-stragglers.yml"]
    assert "# Each stage's typical arrival (median over its data-parallel peers" in text    # the record's, kept
    assert "# The slowest stage, when it is over" not in text       # FlopWatchPipelineImbalance's, gone with it
    assert text.split("\n")[1].startswith("# Shard rule set (flopwatch/mixin/tiers.py)")


def test_cut_drops_blocks_with_their_comments_and_empty_groups() -> None:
    text = "\n".join([
        "# header", "groups:", "  # group one", "  - name: one", "    rules:",
        "      # first", "      - record: 'a:b:c'", "        expr: up",
        "      # second", "      - alert: Drop", "        expr: up == 0", "", "  # group two",
        "  - name: two", "    rules:", "      - alert: Drop", "        expr: up", ""])
    kept = tiers.cut(text, "x.yml", lambda group: True, lambda kind, name: name == "a:b:c", "note")   # unquoted
    assert kept == "\n".join(["# header", "# note", "groups:", "  # group one", "  - name: one", "    rules:",
                              "      # first", "      - record: 'a:b:c'", "        expr: up", ""])
    assert tiers.cut(text, "x.yml", lambda group: group == "two", lambda kind, name: kind == "record", "n") is None
    flow = "groups:\n  - name: one\n    rules:\n      - {record: 'a:b:c', expr: up}\n      - {alert: Drop, expr: up}\n"
    with pytest.raises(ValueError, match=r"x.yml: the tier cut .* misread this rule file's layout"):
        tiers.cut(flow, "x.yml", lambda group: True, lambda kind, name: name != "Drop", "n")


def test_the_global_set_is_the_job_alerts_and_the_records_they_need(
        global_: dict[str, str], shard: dict[str, str], forwarded: list[str]) -> None:
    templates = {path.name for path in (build.TEMPLATES / build.GLOBAL).glob("*.yml")}
    assert set(global_) == set(tiers.GLOBAL_FILES) | set(tiers.GLOBAL_GROUPS) | templates
    assert set(rules_of(global_["flopwatch-stragglers.yml"])) == {"flopwatch-pipeline"}
    rules = [rule for text in global_.values() for group in rules_of(text).values() for rule in group]
    assert sorted(name for kind, name in rules if kind == "alert") == sorted(tiers.JOB_ALERTS)   # each once
    recorded_here = {name for kind, name in rules if kind == "record"}
    recorded_in_shards = {r[1] for text in shard.values() for group in rules_of(text).values() for r in group}
    raw = re.compile("|".join(render.SERIES.values()))
    for name in forwarded:                 # what a shard writes is what a shard has: raw series or its records
        assert name in ("up", "ALERTS") or raw.fullmatch(name) or name in recorded_in_shards, name
        assert name not in recorded_here, name
    read = set().union(*(tiers.series_in(rule["expr"]) for text in global_.values()
                         for group in yaml.safe_load(text)["groups"] for rule in group["rules"]))
    assert read <= recorded_here | set(forwarded)                   # nothing read is missing from the tier
    # and the report runs there whole: what it reads is forwarded or recorded by the global rules
    assert tiers.report_names() <= recorded_here | set(forwarded)
    # and so do the dashboards whose views cross shards; the node dashboard's own gauges stay home
    assert tiers.dashboard_names(MixinConfig()) <= recorded_here | set(forwarded)
    assert "flopwatch_gpu_memory_used_bytes" not in forwarded
    assert {"flopwatch_gpu_energy_joules_total", "ALERTS"} <= set(forwarded)


def test_forwarded_names_are_what_the_global_rules_and_the_report_read(forwarded: list[str]) -> None:
    assert forwarded == sorted(set(forwarded))
    for name in ("flopwatch_train_model_flops_total", "node_gpu:flopwatch_gpu_utilization_ratio:max",
                 "job_id_gpu:flopwatch_gpu_job_info:max", "job_id_rank:flopwatch_arrival_seconds_per_step:increase2m"):
        assert name in forwarded, name
    for name in ("job_id:flopwatch_mfu:ratio", "job_id:flopwatch_gpus_allocated:count",   # recorded globally
                 "job_id_rank:flopwatch_straggler_corroborated:ratio",                    # a shard's own judgement
                 "by", "on", "sum", "rate", "job_id", "m"):                               # PromQL, not series
        assert name not in forwarded, name
    rules_alone = tiers.global_rule_inputs(MixinConfig())
    assert not [name for name in rules_alone if name.endswith("_bucket")]     # the rules read sums and counts
    assert set(rules_alone) < set(forwarded)


def test_series_in_finds_the_selected_series_only() -> None:
    expr = """
      sum by (job_id) (rate(flopwatch_train_model_flops_total{kind="a:b", job=~"x"}[1m] offset 5m))
      / on (job_id) group_left () job_id:flopwatch_peak_flops:sum > bool 1e-06   # a comment: not_a_series
      and quantile_over_time(0.5, job_id:x:ratio[6h:1m]) unless time() - up @ start() < Inf
    """
    assert tiers.series_in(expr) == {"flopwatch_train_model_flops_total", "job_id:flopwatch_peak_flops:sum",
                                     "job_id:x:ratio", "up"}


def run(*command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_the_built_tiers_pass_promtool_and_vmalert(tmp_path: Path, server_release: str, config: MixinConfig,
                                                   shard: dict[str, str], global_: dict[str, str]) -> None:
    """The files as `rules build` writes them, their relative paths resolved as the servers resolve them."""
    build.write_files(tiers.outputs(config, tmp_path))
    paths = [f"shard/{name}" for name in shard] + [f"global/{name}" for name in global_]
    checked = run(program("promtool"), "check", "rules", *paths, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("SUCCESS") == len(paths)
    topology = tmp_path / "topology"
    checked = run(program("promtool"), "check", "config", "prometheus-shard-1-a.yml", cwd=topology)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(shard)} rule files found" in checked.stdout
    flags = (topology / "vmalert.args").read_text().split()
    dry = run(program("vmalert"), "-dryRun", *flags, "-loggerLevel=ERROR", cwd=topology)
    assert dry.returncode == 0, dry.stderr                       # every flag known, every rule file parsed


def test_prometheus_config_says_what_the_design_says(config: MixinConfig, forwarded: list[str]) -> None:
    settings = tiers.prometheus_config(config, "shard-1", "b", rule_files=["shard/x.yml"],
                                       scrape_configs=[tiers.scrape_job(config, "shard-1")])
    assert settings["global"] == {"scrape_interval": "5s", "evaluation_interval": "15s",
                                  "external_labels": {"cluster": "default", "shard": "shard-1", "replica": "b"}}
    assert settings["rule_files"] == ["shard/x.yml"]
    assert settings["scrape_configs"] == [{"job_name": "flopwatch",
                                           "file_sd_configs": [{"files": ["targets/shard-1.json"]}]}]
    selected = dataclasses.replace(config, selectors=Selectors(agent='job="gpu-agents", env!="dev"'))
    assert tiers.scrape_job(selected, "shard-2")["job_name"] == "gpu-agents"    # the job the rules select
    assert settings["alerting"]["alert_relabel_configs"] == [{"regex": "replica", "action": "labeldrop"}]
    assert settings["alerting"]["alertmanagers"] == [
        {"scheme": "http", "static_configs": [{"targets": ["am-1:9093", "am-3:9093"]}]},
        {"scheme": "https", "path_prefix": "/am", "static_configs": [{"targets": ["am-2:9443"]}]}]
    [remote] = settings["remote_write"]
    assert remote["url"] == WRITE
    assert remote["write_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": "|".join(forwarded), "action": "keep"},
        {"regex": "replica", "action": "labeldrop"}]
    assert remote["queue_config"]["retry_on_http_429"] is True


def test_prometheus_config_refuses_an_unknown_shard_or_replica(config: MixinConfig) -> None:
    with pytest.raises(ValueError, match=r"no shard 'shard-9' in the topology \(shards: shard-1, shard-2\)"):
        tiers.prometheus_config(config, "shard-9", "a", rule_files=[], scrape_configs=[])
    with pytest.raises(ValueError, match=r"shard 'shard-2' has no replica 'a' \(replicas: x\)"):
        tiers.prometheus_config(config, "shard-2", "a", rule_files=[], scrape_configs=[])
    with pytest.raises(ValueError, match="no topology: section"):
        tiers.prometheus_config(MixinConfig(), "shard-1", "a", rule_files=[], scrape_configs=[])


def test_vmalert_and_alertmanager_flags(config: MixinConfig, tmp_path: Path) -> None:
    assert tiers.vmalert_args(config, ["g/a.yml"]) == [
        "-datasource.url=http://vmselect:8481/select/0/prometheus",
        "-remoteRead.url=http://vmselect:8481/select/0/prometheus",
        "-remoteWrite.url=http://vminsert:8480/insert/0/prometheus",          # vmalert appends /api/v1/write
        "-rule.resendDelay=1m",                       # a ticket outlives a 4-minute outage of the store
        "-notifier.url=http://am-1:9093", "-notifier.url=https://am-2:9443/am", "-notifier.url=http://am-3:9093",
        "-rule=g/a.yml"]
    other = tmp_path / "other.yml"
    other.write_text(SECTION.replace(WRITE, "http://receiver:9090/push"))
    flags = tiers.vmalert_args(load(other), [])
    assert "-remoteWrite.url=http://receiver:9090/push" in flags and "-remoteWrite.disablePathAppend" in flags
    assert tiers.alertmanager_args(config, 1, listen="0.0.0.0:9094") == [
        "--cluster.listen-address=0.0.0.0:9094", "--cluster.peer=am-1:9094", "--cluster.peer=am-3:9094"]
    with pytest.raises(ValueError, match=r"no Alertmanager 3 in the topology \(it lists 3, counted from 0\)"):
        tiers.alertmanager_args(config, 3, listen="0.0.0.0:9094")


def test_rules_build_writes_the_tiers_and_checks_them(tmp_path: Path, settings: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fw"
    assert main(["rules", "build", "--config", str(settings), "--out", str(out)]) == 0
    topology = out / "topology"
    assert sorted(path.name for path in topology.iterdir()) == [
        "alertmanager-1.args", "alertmanager-2.args", "alertmanager-3.args", "prometheus-shard-1-a.yml",
        "prometheus-shard-1-b.yml", "prometheus-shard-2-x.yml", "vmalert.args"]
    for path in sorted((out / "shard").glob("*.yml")):
        assert f"../shard/{path.name}" in (topology / "prometheus-shard-2-x.yml").read_text()
    assert (topology / "alertmanager-2.args").read_text() == (
        "--cluster.listen-address=0.0.0.0:9094\n--cluster.peer=am-1:9094\n--cluster.peer=am-3:9094\n")
    assert "-rule=../global/flopwatch-jobs.yml\n" in (topology / "vmalert.args").read_text()
    for name in (ROOT / "alerts").glob("flopwatch-*.yml"):     # the single-Prometheus files stay as shipped
        assert (out / name.name).read_text() == name.read_text(), name.name
    assert main(["rules", "build", "--config", str(settings), "--out", str(out), "--check"]) == 0
    (out / "global" / "flopwatch-jobs.yml").write_text("groups: []\n")
    capsys.readouterr()
    assert main(["rules", "build", "--config", str(settings), "--out", str(out), "--check"]) == 1
    assert "global/flopwatch-jobs.yml" in capsys.readouterr().err


def test_without_a_topology_the_shipped_alerts_are_the_build() -> None:
    assert main(["rules", "build", "--out", str(ROOT / "alerts"), "--check"]) == 0
    assert not [path for path in (ROOT / "alerts").iterdir() if path.name in ("shard", "global", "topology")]
