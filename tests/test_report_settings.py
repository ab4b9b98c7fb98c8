"""Report settings: defaults < --config FILE < flags, and one clear error per wrong value."""

from __future__ import annotations

import pytest

from flopwatch.mixin.config import MixinConfig
from flopwatch.report.settings import ReportSettings, SettingsError, Thresholds, load, parse


def test_defaults():
    settings = ReportSettings()
    assert settings.price_kwh is None and settings.price_gpu_hour is None
    assert settings.dtype == "bf16" and settings.cluster_label == "cluster"
    assert settings.thresholds == Thresholds()


def test_a_config_file_under_report_or_at_the_top(tmp_path):
    path = tmp_path / "report.yml"
    path.write_text("report:\n  price_kwh: 0.2\n  currency: EUR\n  teams: {alice: llm}\n"
                    "  thresholds: {low_mfu: 0.25, lemon_occasions: 3}\n")
    settings = load(path)
    assert settings.price_kwh == 0.2 and settings.currency == "EUR" and settings.teams == {"alice": "llm"}
    assert settings.thresholds.low_mfu == 0.25 and settings.thresholds.lemon_occasions == 3
    assert settings.thresholds.idle_share == Thresholds().idle_share
    assert parse({"dtype": "FP8", "cluster_label": "site"}).dtype == "fp8"
    assert parse({"top_jobs_in_charts": 2}).top_jobs_in_charts == 2


def test_the_rules_settings_under_the_file(tmp_path):
    shared = {"cluster_label": "site", "dtype": "fp16"}
    assert (load(None, shared).cluster_label, load(None, shared).dtype) == ("site", "fp16")
    path = tmp_path / "report.yml"
    path.write_text("report:\n  dtype: fp8\n")
    assert (load(path, shared).cluster_label, load(path, shared).dtype) == ("site", "fp8")
    with pytest.raises(SettingsError, match=r"rules config fw\.yml: dtype = 'int4'"):
        load(path, {"dtype": "int4"}, "rules config fw.yml")


def test_the_default_cluster_label_is_the_rules_default():
    assert ReportSettings().cluster_label == MixinConfig().labels.cluster


def test_flags_win_over_the_file(tmp_path):
    path = tmp_path / "report.yml"
    path.write_text("price_kwh: 0.2\nprice_gpu_hour: 3\n")
    settings = load(path).with_overrides(price_kwh="0.1", price_gpu_hour=None)
    assert settings.price_kwh == 0.1 and settings.price_gpu_hour == 3.0


@pytest.mark.parametrize(("data", "message"), [
    ({"price_kwh": "cheap"}, "price_kwh = 'cheap': expected a price"),
    ({"price_kwh": -1}, "expected a price from 0"),
    ({"colour": "blue"}, "colour: unknown setting"),
    ({"dtype": "int4"}, "expected one of bf16"),
    ({"cluster_label": "my-cluster"}, "expected a Prometheus label name"),
    ({"thresholds": {"low_mfu": 30}}, "thresholds.low_mfu = 30: expected a number from 0 to 1"),
    ({"thresholds": {"lemons": 2}}, "thresholds.lemons: unknown threshold"),
    ({"thresholds": {"lemon_occasions": 0}}, "expected a whole number of at least 1"),
    ({"teams": ["alice"]}, "expected a mapping of user to team"),
    (["price_kwh"], "expected a mapping of report settings"),
])
def test_bad_settings_name_the_key(data, message):
    with pytest.raises(SettingsError, match=message):
        parse(data)


def test_bad_flags_and_files(tmp_path):
    with pytest.raises(SettingsError, match="--price-kwh = 'x'"):
        ReportSettings().with_overrides(price_kwh="x")
    with pytest.raises(SettingsError, match="cannot read it"):
        load(tmp_path / "missing.yml")
    broken = tmp_path / "broken.yml"
    broken.write_text("price_kwh: [\n")
    with pytest.raises(SettingsError, match="not valid YAML at line"):
        load(broken)
