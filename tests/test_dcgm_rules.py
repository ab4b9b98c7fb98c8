"""flopwatch/mixin/templates/flopwatch-dcgm.yml is what deploy/dcgm-exporter/make_rules.py renders from
flopwatch/hardware.py, its model patterns pick the same model as flopwatch.hardware does for dcgm-exporter's `modelName`
values, and the shipped counters file turns on every DCGM field the rules read."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from flopwatch import hardware

ROOT = Path(__file__).resolve().parents[1]
COUNTERS = ROOT / "deploy" / "dcgm-exporter" / "flopwatch-counters.csv"


def make_rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_rules", ROOT / "deploy" / "dcgm-exporter" / "make_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_committed_template_is_the_rendered_one() -> None:
    """The template is the script's output; alerts/flopwatch-dcgm.yml is the build's (tests/test_mixin.py)."""
    assert (ROOT / "flopwatch" / "mixin" / "templates" / "flopwatch-dcgm.yml").read_text() == make_rules().render(), \
        "flopwatch/mixin/templates/flopwatch-dcgm.yml is stale: run .venv/bin/python deploy/dcgm-exporter/make_rules.py"


@pytest.mark.parametrize("model_name", [
    "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB",
    "NVIDIA B200", "NVIDIA GB200", "NVIDIA A100 80GB PCIe",
])
def test_promql_model_match_agrees_with_the_hardware_table(model_name: str) -> None:
    """The label_replace chain: the last rule applied is the first model, so the first match wins."""
    chosen = None
    for model in reversed(hardware.MODELS):
        if re.fullmatch(f"(?i).*(?:{'|'.join(model.patterns)}).*", model_name):
            chosen = model.name
    expected = hardware.match_device_name(model_name)
    assert chosen == (expected.name if expected else None)


def test_counters_file_turns_on_every_field_the_rules_read() -> None:
    rules = (ROOT / "alerts" / "flopwatch-dcgm.yml").read_text()
    used = set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+", rules))
    rows = [line.split(",") for line in COUNTERS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    enabled = {row[0].strip(): row[1].strip() for row in rows}
    assert used <= set(enabled), used - set(enabled)
    assert all(kind in ("gauge", "counter", "label") for kind in enabled.values())
    assert all(len(row) >= 3 and row[2].strip() for row in rows), "every row: field, type, help"
