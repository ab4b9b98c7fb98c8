"""Backend selection: `auto` tries DCGM then NVML; failures end the CLI with one line and exit 2.

No GPU, NVIDIA driver or DCGM exists on this machine. In-process tests put the fakes of
tests/fakes into sys.modules (the seam the backends import through); the CLI tests run the real
`flopwatch agent` in a subprocess against the real nvidia-ml-py, which finds no driver here.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from fakes import fake_dcgm
from fakes.fake_dcgm import FakeHostEngine
from fakes.fake_pynvml import FakeNvml, h100

from flopwatch import config as cfg
from flopwatch.exporters.gpu import dcgm as dcgm_module
from flopwatch.exporters.gpu import xid_events
from flopwatch.exporters.gpu.reading import BackendUnavailable
from flopwatch.exporters.gpu.select import make_backend

TIMEOUT_S = 60


@pytest.fixture
def started(monkeypatch, tmp_path):
    """make_backend() for a backend choice, with DCGM bindings hidden unless a test installs them."""
    monkeypatch.setattr(xid_events, "WAIT_MS", 50)
    monkeypatch.setattr(dcgm_module, "DCGM_BINDINGS", tmp_path / "no-dcgm")
    fake_dcgm.hide(monkeypatch)
    backends = []

    def make(choice: str):
        config = cfg.load(overrides={"backend": choice, "node": "n1"}, environ={})
        backend, count = make_backend(config)
        backends.append(backend)
        return backend, count

    yield make
    for backend in backends:
        backend.stop()


def use_fake_nvml(monkeypatch, count: int = 2) -> FakeNvml:
    nvml = FakeNvml([h100(i) for i in range(count)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_auto_without_dcgm_bindings_falls_back_to_nvml(started, monkeypatch, caplog):
    use_fake_nvml(monkeypatch)
    with caplog.at_level(logging.INFO):
        backend, count = started("auto")
    assert (backend.name, count) == ("nvml", 2)
    assert "DCGM not used (DCGM Python bindings not found" in caplog.text


def test_auto_with_a_silent_host_engine_falls_back_to_nvml(started, monkeypatch):
    nvml = use_fake_nvml(monkeypatch)
    fake_dcgm.install(monkeypatch, FakeHostEngine({0: nvml.gpus[0].uuid}, running=False))
    backend, _ = started("auto")
    assert backend.name == "nvml"
    assert backend.read(0).power_watts == pytest.approx(612.345)


def test_auto_prefers_dcgm_when_it_answers(started, monkeypatch):
    nvml = use_fake_nvml(monkeypatch)
    engine = FakeHostEngine({i: gpu.uuid for i, gpu in enumerate(nvml.gpus)}, values={1: {1004: 0.5}})
    fake_dcgm.install(monkeypatch, engine)
    backend, count = started("auto")
    assert (backend.name, count) == ("dcgm", 2)
    assert backend.read(1).tensor_active == pytest.approx(0.5)


def test_explicit_dcgm_does_not_fall_back(started, monkeypatch):
    use_fake_nvml(monkeypatch)
    with pytest.raises(BackendUnavailable, match=r"DCGM Python bindings not found.*run with --backend nvml"):
        started("dcgm")


def test_explicit_nvml_never_touches_dcgm(started, monkeypatch):
    use_fake_nvml(monkeypatch)
    engine = FakeHostEngine({0: "GPU-x"})
    fake_dcgm.install(monkeypatch, engine)
    backend, _ = started("nvml")
    assert backend.name == "nvml"
    assert engine.connections == 0


def test_no_driver_suggests_the_simulator(started):
    with pytest.raises(BackendUnavailable) as raised:
        started("nvml")  # the real nvidia-ml-py: no libnvidia-ml.so.1 on this machine
    assert "NVIDIA driver library (libnvidia-ml.so.1) not found" in str(raised.value)
    assert str(raised.value).endswith("To try FlopWatch without GPUs, run with --backend sim")


def run_agent(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}
    return subprocess.run([sys.executable, "-m", "flopwatch", "agent", "--listen", "127.0.0.1:0", "--once", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False)


@pytest.mark.parametrize("backend", ["nvml", "auto"])
def test_cli_without_a_driver_exits_2_with_one_line(backend):
    result = run_agent("--backend", backend)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "NVIDIA driver library" in lines[0]
    assert "--backend sim" in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_cli_dcgm_without_dcgm_exits_2_with_one_line():
    result = run_agent("--backend", "dcgm")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "DCGM Python bindings not found" in lines[0] and "--backend nvml" in lines[0]
    assert "Traceback" not in result.stderr
