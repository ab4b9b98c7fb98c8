"""bench/device_check.py end to end on a machine without a GPU: it says so, runs doctor and the agent
on the test NVML library, and FlopWatch's telemetry MFU and energy come back as the library was told."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_device_check_runs_end_to_end_on_the_test_library(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.device_check", "--duration", "8", "--sizes", "128,256",
                             "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=240,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no GPU here; running against the test NVML library" in result.stderr
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["mode"] == "driver-library"
    assert report["doctor_exit"] == 0 and report["families"]["GPM activity (SM, tensor, DRAM)"] == "ok"
    assert report["peak_flops"] == 989.4e12
    assert [p["size"] for p in report["phases"]] == [128, 256]
    for phase in report["phases"]:
        assert phase["gemms"] > 0 and phase["measured_flops"] > 0
        assert phase["samples"] >= 1
        assert abs(phase["telemetry_mfu"] - phase["injected_mfu"]) * 100 <= 2.0, phase
    assert report["energy_counter_j"] == pytest.approx(report["energy_integrated_j"], rel=0.05)
    table = (tmp_path / "device_check.md").read_text()
    assert "No GPU: telemetry came from the test NVML library" in table and "| 256 |" in table
