"""`flopwatch doctor` as a user runs it: a subprocess on the simulated backend and on the test NVML
library (loaded by the real nvidia-ml-py through LD_LIBRARY_PATH), checked through --json and its
exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nvml_driver import DEVICE_NAMES, DriverState, environment

FLOPWATCH = str(Path(sys.executable).parent / "flopwatch")


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in (env or os.environ).items() if not k.startswith("FLOPWATCH_GPU")}
    base.setdefault("FLOPWATCH_ATTRIBUTION_MAPPING_DIR", "none")
    return subprocess.run([FLOPWATCH, "doctor", *args], capture_output=True, text=True, env=base, timeout=120,
                          check=False)


def rows(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    answer = json.loads(result.stdout)
    assert answer["exit_code"] == result.returncode, result.stderr
    return {row["check"]: row for row in answer["checks"]}


@pytest.fixture
def state(tmp_path: Path) -> DriverState:
    return DriverState(tmp_path / "driver", ["H100", "A100"])


def test_simulated_node_reads_every_family_and_exits_0():
    result = doctor("--backend", "sim", "--sim-gpus", "4", "--json")
    assert result.returncode == 0, result.stderr
    found = rows(result)
    assert found["GPU backend"]["detail"] == "sim: 4 GPU(s)"
    assert [found[f"GPU {i}"]["status"] for i in range(4)] == ["ok"] * 4
    assert "989.4 TFLOP/s bf16" in found["GPU 0"]["detail"]
    assert found["GPM activity (SM, tensor, DRAM)"]["status"] == "ok"
    assert "DCGM host engine" not in found   # not asked about on simulated GPUs
    assert found["Slurm mapping directory"]["status"] == "off"


def test_driver_library_node_names_versions_models_and_absent_families(state):
    result = doctor("--backend", "nvml", "--json", env=environment(state.path))
    assert result.returncode == 0, result.stderr
    found = rows(result)
    assert found["driver"]["detail"] == "550.54.15"
    assert found["NVML"]["detail"] == "12.550.54.15"
    assert found["CUDA driver API"]["detail"] == "12.4"
    assert DEVICE_NAMES["H100"] in found["GPU 0"]["detail"] and "989.4 TFLOP/s" in found["GPU 0"]["detail"]
    assert DEVICE_NAMES["A100"] in found["GPU 1"]["detail"] and "312 TFLOP/s" in found["GPU 1"]["detail"]
    gpm = found["GPM activity (SM, tensor, DRAM)"]
    assert (gpm["status"], gpm["detail"]) == ("partial", "GPUs 0 of 2")    # the A100 has no GPM
    for family in ("NVLink counters", "PCIe byte counters", "ECC error counters", "remapped rows", "XID events"):
        assert found[family]["status"] == "ok", family
    assert found["DCGM host engine"]["status"] == "absent"
    assert "NVML is used instead" in found["DCGM host engine"]["detail"]


def test_unsupported_functions_show_as_absent_families(state):
    for index in (0, 1):
        state.set(index, ecc=0)
        state.fail(index, "nvmlDeviceGetRemappedRows", 3)
        state.fail(index, "nvmlDeviceRegisterEvents", 3)
    found = rows(doctor("--backend", "nvml", "--json", env=environment(state.path)))
    for family in ("ECC error counters", "remapped rows", "XID events"):
        assert found[family]["status"] == "absent", family
    assert found["energy counter"]["status"] == "ok"


def test_a_lost_gpu_and_a_hung_gpu_fail_their_rows_and_exit_1(state):
    state.gpus.append(state.gpus[0].__class__("H200"))
    state.write()
    state.lose(1, xid=None)
    state.hang(2, "nvmlDeviceGetPowerUsage", 30)
    env = environment(state.path) | {"FLOPWATCH_GPU_TIMEOUT": "0.3"}
    result = subprocess.run([FLOPWATCH, "doctor", "--backend", "nvml", "--json"], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    state.release()
    assert result.returncode == 1, result.stderr
    found = rows(result)
    assert found["GPU 0"]["status"] == "ok"
    assert found["GPU 1"]["status"] == "fail" and "GPU is lost" in found["GPU 1"]["detail"]
    assert found["GPU 2"]["status"] == "fail" and "gpu.timeout" in found["GPU 2"]["detail"]


def test_no_driver_prints_the_table_and_exits_2():
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    table = doctor("--backend", "nvml", env=env)
    assert table.returncode == 2
    assert table.stdout.rstrip().endswith("exit 2: no GPU backend") and "GPU backend" in table.stdout
    found = rows(doctor("--backend", "nvml", "--json", env=env))
    assert found["GPU backend"]["status"] == "fail"
    assert "libnvidia-ml.so.1) not found" in found["GPU backend"]["detail"]
    assert found["host collector"]["status"] == "ok"   # the rest of the node is still reported


def test_bad_config_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "agent.yml"
    bad.write_text("gpu:\n  timeot: 2\n")
    result = doctor("--config", str(bad))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "gpu.timeot" in result.stderr


def test_help_names_the_exit_codes():
    result = doctor("--help")
    assert result.returncode == 0
    assert "--json" in result.stdout and "Exit 0" in result.stdout
