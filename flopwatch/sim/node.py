"""One simulated node as Prometheus sees it: the agent's own GPU collector over the node's
SimulatedGpu objects, plus training, NIC and attribution series built from the same catalogue
specs the real collectors use, rendered by the agent's own Agent/renderer.

Sample output (abridged):

    flopwatch_gpu_sm_clock_hertz{node="node0003",gpu="5"} 1.8216e+09
    flopwatch_train_phase_seconds_total{node="node0003",job_id="llm-8b",rank="29",stage="0",...,phase="compute"} 1190.2
    flopwatch_nic_data_bytes_total{node="node0003",device="mlx5_0",port="1",direction="tx"} 8.1e+12
    flopwatch_gpu_job_info{node="node0003",gpu="5",job_id="llm-8b",user="ml-team"} 1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.core import Metric as Family

from flopwatch.catalog import Metric
from flopwatch.catalog import host as host_metrics
from flopwatch.catalog import job as job_metrics
from flopwatch.catalog import nic as nic_metrics
from flopwatch.catalog import train as train_metrics
from flopwatch.config import GpuOptions
from flopwatch.exporters.agent import Agent
from flopwatch.exporters.exposition import Blocks, histogram_series
from flopwatch.exporters.fabric import FabricCollector
from flopwatch.exporters.gpu.collector import GpuCollector
from flopwatch.exporters.gpu.simulated import SimBackend
from flopwatch.sim.fleet import SERIES_EXPIRY_S, Fleet
from flopwatch.sim.gpu_collector import SimGpuCollector
from flopwatch.sim.jobs import PHASES
from flopwatch.sim.nic import PHYS_LINK_UP, PORT_ACTIVE, SimulatedNic
from flopwatch.sim.state import STEP_BUCKETS, JobState, SimNode
from flopwatch.train.wire import ARRIVAL_INDEX

PORT_STATE_WORDS = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATE_WORDS = {2: "Polling", 3: "Disabled", 5: "LinkUp", 6: "LinkErrorRecovery"}
NIC_ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "port_rcv_errors", "port_xmit_discards")

NicValues = Callable[[list[SimulatedNic]], list[float]]
_n = nic_metrics
#: NIC metrics with a fixed set of series per port: (label values after device and port) and the
#: values of a list of ports, port after port, as the agent's NIC collector exports them (the
#: detection benchmark's bulk reader uses them too; one call per node or fleet, not per port).
NIC_FIXED: dict[Metric, tuple[tuple[tuple[str, ...], ...], NicValues]] = {
    _n.INFO: ((("InfiniBand", "28.39.1002", "MT4129", "MT_0000000838"),), lambda nics: [1.0] * len(nics)),
    _n.COUNTERS_AVAILABLE: (((),), lambda nics: [1.0] * len(nics)),
    _n.PORT_RATE: (((),), lambda nics: [float(nic.rate_bytes_per_s) for nic in nics]),
    _n.DATA: ((("tx",), ("rx",)),
              lambda nics: [float(int(value) // 4 * 4) for nic in nics for value in (nic.xmit_bytes, nic.rcv_bytes)]),
    _n.PACKETS: ((("tx",), ("rx",)),
                 lambda nics: [float(int(value)) for nic in nics for value in (nic.xmit_packets, nic.rcv_packets)]),
    _n.ERRORS: (tuple((counter,) for counter in NIC_ERROR_COUNTERS),
                lambda nics: [float(getattr(nic, counter)) for nic in nics for counter in NIC_ERROR_COUNTERS]),
    _n.LINK_DOWNED: (((),), lambda nics: [float(nic.link_downed) for nic in nics]),
    _n.XMIT_WAIT: (((),), lambda nics: [float(int(nic.xmit_wait)) for nic in nics]),
}
#: NIC metrics whose label carries the state word: (label values after device and port, value).
NIC_STATES: dict[Metric, Callable[[SimulatedNic], tuple[tuple[str, ...], float]]] = {
    _n.PORT_STATE: lambda nic: ((PORT_STATE_WORDS[nic.state],), float(nic.state)),
    _n.PORT_PHYSICAL_STATE: lambda nic: ((PHYS_STATE_WORDS[nic.phys_state],), float(nic.phys_state)),
}
NIC_METRICS = (*NIC_FIXED, *NIC_STATES)


def rank_sums(values: np.ndarray) -> np.ndarray:
    """Sums over the last axis (a job's ranks on one node), added rank after rank in order: numpy's
    sum pairs its terms by how many there are, a running sum does not, so the simulated node and the
    fast sampler (which adds a whole fleet's nodes at once, a partly used node padded with 0) get
    the same bits. One numpy call over the ranks, no loop."""
    return np.add.accumulate(values, axis=-1)[..., -1]


class _NodeCollector:
    """Base for the simulator's per-node collectors: state lives in the Fleet, update is free."""

    name = "sim"

    def __init__(self, fleet: Fleet, node: SimNode) -> None:
        self.fleet, self.node = fleet, node

    def update(self) -> int:
        return 0

    def close(self) -> None:
        pass


class SimTrainCollector(_NodeCollector):
    """What the agent's step intake exports for this node's ranks (flopwatch/catalog/train.py)."""

    name = "train"

    def __init__(self, fleet: Fleet, node: SimNode) -> None:
        super().__init__(fleet, node)
        self._placed: dict[tuple[str, int], tuple[slice, list[tuple[str, ...]]]] = {}
        self._series: dict[tuple[object, ...], dict[Metric, list]] = {}
        self._positions: dict[str, tuple[list[int], int | None]] = {}   # a job's nodes and this one's place
        self._histograms: dict[str, tuple[list[tuple[str, ...]], list[str]]] = {}

    def jobs_here(self) -> Iterator[tuple[JobState, int]]:
        for state in self.fleet.jobs.values():
            if state.counters.step_count == 0:
                continue
            if state.finished_at is not None and self.fleet.t - state.finished_at > SERIES_EXPIRY_S:
                continue
            position = self._position(state.runner.spec.id, state.runner.spec.nodes)
            if position is not None:
                yield state, position

    def _position(self, job: str, nodes: list[int]) -> int | None:
        """This node's place in a job's node list (looked up once per job, not every tick)."""
        cached = self._positions.get(job)
        if cached is None or cached[0] is not nodes:
            cached = self._positions[job] = (nodes, nodes.index(self.node.index) if self.node.index in nodes else None)
        return cached[1]

    def _ranks(self, state: JobState, position: int) -> tuple[slice, list[tuple[str, ...]]]:
        """The job's ranks on this node (consecutive: a slice of the job's per-rank arrays, cheaper
        to read than an index array) and their label values (node first), built once per job."""
        runner = state.runner
        key = (runner.spec.id, position)
        placed = self._placed.get(key)
        if placed is None:
            gpn = runner.fleet.gpus_per_node
            ranks = [(position * gpn + gpu, gpu) for gpu in range(gpn)
                     if position * gpn + gpu < runner.ranks]   # a trace job's last node may be partly used
            labels = [(self.node.name, runner.spec.id, str(rank), str(gpu), str(runner.stage[rank]),
                       str(runner.dp_rank[rank])) for rank, gpu in ranks]
            placed = self._placed[key] = (slice(position * gpn, position * gpn + len(ranks)), labels)
        return placed

    def blocks(self) -> Blocks:
        out = Blocks(self.node.name)
        for state, position in self.jobs_here():
            self._job_blocks(out, state, position)
        return out

    def _job_blocks(self, out: Blocks, state: JobState, position: int) -> None:
        """One job's series on this node, a metric at a time over its ranks (label tuples cached
        per job and per whether the comm floor exists). Checkpoint seconds are there from the first
        step, at 0 until a save, as the agent's intake exports them: a counter that first shows up
        at the length of a save would lose that save to every rate()."""
        m = train_metrics
        c, runner = state.counters, state.runner
        ranks, labels = self._ranks(state, position)
        recent = c.recent_window(self.fleet.now_unix)
        key = (runner.spec.id, position, c.comm_min_ready, recent is not None)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._job_series(labels, c.comm_min_ready, recent is not None)
        local = len(labels)
        phases = c.phase_seconds[:, ranks]         # this node's ranks first: a job has thousands
        # per node and job: the phases, then checkpoint saves, summed over the local ranks. The
        # simulated clients' totals never start over (an interruption or a lost GPU restarts the
        # job, not its RankCounters), so these sums of counters only go up, as the agent's do.
        totals = rank_sums(np.vstack([phases, c.checkpoint_seconds[ranks]])).tolist()
        values: dict[Metric, list[float]] = {
            m.STEPS: c.steps[ranks].tolist(), m.TOKENS: c.tokens[ranks].tolist(),
            m.MODEL_FLOPS: c.model_flops[ranks].tolist(), m.HARDWARE_FLOPS: c.hardware_flops[ranks].tolist(),
            m.PHASE_SECONDS: phases.T.ravel().tolist(),
            m.ARRIVAL_SECONDS: phases[list(ARRIVAL_INDEX)].sum(axis=0).tolist(),
            m.CHECKPOINT_SECONDS: c.checkpoint_seconds[ranks].tolist(), m.LAST_STEP: c.last_step_time[ranks].tolist(),
            m.COMM_MIN: c.comm_min[ranks].tolist() if c.comm_min_ready else [],
            m.RECENT_ARRIVAL: recent[0, ranks].tolist() if recent is not None else [],
            m.RECENT_PHASE: recent[1:, ranks].T.ravel().tolist() if recent is not None else [],
            m.ITERATION: [float(c.iteration)] * local,
            m.FLOPS_PER_STEP: [runner.flops_per_step / runner.ranks] * local,
            # per node and job, over its local ranks (the intake sums its ranks' replays the same way)
            m.REPLAYED_STEPS: [float(c.replayed_steps * local)],
            m.REPLAYED_STEP_SECONDS: [c.replayed_seconds * local],
            m.JOB_RANKS: [float(runner.ranks)],
            m.JOB_PHASE_SECONDS: totals[:-1], m.JOB_CHECKPOINT_SECONDS: totals[-1:],
        }
        for metric, found in values.items():
            if not found:
                continue
            if metric in out.series:   # a second job on the node (one that finished lingers)
                out.series[metric] = out.series[metric] + series[metric]
                out.values[metric] += found
            else:
                out.series[metric], out.values[metric] = series[metric], found
        # every local rank observes every step: count = steps x local ranks (as the intake does)
        counts = (c.step_buckets * local).tolist()
        if m.STEP_SECONDS in out.series:   # the lingering job's histogram is there already
            out.add_histogram(m.STEP_SECONDS, (runner.spec.id,), list(zip(STEP_BUCKETS, counts, strict=True)),
                              c.step_sum * local)
            return
        histogram = self._histograms.get(runner.spec.id)
        if histogram is None:
            histogram = self._histograms[runner.spec.id] = histogram_series(
                self.node.name, (runner.spec.id,), STEP_BUCKETS)
        out.series[m.STEP_SECONDS], out.suffixes[m.STEP_SECONDS] = histogram
        out.values[m.STEP_SECONDS] = [*counts, counts[-1], float(c.step_sum * local)]

    @staticmethod
    def _job_series(labels: list[tuple[str, ...]], comm_min: bool, recent: bool) -> dict[Metric, list]:
        m = train_metrics
        per_rank = {metric: labels for metric in (m.STEPS, m.TOKENS, m.MODEL_FLOPS, m.HARDWARE_FLOPS, m.ARRIVAL_SECONDS,
                                                  m.LAST_STEP, m.ITERATION)}
        return {**per_rank, m.PHASE_SECONDS: [(*key, phase) for key in labels for phase in PHASES],
                m.CHECKPOINT_SECONDS: [(*key, "save") for key in labels],
                m.COMM_MIN: labels if comm_min else [],
                m.RECENT_ARRIVAL: labels if recent else [],
                m.RECENT_PHASE: [(*key, phase) for key in labels for phase in m.RECENT_PHASES] if recent else [],
                m.FLOPS_PER_STEP: [(key[0], key[1], key[2], "analytic") for key in labels],
                m.REPLAYED_STEPS: [labels[0][:2]], m.REPLAYED_STEP_SECONDS: [labels[0][:2]],
                m.JOB_RANKS: [labels[0][:2]],
                m.JOB_PHASE_SECONDS: [(*labels[0][:2], phase) for phase in PHASES],
                m.JOB_CHECKPOINT_SECONDS: [(*labels[0][:2], "save")]}

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()


class SimNicCollector(_NodeCollector):
    """What the NIC collector exports for this node's InfiniBand ports (flopwatch/catalog/nic.py)."""

    name = "nic"

    def __init__(self, fleet: Fleet, node: SimNode) -> None:
        super().__init__(fleet, node)
        self._series: dict[Metric, list[tuple[str, ...]]] = {}
        self._states: dict[Metric, tuple[tuple[tuple[str, ...], ...], list[tuple[str, ...]]]] = {}

    def blocks(self) -> Blocks:
        """Each metric's series over the node's ports: label tuples built once (the state words'
        again only when a port's state changes), values in bulk (NIC_FIXED, NIC_STATES)."""
        out = Blocks(self.node.name)
        nics, node = self.node.nics, self.node.name
        for metric, (variants, values) in NIC_FIXED.items():
            series = self._series.get(metric)
            if series is None:
                series = self._series[metric] = [(node, nic.device, "1", *rest) for nic in nics for rest in variants]
            out.series[metric] = series
            out.values[metric] = values(nics)
        for metric, state in NIC_STATES.items():
            pairs = [state(nic) for nic in nics]
            words = tuple(rest for rest, _ in pairs)
            cached = self._states.get(metric)
            if cached is None or cached[0] != words:
                cached = self._states[metric] = (words, [(node, nic.device, "1", *rest)
                                                         for nic, rest in zip(nics, words, strict=True)])
            out.series[metric] = cached[1]
            out.values[metric] = [value for _, value in pairs]
        return out

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()


class SimHostCollector(_NodeCollector):
    """What the host collector exports for this node (flopwatch/catalog/host.py): its NUMA nodes
    (SimNode.numa_nodes, two)."""

    name = "host"

    def __init__(self, fleet: Fleet, node: SimNode) -> None:
        super().__init__(fleet, node)
        self._series: tuple[tuple[str, ...], dict[Metric, list[tuple[str, ...]]]] | None = None

    def blocks(self) -> Blocks:
        """The same series every tick (label tuples built once per set of CPU modes), new values."""
        m = host_metrics
        node = self.node
        out = Blocks(node.name)
        modes = tuple(node.cpu_seconds)
        if self._series is None or self._series[0] != modes:
            numas = [str(numa) for numa in range(node.numa_nodes)]
            self._series = (modes, {
                m.CPU_SECONDS: [(node.name, numa, mode) for numa in numas for mode in modes],
                m.CPUS: [(node.name, numa) for numa in numas],
                **{metric: [(node.name,)] for metric in (m.MEMORY_TOTAL, m.MEMORY_AVAILABLE)},
                m.PRESSURE_STALLED: [(node.name, "cpu", "some")], m.GPU_PROCESSES: [(node.name,)]})
        out.series.update(self._series[1])
        out.values.update({
            m.CPU_SECONDS: [seconds / node.numa_nodes for _ in range(node.numa_nodes)
                            for seconds in node.cpu_seconds.values()],
            m.CPUS: [float(node.cpus_per_numa)] * node.numa_nodes,
            m.MEMORY_TOTAL: [float(2 * 2**40)],
            m.MEMORY_AVAILABLE: [2 * 2**40 * (0.35 if node.job_id else 0.95)],
            m.PRESSURE_STALLED: [float(node.cpu_pressure_some_s)],
            m.GPU_PROCESSES: [float(len(node.gpus) if node.job_id else 0)],
        })
        return out

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()


class SimJobCollector(_NodeCollector):
    """What attribution exports while a job holds this node's GPUs (flopwatch/catalog/job.py)."""

    name = "attribution"

    def __init__(self, fleet: Fleet, node: SimNode) -> None:
        super().__init__(fleet, node)
        self._held: tuple[tuple[str, str], list[tuple[str, ...]], list[float]] | None = None

    def blocks(self) -> Blocks:
        out = Blocks(self.node.name)
        state = self.fleet.active_job(self.node)
        if state is None:
            return out
        job = (state.runner.spec.id, state.runner.spec.user)
        if self._held is None or self._held[0] != job:
            gpus = range(len(self.node.gpus))
            self._held = (job, [(self.node.name, str(gpu), *job) for gpu in gpus], [1.0] * len(gpus))
        out.series[job_metrics.GPU_JOB_INFO], out.values[job_metrics.GPU_JOB_INFO] = self._held[1], self._held[2]
        return out

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()


class SimNodeAgent:
    """The agent of one simulated node: the real Agent with the real GPU collector (its fast
    subclass for a simulated node, flopwatch/sim/gpu_collector.py)."""

    def __init__(self, fleet: Fleet, node: SimNode, nvlink_per_link: bool = False, gpus: bool = True,
                 reference: bool = False) -> None:
        """`gpus` False: the agent beside dcgm-exporter (collectors.gpu and attribution off).
        `reference`: the plain GpuCollector, reading every GPU every cycle (what the fast one is
        tested and benchmarked against)."""
        options = GpuOptions(peak_flops=None, dtype="bf16", nvlink_per_link=nvlink_per_link, timeout=1.0,
                             dcgm_host="")
        backend = SimBackend(node.gpus, self_advancing=False, nvlink_per_link=nvlink_per_link)
        kind = GpuCollector if reference else SimGpuCollector
        gpu = kind(backend, node.name, options, len(node.gpus), threaded=False, clock=lambda: fleet.t)
        collectors = [gpu, SimTrainCollector(fleet, node), SimNicCollector(fleet, node),
                      SimHostCollector(fleet, node), SimJobCollector(fleet, node)]
        if not gpus:
            collectors = [c for c in collectors if not isinstance(c, GpuCollector | SimJobCollector)]
        fabric = sim_fabric_collector(fleet, node)
        if fabric is not None:
            collectors.append(fabric)
        self.agent = Agent(node.name, collectors, backend_name="sim")

    def render(self) -> bytes:
        self.agent.collect_once()
        return self.agent.exposition()


def sim_fabric_collector(fleet: Fleet, node: SimNode) -> FabricCollector | None:
    """The agent's own fabric collector over the node's slice of the scenario's fabric (its NIC
    ports, for a topology that names no NIC, are the node's simulated ones)."""
    if fleet.scenario.fabric is None:
        return None
    return FabricCollector(node.name, fleet.scenario.fabric, lambda: [(nic.device, "1") for nic in node.nics])


__all__ = ["PHYS_LINK_UP", "PORT_ACTIVE", "SimNodeAgent", "sim_fabric_collector"]
