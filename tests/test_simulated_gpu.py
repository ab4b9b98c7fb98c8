"""The simulated GPU keeps its telemetry physically consistent under load and faults."""

from __future__ import annotations

import pytest

from flopwatch.exporters.gpu.reading import GpuReadError
from flopwatch.exporters.gpu.simulated import SimulatedGpu, Workload, training_workload
from flopwatch.hardware import model_by_name

H100 = model_by_name("H100-SXM")


def run(gpu: SimulatedGpu, seconds: float, step: float = 5.0) -> None:
    for _ in range(int(seconds / step)):
        gpu.advance(step)


def busy_gpu(seed: int = 0) -> SimulatedGpu:
    gpu = SimulatedGpu(0, H100, seed)
    gpu.workload = training_workload(H100)
    run(gpu, 300)
    return gpu


def test_idle_gpu_is_cool_slow_and_says_idle():
    gpu = SimulatedGpu(0, H100, 0)
    run(gpu, 300)
    reading = gpu.reading()
    assert reading.clock_events["idle"] is True
    assert reading.sm_clock_hz == H100.sm_clock_idle_mhz * 1e6
    assert reading.power_watts < 100
    assert reading.tensor_active == 0


def test_busy_gpu_draws_power_heats_and_runs_tensor_cores():
    reading = busy_gpu().reading()
    assert reading.clock_events == {r: False for r in reading.clock_events}
    assert reading.sm_clock_hz == H100.sm_clock_max_mhz * 1e6
    assert 400 < reading.power_watts <= H100.power_limit_watts
    assert 55 <= reading.temperature_c < 85
    assert reading.tensor_active > 0.3


@pytest.mark.parametrize(
    ("fault", "slowdown", "reasons"),
    [
        ("thermal", 0.08, {"sw_thermal"}),
        ("thermal", 0.2, {"sw_thermal", "hw_thermal"}),
        ("hw_slowdown", 0.1, {"hw_slowdown"}),
        ("power_cap", 0.1, {"sw_power_cap"}),
    ],
)
def test_throttle_faults_lower_clock_with_matching_reasons(fault, slowdown, reasons):
    gpu = busy_gpu()
    healthy = gpu.reading()
    setattr(gpu.faults, fault, slowdown)
    run(gpu, 300)
    reading = gpu.reading()
    assert reading.sm_clock_hz == pytest.approx(healthy.sm_clock_hz * (1 - slowdown))
    assert gpu.speed() == pytest.approx(1 - slowdown)
    assert {r for r, active in reading.clock_events.items() if active} == reasons
    if fault == "thermal":
        assert reading.temperature_c >= 87
        assert reading.violation_seconds["thermal"] > 0
    if fault == "power_cap":
        assert reading.power_limit_watts < H100.power_limit_watts
        assert reading.power_watts <= reading.power_limit_watts
        assert reading.violation_seconds["power"] > 0


def test_counters_only_grow():
    gpu = busy_gpu()
    gpu.faults.nvlink_errors_per_s = 2
    gpu.faults.pcie_replays_per_s = 1
    previous = gpu.reading()
    for _ in range(20):
        gpu.advance(5)
        reading = gpu.reading()
        for attr in ("energy_joules", "pcie_tx_bytes", "pcie_rx_bytes", "pcie_replays", "ecc_corrected"):
            assert getattr(reading, attr) >= getattr(previous, attr)
        for before, after in zip(previous.nvlinks, reading.nvlinks, strict=True):
            assert after.tx_bytes >= before.tx_bytes
            for error in before.errors:
                assert after.errors[error] >= before.errors[error]
        previous = reading
    assert previous.nvlinks[0].errors["replay"] > 0
    assert previous.nvlinks[1].errors["replay"] == 0
    assert previous.pcie_replays > 0


def test_energy_is_power_integrated_over_time():
    gpu = busy_gpu()
    before = gpu.reading().energy_joules
    gpu.advance(10)
    reading = gpu.reading()
    assert reading.energy_joules - before == pytest.approx(reading.power_watts * 10, rel=1e-3)


def test_pcie_downgrade_reports_width_and_cuts_throughput():
    gpu = busy_gpu()
    a = gpu.reading().pcie_tx_bytes
    gpu.advance(10)
    healthy_rate = (gpu.reading().pcie_tx_bytes - a) / 10
    gpu.faults.pcie_width = 4
    b = gpu.reading().pcie_tx_bytes
    gpu.advance(10)
    reading = gpu.reading()
    assert reading.pcie_width == 4 and reading.pcie_max_width == 16
    assert (reading.pcie_tx_bytes - b) / 10 < healthy_rate / 3


def test_xid_79_loses_the_gpu_until_restored():
    gpu = busy_gpu()
    gpu.inject_xid(79)
    with pytest.raises(GpuReadError) as caught:
        gpu.reading()
    assert caught.value.cause == "gpu_lost"
    gpu.restore()
    assert gpu.reading().utilization > 0


def test_deterministic_for_a_seed():
    a, b = busy_gpu(seed=5), busy_gpu(seed=5)
    assert a.reading() == b.reading()
    assert busy_gpu(seed=6).reading().power_watts != a.reading().power_watts


def test_per_link_or_summed_nvlink():
    gpu = busy_gpu()
    per_link = gpu.reading(nvlink_per_link=True).nvlinks
    summed = gpu.reading(nvlink_per_link=False).nvlinks
    assert len(per_link) == H100.nvlink_links == 18
    assert [link.link for link in summed] == ["all"]
    assert summed[0].tx_bytes == pytest.approx(sum(link.tx_bytes for link in per_link), rel=1e-6)


def test_workload_memory_and_processes():
    gpu = SimulatedGpu(0, H100, 0)
    gpu.workload = Workload(busy=0.9, tensor=0.4, memory_fraction=0.5)
    gpu.advance(1)
    reading = gpu.reading()
    assert reading.memory_used_bytes == pytest.approx(0.5 * H100.memory_bytes, rel=1e-6)
    assert reading.memory_total_bytes == H100.memory_bytes
