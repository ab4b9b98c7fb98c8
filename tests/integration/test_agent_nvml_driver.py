"""`flopwatch agent --backend nvml` as users run it, on the driver-shaped libnvidia-ml.so.1, under Prometheus.

The agent subprocess loads the real nvidia-ml-py, which finds the test library through
LD_LIBRARY_PATH (8 H100s from a state file); a real Prometheus scrapes it. The family, label and
promtool checks are the simulated backend's own (tests/integration/test_agent_prometheus.py),
run here against this agent; then a GPU falls off the bus while Prometheus watches. Once on each
Prometheus release (Debian's 2.42 and the current 3.x), each with a driver of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nvml_driver import DriverState, environment

from flopwatch.promql import PromClient
from flopwatch.stack import AgentProcess
from integration import test_agent_prometheus as sim_checks

pytestmark = pytest.mark.integration

JOB, NODE, GPUS = sim_checks.JOB, sim_checks.NODE, sim_checks.GPUS


class NvmlAgentProcess(AgentProcess):
    """The same agent process, on the NVML backend instead of the simulator."""

    def args(self) -> list[str]:
        return ["agent", "--backend", "nvml", "--interval", f"{self.interval:g}", "--node", self.node,
                "--listen", f"{self.host}:{self.port}", *self.extra]


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory, server_release: str) -> DriverState:
    """A new driver for each Prometheus release: the last test takes a GPU off the bus."""
    return DriverState(tmp_path_factory.mktemp(f"nvml-driver-{server_release}"), ["H100"] * GPUS)


@pytest.fixture(scope="module")
def agent(state: DriverState) -> Iterator[AgentProcess]:
    with pytest.MonkeyPatch.context() as patch:   # the child inherits this environment
        for key, value in environment(state.path).items():
            patch.setenv(key, value)
        process = NvmlAgentProcess(node=NODE).start()
    try:
        yield process
    finally:
        process.stop()


#: the simulated backend's Prometheus fixture, scraping this module's agent
prometheus = sim_checks.prometheus


def test_prometheus_has_every_family_for_every_gpu(prometheus: PromClient) -> None:
    sim_checks.test_prometheus_has_every_family_for_every_gpu(prometheus)


def test_series_carry_exactly_the_catalogue_labels(prometheus: PromClient, agent: AgentProcess) -> None:
    sim_checks.test_series_carry_exactly_the_catalogue_labels(prometheus, agent)


def test_prometheus_holds_exactly_what_the_agent_exposes(prometheus: PromClient, agent: AgentProcess) -> None:
    sim_checks.test_prometheus_holds_exactly_what_the_agent_exposes(prometheus, agent)


def test_promtool_check_metrics_prints_nothing(agent: AgentProcess, server_release: str) -> None:
    sim_checks.test_promtool_check_metrics_prints_nothing(agent, server_release)


def test_values_are_the_drivers_in_base_units(prometheus: PromClient) -> None:
    info = prometheus.query(f'flopwatch_build_info{{job="{JOB}"}}')
    assert [s.labels["backend"] for s in info] == ["nvml"]
    assert info[0].labels["python"] == sys.version.split()[0]
    peaks = prometheus.query(f'flopwatch_gpu_peak_dense_flops{{job="{JOB}",dtype="bf16"}}')
    assert sorted(s.value for s in peaks) == [989.4e12] * GPUS
    memory = prometheus.query(f'flopwatch_gpu_memory_total_bytes{{job="{JOB}"}}')
    assert sorted(s.value for s in memory) == [85_520_809_984] * GPUS
    links = prometheus.query(f'count by (gpu) (flopwatch_gpu_nvlink_bytes_total{{job="{JOB}",direction="tx"}})')
    assert sorted(s.value for s in links) == [18] * GPUS
    tensor = prometheus.query(f'flopwatch_gpu_tensor_active_ratio{{job="{JOB}"}}')
    assert sorted(round(s.value, 6) for s in tensor) == [0.5] * GPUS   # GPM over 1 s intervals
    rate = f'deriv(flopwatch_gpu_energy_joules_total{{job="{JOB}",gpu="0"}}[10s])'  # slope, no extrapolation
    deadline = time.monotonic() + 20
    while not prometheus.query(rate) and time.monotonic() < deadline:  # a rate needs two scrapes
        time.sleep(0.5)
    energy = prometheus.query(rate)
    assert energy and energy[0].value == pytest.approx(612.5, rel=0.1)  # J/s = the 612.5 W drawn


def test_a_gpu_that_falls_off_the_bus_goes_down_alone_with_its_xid(prometheus: PromClient, state: DriverState,
                                                                    agent: AgentProcess) -> None:
    state.lose(3)   # XID 79 through the event set, then GPU_IS_LOST from every call on it

    def seen() -> bool:
        down = prometheus.query(f'flopwatch_gpu_up{{job="{JOB}",gpu="3"}} == 0')
        xid = prometheus.query(f'flopwatch_gpu_xid_errors_total{{job="{JOB}",gpu="3",xid="79"}}')
        return bool(down) and bool(xid)

    deadline = time.monotonic() + 20
    while not seen() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert seen(), agent.log_tail(30)
    up = prometheus.query(f'flopwatch_gpu_up{{job="{JOB}",gpu!="3"}}')
    assert sorted(s.value for s in up) == [1.0] * (GPUS - 1)
    lost = prometheus.query(f'flopwatch_gpu_read_errors_total{{job="{JOB}",gpu="3",error="gpu_lost"}}')
    assert lost and lost[0].value >= 1
    assert "Traceback" not in Path(agent.log_path).read_text()
