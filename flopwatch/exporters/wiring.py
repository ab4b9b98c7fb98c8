"""How the node agent is put together from its config: which collectors run, in which order, fed
by which seams (the GPU collector's readings for attribution and the host collector), and the
optional InfluxDB sink and web access. The agent command, the simulator's tests and the
benchmarks build agents here, so a real and a test agent are wired the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from flopwatch import config as cfg
from flopwatch.errors import UsageError
from flopwatch.exporters.agent import Agent, Collector
from flopwatch.exporters.attribution import GpuProcesses
from flopwatch.exporters.gpu.collector import GpuCollector
from flopwatch.exporters.gpu.reading import BackendUnavailable

if TYPE_CHECKING:
    from flopwatch.exporters.influx import InfluxSink
    from flopwatch.exporters.webconfig import WebAccess

log = logging.getLogger("flopwatch.agent")


def build_agent(config: cfg.AgentConfig) -> Agent:
    """The agent with every enabled collector; raises UsageError when the GPU backend cannot start."""
    collectors: list[Collector] = []
    backend_name = "none"
    gpu_collector: GpuCollector | None = None
    if config.collectors.get("gpu", True):
        from flopwatch.exporters.gpu.select import make_backend

        try:
            backend, count = make_backend(config)
        except BackendUnavailable as error:
            raise UsageError(str(error)) from None
        backend_name = backend.name
        log.info("GPU backend %s: %d GPU(s)", backend.name, count)
        gpu_collector = GpuCollector(backend, config.node, config.gpu, count)
        collectors.append(gpu_collector)
    collectors += _node_collectors(config, gpu_processes_of(gpu_collector))
    from flopwatch.exporters.fabric import fabric_collectors  # after the NIC collector: reads its scan

    collectors += fabric_collectors(config, collectors)
    if config.collectors.get("train", False):   # last: it starts a socket reader thread
        from flopwatch.exporters.train_intake import TrainIntake
        from flopwatch.exporters.train_socket import IntakeError

        try:
            collectors.append(TrainIntake(config.train, config.node))
        except IntakeError as error:
            raise UsageError(str(error)) from None
    sink = _influx_sink(config)
    if sink is not None:
        collectors.append(sink)
    agent = Agent(config.node, collectors, backend_name)
    if sink is not None:
        agent.cycle_listeners.append(sink.on_cycle)
    return agent


def _influx_sink(config: cfg.AgentConfig) -> InfluxSink | None:
    """The InfluxDB sink when influx.url is set; it runs off the agent's cycles."""
    if config.influx.url is None:
        return None
    from flopwatch.exporters.influx import SinkError, make_sink

    try:
        return make_sink(config.influx, config.node)
    except SinkError as error:
        raise UsageError(str(error)) from None


def web_access(config: cfg.AgentConfig) -> WebAccess | None:
    """TLS, basic auth and bearer tokens from the web config file, checked before anything starts; None without one."""
    if config.web_config is None:
        return None
    from flopwatch.exporters.webconfig import WebAccess, WebConfigError

    try:
        return WebAccess(config.web_config)
    except WebConfigError as error:
        raise UsageError(f"web config error: {error}") from None


def gpu_processes_of(collector: GpuCollector | None) -> Callable[[], list[GpuProcesses]]:
    """The seam attribution and the host collector read PIDs through: the GPU collector's last
    readings (it updates first in each cycle), never the hardware itself."""

    def read() -> list[GpuProcesses]:
        if collector is None:
            return []
        out = []
        for state in collector.states:
            known = state.last_known
            pids = state.reading.pids if state.up and state.reading is not None else None
            out.append(GpuProcesses(state.index, known.uuid if known else None,
                                    None if pids is None else tuple(pids)))
        return out

    return read


def _node_collectors(config: cfg.AgentConfig, gpu_processes: Callable[[], list[GpuProcesses]]) -> list[Collector]:
    """NIC, host and attribution collectors, as enabled."""
    collectors: list[Collector] = []
    if config.collectors.get("nic", False):
        from flopwatch.exporters.nic import NicCollector

        collectors.append(NicCollector(config.node, config.nic.sysfs_root, config.nic.net_exclude))
    if config.collectors.get("host", False):
        from flopwatch.exporters.host import HostCollector

        collectors.append(HostCollector(config.node, config.host.procfs_root,
                                        config.host.sysfs_root or config.nic.sysfs_root, gpu_processes))
    if config.collectors.get("attribution", False):
        from flopwatch.exporters.attribution import AttributionCollector
        from flopwatch.exporters.attribution_kubelet import grpc_available

        options = config.attribution
        if options.kubelet_socket and not grpc_available():
            raise UsageError("attribution.kubelet_socket needs grpcio: pip install 'flopwatch[kubernetes]', "
                             "or unset attribution.kubelet_socket")
        collectors.append(AttributionCollector(
            config.node, gpu_processes, mapping_dir=options.mapping_dir, procfs_root=options.procfs_root,
            kubelet_socket=options.kubelet_socket, nic_rails=options.nic_rails))
    return collectors
