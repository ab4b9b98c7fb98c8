"""Report settings: prices, the peak dtype, the cluster label, teams and the thresholds the
recommendations are written from. Defaults < the rules' settings (`--rules-config`: the cluster
label and dtype, as the rules and Alertmanager use them) < `--config FILE` (YAML) < flags.

    # report.yml (keys at the top level or under `report:`)
    price_kwh: 0.12            # currency per kWh
    price_gpu_hour: 2.10       # currency per GPU-hour (what a GPU costs whether busy or not)
    currency: "$"
    dtype: bf16                # which flopwatch_gpu_peak_dense_flops is the MFU denominator
    cluster_label: cluster     # the external label that tells clusters apart
    teams: {alice: llm, bob: llm, carol: vision}
    top_jobs_in_charts: 5      # jobs drawn in the MFU chart
    thresholds: {low_mfu: 0.30, min_gpu_hours: 100, idle_share: 0.20, goodput_low: 0.90,
                 lemon_occasions: 2, straggler_excess: 0.03, straggler_min_buckets: 1,
                 busy_utilization: 0.10, step_time_lost: 0.05}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from flopwatch import yamlfile
from flopwatch.hardware import DTYPES


class SettingsError(ValueError):
    """A report setting is wrong; the message names the key and what is expected."""


@dataclass(frozen=True)
class Thresholds:
    low_mfu: float = 0.30             # jobs below this MFU get a recommendation
    min_gpu_hours: float = 100.0      # ... when they used at least this many GPU-hours
    idle_share: float = 0.20          # idle share of GPU-hours worth a recommendation
    goodput_low: float = 0.90         # jobs below this goodput get their largest badput named
    lemon_occasions: int = 2          # separate incident occasions that make a node a lemon
    straggler_excess: float = 0.03    # a rank this much slower than its job's median is straggling
    straggler_min_buckets: int = 1    # ... for at least this many buckets (score path only)
    busy_utilization: float = 0.10    # a GPU counts as busy at this utilization (as the rules do)
    step_time_lost: float = 0.05      # a class of lost step time (worker, stage, scattered) worth naming


@dataclass(frozen=True)
class ReportSettings:
    price_kwh: float | None = None
    price_gpu_hour: float | None = None
    currency: str = "$"
    dtype: str = "bf16"
    cluster_label: str = "cluster"
    teams: dict[str, str] = field(default_factory=dict)
    thresholds: Thresholds = Thresholds()
    top_jobs_in_charts: int = 5     # jobs drawn in the MFU chart, largest first
    workers: int = 4
    timeout: float = 120.0

    def with_overrides(self, **values: Any) -> ReportSettings:
        """Flags over the file: None means "not given"."""
        given = {key: value for key, value in values.items() if value is not None}
        for key in ("price_kwh", "price_gpu_hour"):
            if key in given:
                given[key] = _price(given[key], f"--{key.replace('_', '-')}")
        return replace(self, **given)


def _number(value: Any, where: str, expected: str) -> float:
    """`value` as a float (a number or its text, never a bool), else SettingsError naming `expected`."""
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{where} = {value!r}: expected {expected}") from None


def _price(value: Any, where: str) -> float:
    number = _number(value, where, "a price, e.g. 0.12")
    if not 0 <= number < 1e6:
        raise SettingsError(f"{where} = {value!r}: expected a price from 0 to 1000000")
    return number


def _fraction(value: Any, where: str) -> float:
    number = _number(value, where, "a number from 0 to 1, e.g. 0.3")
    if not 0 <= number <= 1:
        raise SettingsError(f"{where} = {value!r}: expected a number from 0 to 1, e.g. 0.3")
    return number


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingsError(f"{where} = {value!r}: expected a whole number of at least 1")
    return value


_THRESHOLD_PARSERS = {
    "low_mfu": _fraction, "idle_share": _fraction, "goodput_low": _fraction,
    "straggler_excess": _fraction, "busy_utilization": _fraction, "step_time_lost": _fraction,
    "lemon_occasions": _count, "straggler_min_buckets": _count,
}


def _thresholds(data: Any, where: str) -> Thresholds:
    if not isinstance(data, Mapping):
        raise SettingsError(f"{where}: expected a mapping of threshold names to numbers")
    values: dict[str, Any] = {}
    known = [f.name for f in fields(Thresholds)]
    for key, value in data.items():
        if key not in known:
            raise SettingsError(f"{where}.{key}: unknown threshold (known: {', '.join(known)})")
        if key == "min_gpu_hours":
            values[key] = _price(value, f"{where}.{key}")
        else:
            values[key] = _THRESHOLD_PARSERS[key](value, f"{where}.{key}")
    return Thresholds(**values)


def parse(data: Any, source: str = "config") -> ReportSettings:
    """A mapping (the YAML file's content) -> ReportSettings, or one SettingsError."""
    if data is None:
        return ReportSettings()
    if not isinstance(data, Mapping):
        raise SettingsError(f"{source}: expected a mapping of report settings")
    if "report" in data and isinstance(data["report"], Mapping):
        data = data["report"]
    values: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{source}: {key}"
        if key in ("price_kwh", "price_gpu_hour"):
            values[key] = None if value is None else _price(value, where)
        elif key == "currency":
            if not isinstance(value, str) or not 0 < len(value) <= 8:
                raise SettingsError(f"{where} = {value!r}: expected a short currency sign or code, e.g. $ or EUR")
            values[key] = value
        elif key == "dtype":
            if str(value).lower() not in DTYPES:
                raise SettingsError(f"{where} = {value!r}: expected one of {', '.join(DTYPES)}")
            values[key] = str(value).lower()
        elif key == "cluster_label":
            if not isinstance(value, str) or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", value):
                raise SettingsError(f"{where} = {value!r}: expected a Prometheus label name, e.g. cluster")
            values[key] = value
        elif key == "teams":
            if not isinstance(value, Mapping) or not all(isinstance(v, str | int) for v in value.values()):
                raise SettingsError(f"{where}: expected a mapping of user to team, e.g. {{alice: llm}}")
            values[key] = {str(user): str(team) for user, team in value.items()}
        elif key == "thresholds":
            values[key] = _thresholds(value, where)
        elif key == "top_jobs_in_charts":
            values[key] = _count(value, where)
        else:
            known = ("price_kwh, price_gpu_hour, currency, dtype, cluster_label, teams, thresholds, "
                     "top_jobs_in_charts")
            raise SettingsError(f"{where}: unknown setting (known: {known})")
    return ReportSettings(**values)


def load(path: str | Path | None, shared: Mapping[str, Any] | None = None,
         shared_source: str = "rules config") -> ReportSettings:
    """Settings from a YAML file (None: defaults) over `shared`, the settings the report takes from
    the rules' config (cluster_label, dtype) so one file names them for rules and report alike."""
    base = dict(shared or {})
    parse(base, shared_source)          # a bad shared value is named as the rules config's
    if path is None:
        return parse(base)
    path = Path(path)
    try:
        data = yamlfile.load(path, "config file")
    except yamlfile.YamlFileError as error:
        raise SettingsError(str(error)) from None
    if isinstance(data, Mapping) and isinstance(data.get("report"), Mapping):
        data = data["report"]
    if base and (data is None or isinstance(data, Mapping)):
        data = {**base, **(data or {})}
    return parse(data, f"config file {path}")
