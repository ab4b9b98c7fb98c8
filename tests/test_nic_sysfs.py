"""Parsing rules for sysfs NIC files, and a device vanishing in the middle of a read.

No InfiniBand hardware here: the inputs are the kernel's documented file formats and a copy of
the recorded tree in tests/fixtures/sysfs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flopwatch.exporters import nic_sysfs
from flopwatch.exporters.nic_sysfs import SysfsReader, Unavailable, parse_rate, parse_state, read_counter

FIXTURE = Path(__file__).parent / "fixtures" / "sysfs"


@pytest.mark.parametrize(("text", "expected"), [
    ("4: ACTIVE", (4, "ACTIVE")), ("1: DOWN", (1, "DOWN")), ("5: LinkUp", (5, "LinkUp")),
    ("3: Disabled", (3, "Disabled")),
])
def test_parse_state(text, expected):
    assert parse_state(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("400 Gb/sec (4X NDR)", 50e9), ("100 Gb/sec (4X EDR)", 12.5e9), ("2.5 Gb/sec (1X SDR)", 312.5e6),
    ("56 Gb/sec (4X FDR)", 7e9),
])
def test_parse_rate_in_bytes_per_second(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["ACTIVE", "x: DOWN", ""])
def test_parse_state_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_state(text)


def test_parse_rate_rejects_garbage():
    with pytest.raises(ValueError):
        parse_rate("fast")


def test_read_counter(tmp_path):
    path = tmp_path / "c"
    path.write_text("12345\n")
    assert read_counter(str(path)) == 12345
    path.write_text("N/A (no PMA)\n")
    with pytest.raises(Unavailable):
        read_counter(str(path))
    path.write_text("twelve\n")
    with pytest.raises(ValueError):
        read_counter(str(path))


def test_device_vanishing_mid_read_is_dropped_without_error(tmp_path, monkeypatch):
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root)
    device = root / "class" / "infiniband" / "mlx5_0"
    real_read = nic_sysfs.read_counter

    def read_and_unplug(path: str) -> float:
        if device.exists() and str(device) in path:
            shutil.rmtree(device)  # the driver unbinds while we are half-way through the port
        return real_read(path)

    monkeypatch.setattr(nic_sysfs, "read_counter", read_and_unplug)
    scan = SysfsReader(str(root)).scan()
    assert scan.errors == 0, scan.problems
    assert {port.device for port in scan.ports} == {"mlx4_0", "mlx5_2"}


def test_net_exclude_is_a_full_match(tmp_path):
    scan = SysfsReader(str(FIXTURE), net_exclude=r"eno.*").scan()
    assert {net.device for net in scan.nets} == {"ens1f0np0", "lo"}
