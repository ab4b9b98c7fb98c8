"""The mixin: settings load with one-line errors naming file and line, defaults.yml documents the
dataclasses' defaults, templates render (selectors, filters, plain copies), and `flopwatch rules
build` with the defaults reproduces the shipped alerts/ and dashboards/ exactly (the drift test)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from flopwatch.cli import main
from flopwatch.config import ConfigError
from flopwatch.mixin import build, names, render
from flopwatch.mixin.config import MixinConfig, Selectors, as_dict, duration_seconds, load

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ROOT / "flopwatch" / "mixin" / "defaults.yml"


def test_defaults_file_is_the_dataclass_defaults() -> None:
    assert load(DEFAULTS) == MixinConfig()
    assert yaml.safe_load(DEFAULTS.read_text()) == as_dict(MixinConfig())


def test_a_partial_file_overrides_only_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "fw.yml"
    path.write_text('selectors:\n  agent: job="gpu-agents"\njobs:\n  goodput_low:\n    target: 0.7\n    for: 1m30s\n')
    config = load(path)
    assert config.selectors.agent == 'job="gpu-agents"'
    assert (config.jobs.goodput_low.target, config.jobs.goodput_low.for_) == (0.7, "1m30s")
    assert config.jobs.goodput_low.window == MixinConfig().jobs.goodput_low.window
    assert dataclasses.replace(config, selectors=Selectors(), jobs=MixinConfig().jobs) == MixinConfig()


@pytest.mark.parametrize(("text", "message"), [
    ("jobs:\n  goodput_lo: {target: 0.7}\n", "fw.yml:2: unknown setting 'jobs.goodput_lo'"),
    ("agent:\n  down_for: 2 minutes\n", "fw.yml:2: agent.down_for: expected a Prometheus duration"),
    ("gpu:\n  lost_for: 1.5m\n", "fw.yml:2: gpu.lost_for: expected a Prometheus duration"),
    ("selectors:\n  agent: job=flopwatch\n", "fw.yml:2: selectors.agent: expected label matchers"),
    ("dtype: BF 16\n", "fw.yml:1: dtype: expected a dtype label value"),
    ("labels:\n  cluster: my-cluster\n", "fw.yml:2: labels.cluster: expected a label name"),
    ("labels:\n  cluster: node\n", "fw.yml:2: labels.cluster: expected a label name of letters, digits and "
     "underscores, like cluster, that FlopWatch's series do not carry already"),
    ("network:\n\n  flapping_downs: 2.5\n", "fw.yml:3: network.flapping_downs: expected a whole number"),
    ("stragglers:\n  min_ranks: [8]\n", "fw.yml:2: stragglers.min_ranks: expected a single value"),
    ("urls:\n  runbooks: wiki/runbooks\n", "fw.yml:2: urls.runbooks: expected an absolute http(s):// URL"),
    ("jobs: 3\n", "fw.yml:1: jobs: expected a mapping"),
    ("jobs:\n  stalled: {for: 1m\n", "fw.yml:3: not valid YAML"),
])
def test_a_wrong_setting_is_one_line_with_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "fw.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load(path)
    assert str(error.value).startswith(f"{tmp_path}/{message}"), str(error.value)
    assert "\n" not in str(error.value)


def test_durations_follow_prometheus_grammar() -> None:
    assert [duration_seconds(d) for d in ("30s", "1m30s", "6h", "1d", "1w", "500ms")] == \
        [30, 90, 21600, 86400, 604800, 0.5]
    for bad in ("", "5", "1.5m", "30 s", "m", "1s1m"):
        with pytest.raises(ValueError):
            duration_seconds(bad)


def test_words_and_percentages_read_as_annotations_write_them() -> None:
    assert [render.words(d) for d in ("15m", "1m", "30s", "1m30s", "2h")] == \
        ["15 minutes", "1 minute", "30 seconds", "1 minute 30 seconds", "2 hours"]
    assert [render.percent(v) for v in (0.85, 0.8, 0.1, 0.025)] == ["85%", "80%", "10%", "2.5%"]
    assert [render.number(v) for v in (120.0, 0.85, 8, 1e-6)] == ["120", "0.85", "8", "1e-06"]


def _selected(agent: str, dcgm: str = "") -> MixinConfig:
    return MixinConfig(selectors=Selectors(agent=agent, dcgm=dcgm))


def test_selectors_reach_raw_series_only() -> None:
    text = "\n".join([
        "# flopwatch_gpu_up in a comment stays",
        "expr: max by (node) (flopwatch_gpu_up) or node_gpu:flopwatch_gpu_up:dcgm",
        'expr: rate(flopwatch_nic_port_errors_total{counter="symbol_error"}[2m]) + DCGM_FI_DEV_SM_CLOCK',
        '{{ with printf "count(flopwatch_gpu_job_info{job_id=\'%s\'})" $labels.job_id | query }}',
    ])
    out = render.add_selectors(text, _selected('job="fw", env=~"prod|stage"', 'job="dcgm"')).split("\n")
    assert out[0] == "# flopwatch_gpu_up in a comment stays"
    assert out[1] == ("expr: max by (node) (flopwatch_gpu_up{job='fw',env=~'prod|stage'}) "
                      "or node_gpu:flopwatch_gpu_up:dcgm")
    assert out[2] == ("expr: rate(flopwatch_nic_port_errors_total{job='fw',env=~'prod|stage',counter=\"symbol_error\"}"
                      "[2m]) + DCGM_FI_DEV_SM_CLOCK{job='dcgm'}")
    assert out[3] == ("{{ with printf \"count(flopwatch_gpu_job_info{job='fw',env=~'prod|stage',job_id='%s'})\" "
                      "$labels.job_id | query }}")
    assert render.add_selectors(text, MixinConfig()) == text


def test_test_inputs_carry_the_selector_labels() -> None:
    text = ("      - series: 'flopwatch_gpu_up{node=\"n0\",instance=\"n0:9400\",job=\"flopwatch\"}'\n"
            "        expr: flopwatch_gpu_up{job=\"flopwatch\"}\n")
    out = render.label_inputs(text, _selected('job="gpu-agents", env!="dev"'))
    first = "      - series: 'flopwatch_gpu_up{job=\"gpu-agents\",node=\"n0\",instance=\"n0:9400\"}'"
    assert out.split("\n")[0] == first
    assert out.split("\n")[1] == text.split("\n")[1]


def test_a_plain_template_is_copied_with_the_generated_header(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    plain = "groups:\n  - name: x\n    rules:\n      - record: a:b:c\n        expr: sum(up)\n"
    (tmp_path / "flopwatch-new.yml").write_text(plain)
    out = build.rules(MixinConfig(), templates=tmp_path)
    assert out == {"flopwatch-new.yml": render.generated_header("flopwatch-new.yml") + plain}


def test_a_broken_template_names_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text("groups:\n  - name: [[ c.nothing_here ]]\n  [% if %]\n")
    with pytest.raises(ValueError, match=r"templates/bad.yml:3: "):
        build.rules(MixinConfig(), templates=tmp_path)


def test_generated_files_say_so_on_their_first_line() -> None:
    for name, text in build.rules(MixinConfig()).items():
        first = text.split("\n", 1)[0]
        assert "GENERATED by " in first, name
        assert f"flopwatch/mixin/templates/{name}" in first or "make_rules.py" in first, name


def test_the_shipped_alerts_and_dashboards_are_the_build_of_the_defaults() -> None:
    stale = build.stale(MixinConfig(), ROOT / "alerts", ROOT / "dashboards")
    assert not stale, (f"{[str(p.relative_to(ROOT)) for p in stale]} differ from the templates: edit "
                       "flopwatch/mixin/templates/ and run `flopwatch rules build --out alerts`")


def test_built_rules_define_every_named_alert_and_contract_record() -> None:
    alerts, records = set(), set()
    for name, text in build.rules(MixinConfig()).items():
        if name.startswith(("tests/", "templates/")) or name == "alertmanager.yml":
            continue
        for group in yaml.safe_load(text)["groups"]:
            alerts |= {rule["alert"] for rule in group["rules"] if "alert" in rule}
            records |= {rule["record"] for rule in group["rules"] if "record" in rule}
    assert alerts == set(names.ALERTS), "alert names live in flopwatch/mixin/names.py"
    assert records >= set(names.CONTRACT_RECORDS)


def test_rules_build_check_passes_on_the_repository_and_fails_on_a_bad_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "build", "--out", str(ROOT / "alerts"), "--check"]) == 0
    bad = tmp_path / "fw.yml"
    bad.write_text("gpu:\n  lost_for: soon\n")
    capsys.readouterr()
    assert main(["rules", "build", "--config", str(bad), "--out", str(tmp_path / "alerts")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"flopwatch rules: {bad}:2: gpu.lost_for: expected a Prometheus duration like 30s, 5m, " \
                  "1m30s or 6h, got 'soon'"
    assert not (tmp_path / "alerts").exists()



def _flat(settings: dict, prefix: str = "") -> list[tuple[str, object]]:
    return [pair for name, value in settings.items()
            for pair in (_flat(value, f"{prefix}{name}.") if isinstance(value, dict) else [(f"{prefix}{name}", value)])]


def test_every_setting_is_documented_with_its_default() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key, value in _flat(as_dict(MixinConfig())):
        shown = '`""`' if value == "" else f"`{render.number(value) if isinstance(value, float) else value}`"
        assert f"| `{key}` | {shown}" in text, f"docs/configuration.md: no row for {key} with its default {shown}"


def test_rules_defaults_prints_a_file_that_loads_as_the_defaults(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["rules", "defaults"]) == 0
    path = tmp_path / "fw.yml"
    path.write_text(capsys.readouterr().out.replace("dtype: bf16", "dtype: fp8"))
    assert load(path) == dataclasses.replace(MixinConfig(), dtype="fp8")
    monkeypatch.setenv("FLOPWATCH_RULES_CONFIG", str(path))         # the environment names the file
    assert main(["rules", "build", "--out", str(tmp_path / "alerts")]) == 0
    assert 'dtype="fp8"' in (tmp_path / "alerts" / "flopwatch-mfu.yml").read_text()
