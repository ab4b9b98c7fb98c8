"""The node agent as users run it (`flopwatch agent`, a real subprocess) under a real Prometheus.

Only the GPUs are simulated (`--backend sim`: no GPU, NVML or DCGM can run here); the console
script, its HTTP server, config handling and signal handling are the real ones, and Prometheus and
promtool scrape and check what it serves on 127.0.0.1, in both releases FlopWatch supports
(`server_release`: Debian's Prometheus 2.42 and the current upstream one, which refuses a scrape
whose Content-Type it cannot parse).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flopwatch.catalog import Metric, by_name, metrics_of
from flopwatch.catalog import agent as agent_catalog
from flopwatch.catalog import gpu as gpu_catalog
from flopwatch.promql import PromClient
from flopwatch.stack import AgentProcess, Prometheus, free_port, releases
from flopwatch.stack.servers import scrape_job

pytestmark = pytest.mark.integration

FLOPWATCH = str(Path(sys.executable).parent / "flopwatch")
GPUS = 8
NODE = "it-node"
JOB = "flopwatch-agent"
#: Families that only appear after something goes wrong (a failed GPU read, an XID event):
#: healthy simulated GPUs have nothing to count, and the collector leaves empty families out.
EVENT_ONLY = {gpu_catalog.READ_ERRORS.name, gpu_catalog.XID_ERRORS.name,
              # counted only when a TLS web config is in use (tests/integration/test_agent_tls.py)
              agent_catalog.HTTP_TLS_FAILURES.name}
EXPECTED = [metric for metric in metrics_of(gpu_catalog) + metrics_of(agent_catalog) if metric.name not in EVENT_ONLY]


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read()


def series_of(exposition: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    return {
        (sample.name, frozenset(sample.labels.items()))
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    with AgentProcess(node=NODE) as process:
        yield process


@pytest.fixture(scope="module")
def prometheus(agent: AgentProcess, server_release: str) -> Iterator[PromClient]:
    target = f"127.0.0.1:{agent.port}"
    with Prometheus([scrape_job(JOB, [target], interval="1s")]) as server:
        client = PromClient(server.url)
        wanted = {metric.name for metric in EXPECTED}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            names = {s.labels["__name__"] for s in client.query(f'{{job="{JOB}",__name__=~"flopwatch_.+"}}')}
            if wanted <= names:
                break
            time.sleep(0.5)
        yield client


def test_prometheus_has_every_family_for_every_gpu(prometheus: PromClient) -> None:
    found: dict[str, list[dict[str, str]]] = {}
    for sample in prometheus.query(f'{{job="{JOB}",__name__=~"flopwatch_.+"}}'):
        found.setdefault(sample.labels["__name__"], []).append(sample.labels)
    missing = sorted(metric.name for metric in EXPECTED if metric.name not in found)
    assert not missing, f"Prometheus has no series for {missing}"
    for metric in EXPECTED:
        if "gpu" in metric.labels:
            gpus = {labels["gpu"] for labels in found[metric.name]}
            assert gpus == {str(i) for i in range(GPUS)}, f"{metric.name}: GPUs {sorted(gpus)}"


def catalogued(name: str) -> tuple[Metric, set[str]]:
    """The catalogue entry a stored series belongs to, and the labels its sample type adds."""
    catalogue = by_name()
    if name in catalogue:
        return catalogue[name], set()
    for suffix, extra in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
        base = catalogue.get(name.removesuffix(suffix))
        if name.endswith(suffix) and base is not None and base.type == "histogram":
            return base, extra
    raise AssertionError(f"{name} is not in the catalogue")


def test_series_carry_exactly_the_catalogue_labels(prometheus: PromClient, agent: AgentProcess) -> None:
    """Every flopwatch_ series the agent exposes (GPU, and whatever else it collects on this host)."""
    samples = prometheus.query(f'{{job="{JOB}",__name__=~"flopwatch_.+"}}')
    assert samples
    for sample in samples:
        labels = dict(sample.labels)
        name = labels.pop("__name__")
        metric, extra = catalogued(name)
        assert set(labels) == {*metric.all_labels, *extra, "job", "instance"}, f"{name}: labels {sorted(labels)}"
        assert labels["node"] == NODE
        assert labels["instance"] == f"127.0.0.1:{agent.port}"


def test_prometheus_holds_exactly_what_the_agent_exposes(prometheus: PromClient, agent: AgentProcess) -> None:
    exposed = series_of(fetch(agent.url + "/metrics").decode())
    stored = set()
    for sample in prometheus.query(f'{{job="{JOB}",__name__=~"flopwatch_.+"}}'):
        labels = dict(sample.labels)
        name = labels.pop("__name__")
        labels.pop("job"), labels.pop("instance")
        stored.add((name, frozenset(labels.items())))
    assert stored == exposed


def test_values_match_the_simulated_model(prometheus: PromClient) -> None:
    peaks = prometheus.query(f'flopwatch_gpu_peak_dense_flops{{job="{JOB}",dtype="bf16"}}')
    assert sorted(s.value for s in peaks) == [989.4e12] * GPUS
    memory = prometheus.query(f'flopwatch_gpu_memory_total_bytes{{job="{JOB}"}}')
    assert sorted(s.value for s in memory) == [80 * 1024**3] * GPUS
    links = prometheus.query(f'count by (gpu) (flopwatch_gpu_nvlink_bytes_total{{job="{JOB}",direction="tx"}})')
    assert sorted(s.value for s in links) == [18] * GPUS  # H100 SXM: 18 NVLink links, per link
    up = prometheus.query(f'flopwatch_gpu_up{{job="{JOB}"}}')
    assert [s.value for s in up] == [1.0] * GPUS


def test_promtool_check_metrics_prints_nothing(agent: AgentProcess, server_release: str) -> None:
    promtool = releases.binary("promtool")
    body = fetch(agent.url + "/metrics")
    assert b"flopwatch_gpu_up" in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30, check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, b"")


def test_sigterm_stops_the_agent_with_exit_0_and_nothing_left() -> None:
    process = AgentProcess(node=NODE).start()
    assert process.proc is not None
    pid = process.proc.pid
    try:
        children = psutil.Process(pid).children(recursive=True)
        os.kill(pid, signal.SIGTERM)
        code = process.proc.wait(timeout=15)
        log = process.log_tail(200)
    finally:
        process.stop()
    assert code == 0, log
    assert "serving http://127.0.0.1" in log and "stopping" in log
    assert "Traceback" not in log
    assert not psutil.pid_exists(pid)
    assert not [child.pid for child in children if child.is_running()]
    with pytest.raises(ConnectionRefusedError):  # nothing listens on its port any more
        socket.create_connection(("127.0.0.1", process.port), timeout=5).close()


def run_agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("FLOPWATCH_")}
    environ.update(env or {})
    return subprocess.run(
        [FLOPWATCH, "agent", "--backend", "sim", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    return lines[0]


def test_interval_not_a_number_exits_2_naming_the_key() -> None:
    result = run_agent("--interval", "abc", "--listen", f"127.0.0.1:{free_port()}")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "interval" in line and "'abc'" in line and "1 to 3600" in line


def test_unknown_key_in_config_file_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "agent.yml"
    config.write_text("interval: 2\ngpu:\n  nvlink_per_lnk: false\n")
    result = run_agent("--config", str(config), "--listen", f"127.0.0.1:{free_port()}")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "'gpu.nvlink_per_lnk'" in line and str(config) in line


def test_interval_zero_from_environment_exits_2_naming_the_variable() -> None:
    result = run_agent("--listen", f"127.0.0.1:{free_port()}", env={"FLOPWATCH_INTERVAL": "0"})
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "interval" in line and "FLOPWATCH_INTERVAL" in line


def test_busy_port_exits_1_with_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_agent("--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    # Log records (timestamped) may precede it; the failure itself is one line.
    errors = [line for line in result.stderr.splitlines() if line.startswith("flopwatch agent:")]
    assert len(errors) == 1, result.stderr
    assert f"127.0.0.1:{port}" in errors[0] and "--listen" in errors[0]
