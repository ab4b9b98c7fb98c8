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

from collections.abc import Iterator

from prometheus_client.core import Metric as Family

from flopwatch.catalog import host as host_metrics
from flopwatch.catalog import job as job_metrics
from flopwatch.catalog import nic as nic_metrics
from flopwatch.catalog import train as train_metrics
from flopwatch.config import GpuOptions
from flopwatch.exporters.agent import Agent
from flopwatch.exporters.exposition import Blocks
from flopwatch.exporters.fabric import FabricCollector
from flopwatch.exporters.gpu.collector import GpuCollector
from flopwatch.exporters.gpu.simulated import SimBackend
from flopwatch.sim.fleet import SERIES_EXPIRY_S, STEP_BUCKETS, Fleet, JobState, SimNode
from flopwatch.sim.jobs import PHASES
from flopwatch.sim.nic import PHYS_LINK_UP, PORT_ACTIVE

PORT_STATE_WORDS = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATE_WORDS = {2: "Polling", 3: "Disabled", 5: "LinkUp", 6: "LinkErrorRecovery"}
NIC_ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "port_rcv_errors", "port_xmit_discards")


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

    def jobs_here(self) -> Iterator[tuple[JobState, int]]:
        for state in self.fleet.jobs.values():
            spec = state.runner.spec
            if self.node.index not in spec.nodes or state.counters.step_count == 0:
                continue
            if state.finished_at is not None and self.fleet.t - state.finished_at > SERIES_EXPIRY_S:
                continue
            yield state, spec.nodes.index(self.node.index)

    def blocks(self) -> Blocks:
        m = train_metrics
        out = Blocks(self.node.name)
        put = out.add
        for state, position in self.jobs_here():
            c, runner = state.counters, state.runner
            gpn = runner.fleet.gpus_per_node
            job_id = runner.spec.id
            per_rank_flops = runner.flops_per_step / runner.ranks
            local = 0
            for gpu in range(gpn):
                rank = position * gpn + gpu
                if rank >= runner.ranks:   # a trace job's last node may be partly used
                    break
                local += 1
                labels = (job_id, str(rank), str(gpu), str(runner.stage[rank]), str(runner.dp_rank[rank]))
                put(m.STEPS, labels, c.steps[rank])
                put(m.TOKENS, labels, c.tokens[rank])
                put(m.MODEL_FLOPS, labels, c.model_flops[rank])
                put(m.HARDWARE_FLOPS, labels, c.hardware_flops[rank])
                for i, phase in enumerate(PHASES):
                    put(m.PHASE_SECONDS, (*labels, phase), c.phase_seconds[i, rank])
                if c.checkpoint_seconds[rank] > 0:
                    put(m.CHECKPOINT_SECONDS, (*labels, "save"), c.checkpoint_seconds[rank])
                put(m.LAST_STEP, labels, c.last_step_time[rank])
                if c.comm_min_ready:
                    put(m.COMM_MIN, labels, c.comm_min[rank])
                put(m.ITERATION, labels, c.iteration)
                put(m.FLOPS_PER_STEP, (job_id, str(rank), "analytic"), per_rank_flops)
            # every local rank observes every step: count = steps x local ranks (as the intake does)
            out.add_histogram(m.STEP_SECONDS, (job_id,),
                              list(zip(STEP_BUCKETS, (c.step_buckets * local).tolist(), strict=True)),
                              c.step_sum * local)
        return out

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()


class SimNicCollector(_NodeCollector):
    """What the NIC collector exports for this node's InfiniBand ports (flopwatch/catalog/nic.py)."""

    name = "nic"

    def blocks(self) -> Blocks:
        m = nic_metrics
        out = Blocks(self.node.name)
        put = out.add
        for nic in self.node.nics:
            port = (nic.device, "1")
            put(m.INFO, (*port, "InfiniBand", "28.39.1002", "MT4129", "MT_0000000838"), 1)
            put(m.COUNTERS_AVAILABLE, port, 1)
            put(m.PORT_STATE, (*port, PORT_STATE_WORDS[nic.state]), nic.state)
            put(m.PORT_PHYSICAL_STATE, (*port, PHYS_STATE_WORDS[nic.phys_state]), nic.phys_state)
            put(m.PORT_RATE, port, nic.rate_bytes_per_s)
            put(m.DATA, (*port, "tx"), int(nic.xmit_bytes) // 4 * 4)
            put(m.DATA, (*port, "rx"), int(nic.rcv_bytes) // 4 * 4)
            put(m.PACKETS, (*port, "tx"), int(nic.xmit_packets))
            put(m.PACKETS, (*port, "rx"), int(nic.rcv_packets))
            for counter in NIC_ERROR_COUNTERS:
                put(m.ERRORS, (*port, counter), getattr(nic, counter))
            put(m.LINK_DOWNED, port, nic.link_downed)
            put(m.XMIT_WAIT, port, int(nic.xmit_wait))
        return out

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()


class SimHostCollector(_NodeCollector):
    """What the host collector exports for this node (flopwatch/catalog/host.py): two NUMA nodes."""

    name = "host"

    def blocks(self) -> Blocks:
        m = host_metrics
        node = self.node
        out = Blocks(node.name)
        for numa in range(node.numa_nodes):
            for mode, seconds in node.cpu_seconds.items():
                out.add(m.CPU_SECONDS, (str(numa), mode), seconds / node.numa_nodes)
            out.add(m.CPUS, (str(numa),), node.cpus_per_numa)
        out.add(m.MEMORY_TOTAL, (), 2 * 2**40)
        out.add(m.MEMORY_AVAILABLE, (), 2 * 2**40 * (0.35 if node.job_id else 0.95))
        out.add(m.PRESSURE_STALLED, ("cpu", "some"), node.cpu_pressure_some_s)
        out.add(m.GPU_PROCESSES, (), len(node.gpus) if node.job_id else 0)
        return out

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()


class SimJobCollector(_NodeCollector):
    """What attribution exports while a job holds this node's GPUs (flopwatch/catalog/job.py)."""

    name = "attribution"

    def collect(self) -> Iterator[Family]:
        state = self.fleet.active_job(self.node)
        if state is None:
            return
        family = job_metrics.GPU_JOB_INFO.family()
        for gpu in range(len(self.node.gpus)):
            family.add_metric([self.node.name, str(gpu), state.runner.spec.id, state.runner.spec.user], 1)
        yield family


class SimNodeAgent:
    """The agent of one simulated node: the real Agent with the real GPU collector."""

    def __init__(self, fleet: Fleet, node: SimNode, nvlink_per_link: bool = False, gpus: bool = True) -> None:
        """`gpus` False: the agent beside dcgm-exporter (collectors.gpu and attribution off)."""
        options = GpuOptions(peak_flops=None, dtype="bf16", nvlink_per_link=nvlink_per_link, timeout=1.0,
                             dcgm_host="")
        backend = SimBackend(node.gpus, self_advancing=False, nvlink_per_link=nvlink_per_link)
        gpu = GpuCollector(backend, node.name, options, len(node.gpus), threaded=False, clock=lambda: fleet.t)
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
