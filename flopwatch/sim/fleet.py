"""The simulated fleet: nodes of SimulatedGpu and SimulatedNic objects, jobs stepping in sync,
faults switching on and off, and the ground truth of it all, advanced in fixed ticks.

Each tick: faults active at the tick's start set GPU/NIC impairments and per-rank slowdowns; every
job runs the steps that finish within the tick (JobRunner); GPU and NIC workloads follow the last
step's phases; GPUs and NICs advance; the truth records MFU, goodput and badput.
"""

from __future__ import annotations

import math

import numpy as np

from flopwatch.exporters.gpu.simulated import SimulatedGpu, Workload
from flopwatch.sim import failures
from flopwatch.sim.fabric import FabricFaults
from flopwatch.sim.jobs import JobRunner
from flopwatch.sim.nic import SimulatedNic
from flopwatch.sim.scenario import FABRIC_KINDS, FaultSpec, Scenario, node_name, parse_fault
from flopwatch.sim.state import JobState, RankCounters, SimNode
from flopwatch.sim.truth import JobTruth, Truth

RESTART_DELAY_S = 60.0
#: Fault kind of the worker a replayed trace's study blames (a truth record; nothing is injected).
TRACE_WORKER_KIND = "trace_worker"
SERIES_EXPIRY_S = 300.0   # a finished job's step series linger this long, like the agent's intake
class Fleet:
    """The whole simulated fleet. `advance(dt)` moves simulated time; `t` is seconds since start."""

    def __init__(self, scenario: Scenario, start_unix: float = 0.0) -> None:
        self.scenario = scenario
        self.start_unix = start_unix
        self.t = 0.0
        self.rng = np.random.default_rng(scenario.seed)
        fleet = scenario.fleet
        self.nodes = [
            SimNode(
                i, node_name(i),
                [SimulatedGpu(g, fleet.gpu_model, scenario.seed * 1_000_003 + i, node_name(i))
                 for g in range(fleet.gpus_per_node)],
                [SimulatedNic(n, np.random.default_rng([scenario.seed, i, n, 7]))
                 for n in range(fleet.nics_per_node)],
            )
            for i in range(fleet.nodes)
        ]
        self.jobs: dict[str, JobState] = {}
        self.truth = Truth(scenario.name, scenario.seed, scenario.scrape_interval)
        peak = fleet.gpu_model.peak_dense_flops["bf16"]
        for spec in scenario.jobs:
            runner = JobRunner(spec, fleet, np.random.default_rng([scenario.seed, len(self.jobs), 11]))
            truth = JobTruth(runner.ranks, peak, spec.target_mfu, runner.flops_per_step)
            truth.stages = runner.spec.pipeline.stages if runner.spec.pipeline else int(runner.stage.max()) + 1
            truth.slow_stage = runner.slow_stage()
            truth.source = "trace" if spec.trace is not None else "physics"
            self.jobs[spec.id] = JobState(runner, RankCounters(runner.ranks), truth)
            self.truth.jobs[spec.id] = truth
        self._xid_fired: set[int] = set()
        self._restored: set[int] = set()
        self.fabric_faults = (FabricFaults(self.nodes, self.jobs, scenario.fabric)
                              if scenario.fabric is not None else None)
        for fault in scenario.faults:
            self.truth.faults.append(self._fault_truth(fault))
        for state in self.jobs.values():
            record = self._trace_worker_truth(state)
            if record is not None:
                self.truth.faults.append(record)
        self.interruptions = [] if scenario.failures is None else failures.draw(
            scenario.failures, scenario.jobs, fleet.gpus_per_node, fleet.nics_per_node, scenario.duration)
        for number, item in enumerate(self.interruptions):   # what the alerts on it are scored against
            self.truth.faults.append(self._interruption_truth(number, item))

    # -- time ----------------------------------------------------------------------------------
    @property
    def now_unix(self) -> float:
        return self.start_unix + self.t

    def advance(self, dt: float) -> None:
        t0, t1 = self.t, self.t + dt
        self._apply_faults(t0)
        for state in self.jobs.values():
            self._run_job(state, t0, t1)
        for node in self.nodes:
            for gpu in node.gpus:
                gpu.advance(dt)
            for nic in node.nics:
                nic.advance(dt)
            node.advance_host(dt)
        busy_gpus = sum(1 for n in self.nodes if n.job_id for _ in n.gpus)
        self.truth.gpu_hours += busy_gpus * dt / 3600
        self.truth.energy_joules += sum(g.power_watts for n in self.nodes for g in n.gpus) * dt
        self.t = t1

    # -- jobs ----------------------------------------------------------------------------------
    def active_job(self, node: SimNode) -> JobState | None:
        return self.jobs.get(node.job_id) if node.job_id else None

    def _run_job(self, state: JobState, t0: float, t1: float) -> None:
        runner, spec = state.runner, state.runner.spec
        end = spec.end if spec.end is not None else math.inf
        if t1 <= spec.start or t0 >= end:
            if t0 >= end and state.finished_at is None:
                state.finished_at = end
                self._assign(state, None)
            return
        self._assign(state, spec.id)
        begin, stop = max(t0, spec.start), min(t1, end)
        truth = state.truth
        truth.allocated_s += stop - begin
        flops_done = 0.0
        if runner.slow.stalled:
            if state.pending is not None and state.pending.start < begin:   # the step in flight is lost
                truth.add_badput("restart", begin - state.pending.start)
            runner.clock = max(runner.clock, stop)
            truth.add_badput("restart", stop - begin)
            state.pending = None
        else:
            while True:
                if state.pending is None and runner.clock >= runner.next_checkpoint:
                    self._checkpoint(state)
                    continue
                if state.pending is None:
                    state.pending = runner.step()
                step = state.pending
                if step.start + step.wall > stop:
                    break
                state.pending = None
                state.last_step = step
                state.counters.observe_step(runner, step, self.start_unix + step.start + step.wall)
                truth.steps += 1
                if step.lost:
                    truth.lost_steps += 1
                    truth.add_badput("lost_progress", step.wall)
                    truth.note_replay(step.start, step.start + step.wall)
                    continue
                straggler = step.waiting   # per step: mean over ranks of waiting beyond the collective
                data = float(np.median(step.phases["data"]))
                truth.observe_step(step.wall, step.lost_seconds, step.lost_by_class)
                truth.add_badput("straggler", straggler)
                truth.add_badput("data", data)
                truth.productive_s += step.wall - straggler - data
                flops_done += runner.flops_per_step
                truth.model_flops += runner.flops_per_step
        interval = stop - begin
        mfu = flops_done / (interval * runner.ranks * truth.peak_flops) if interval > 0 else 0.0
        productive_share = min(1.0, truth.productive_s / truth.allocated_s) if truth.allocated_s else 0.0
        truth.series.append((t1, mfu, productive_share))
        self._set_workloads(state)

    def _checkpoint(self, state: JobState) -> None:
        runner = state.runner
        seconds = runner.spec.checkpoint_seconds
        state.counters.checkpoint_seconds += seconds
        runner.clock += seconds
        runner.next_checkpoint += runner.spec.checkpoint_every
        runner.steps_since_checkpoint = 0
        state.checkpoint_iteration = runner.steps - runner.replay_steps
        state.truth.add_badput("checkpoint", seconds)

    def _assign(self, state: JobState, job_id: str | None) -> None:
        for index in state.runner.spec.nodes:
            node = self.nodes[index]
            if job_id is not None or node.job_id == state.runner.spec.id:
                node.job_id = job_id
                if job_id is None:
                    for gpu in node.gpus:
                        gpu.workload = Workload()
                    for nic in node.nics:
                        nic.bytes_per_s = 0.0
                    node.host_cpu_busy = 0.05

    def _set_workloads(self, state: JobState) -> None:
        runner, step = state.runner, state.last_step
        gpn = runner.fleet.gpus_per_node
        stalled = runner.slow.stalled or step is None
        if not stalled:   # what every GPU and NIC of the job shares, once per step
            compute = step.phases["compute"].tolist()
            nic_bytes_per_s = runner.nic_bytes_per_step() / step.wall
            nvlink_bytes_per_s = runner.nvlink_bytes_per_step() / step.wall
            achieved = runner.flops_per_step / runner.ranks / step.wall / state.truth.peak_flops
        for position, index in enumerate(runner.spec.nodes):
            node = self.nodes[index]
            for nic in node.nics:
                nic.bytes_per_s = 0.0 if stalled else nic_bytes_per_s / len(node.nics)
            for g, gpu in enumerate(node.gpus):
                rank = position * gpn + g
                if rank >= runner.ranks:   # a trace job's last node may be partly used
                    continue
                if stalled:
                    gpu.workload = Workload(busy=0.0, memory_fraction=0.85, processes=1)
                    continue
                busy = min(1.0, (compute[rank] + runner.comm_exposed) / step.wall)
                gpu.workload = Workload(
                    busy=busy, tensor=min(busy, achieved / max(gpu.speed(), 0.05)),
                    nvlink_bytes_per_s=nvlink_bytes_per_s, pcie_bytes_per_s=2e9, memory_fraction=0.85, processes=1,
                )

    # -- faults --------------------------------------------------------------------------------
    def inject(self, kind: str, node: int, gpu: int | None = None, nic: int | None = None,
               duration: float = 600.0, slowdown: float | None = None, xid: int | None = None) -> FaultSpec:
        """Add a fault starting now (the demo's "inject a straggler"); validated like a file's."""
        data = {"kind": kind, "node": node, "start": self.t, "duration": duration}
        data.update({k: v for k, v in (("gpu", gpu), ("nic", nic), ("slowdown", slowdown), ("xid", xid))
                     if v is not None})
        fault = parse_fault(data, f"injected[{len(self.scenario.faults)}]", len(self.scenario.faults),
                            self.scenario.fleet, self.t + duration + 1, self.scenario.fabric)
        self.scenario.faults.append(fault)
        self.truth.faults.append(self._fault_truth(fault))
        return fault

    def _apply_faults(self, t: float) -> None:
        for node in self.nodes:
            node.host_cpu_busy = 0.12 if node.job_id else 0.05
            for gpu in node.gpus:
                gpu.faults.__init__()
            for nic in node.nics:
                nic.faults.__init__()
        for state in self.jobs.values():
            state.runner.slow.reset()
        for fault in self.scenario.faults:
            self._apply(fault, t)
        for interruption in self.interruptions:
            self._interrupt(interruption, t)
        for state in self.jobs.values():
            slow = state.runner.slow
            for position, index in enumerate(state.runner.spec.nodes):
                node = self.nodes[index]
                for g, gpu in enumerate(node.gpus):
                    rank = position * state.runner.fleet.gpus_per_node + g
                    if rank >= state.runner.ranks:
                        continue
                    slow.speed[rank] *= gpu.speed()
                    if gpu.lost:
                        slow.stalled = True

    def _interruption_truth(self, number: int, item: failures.Interruption) -> dict[str, object]:
        """A fault record for a drawn interruption: its node, GPU or NIC, for its down time."""
        state = self.jobs[item.job_id]
        gpu = item.gpu if item.telemetry in ("gpu_lost", "xid") else None
        return {
            "index": failures.TRUTH_INDEX + number, "kind": failures.FAULT_KIND[item.telemetry],
            "cause": failures.FAULT_CAUSE[item.telemetry], "node": node_name(item.node), "node_index": item.node,
            "gpu": gpu, "nic": item.nic, "device": f"mlx5_{item.nic}" if item.nic is not None else None,
            "job_id": item.job_id, "rank": state.rank_of(item.node, gpu) if gpu is not None else None,
            "start": item.start, "end": item.end, "slowdown": 0.0, "xid": item.xid, "interruption": item.cause,
        }

    def _interrupt(self, item: failures.Interruption, t: float) -> None:
        """A drawn interruption: the job stops (with its telemetry) and resumes from its last checkpoint."""
        state = self.jobs[item.job_id]
        runner, node = state.runner, self.nodes[item.node]
        if item.start <= t < item.end:
            runner.slow.stalled = True
            if not item.fired:
                item.fired = True
                state.truth.interruptions.append(item.record)
                if item.xid is not None:
                    node.gpus[item.gpu].inject_xid(item.xid)   # 79 also loses the GPU until the restart
                if item.nic is not None:
                    node.nics[item.nic].link_downed += 1
        elif t >= item.end and item.fired and not item.restarted:
            item.restarted = True
            if item.xid == 79:
                node.gpus[item.gpu].restore()
            # everything since the checkpoint is done again, steps being replayed included
            item.lost_steps = runner.steps - runner.replay_steps - state.checkpoint_iteration
            runner.restart(t, item.lost_steps)
            runner.next_checkpoint = runner.clock + runner.spec.checkpoint_every   # saves count from the restart
            item.record.update(restart_at=t, restart_seconds=t - item.start, lost_steps=item.lost_steps)

    def _apply(self, fault: FaultSpec, t: float) -> None:
        if fault.node is None:            # a switch or an uplink: the fabric's
            if self.fabric_faults is not None and fault.start <= t < fault.end:
                self.fabric_faults.apply(fault)
            return
        node = self.nodes[fault.node]
        state = self.active_job(node)
        gpu = node.gpus[fault.gpu] if fault.gpu is not None else None
        if fault.xid is not None and t >= fault.start and fault.index not in self._xid_fired:
            self._xid_fired.add(fault.index)
            assert gpu is not None
            gpu.inject_xid(fault.xid)
        if fault.xid == 79 and t >= fault.end and fault.index not in self._restored:
            self._restored.add(fault.index)
            assert gpu is not None
            gpu.restore()
            if state is not None:
                runner = state.runner
                resume = fault.end + RESTART_DELAY_S
                # the job holds its GPUs, idle, until it resumes: restart badput, as the rules read it
                state.truth.add_badput("restart", resume - max(runner.clock, t))
                runner.restart(resume, runner.steps_since_checkpoint)
        if not fault.start <= t < fault.end:
            return
        kind, slowdown = fault.kind, fault.slowdown
        step_extra = slowdown * state.runner.healthy_step if state is not None else 0.0
        if kind == "thermal_throttle":
            gpu.faults.thermal = slowdown
        elif kind == "power_cap":
            gpu.faults.power_cap = slowdown
        elif kind == "hw_slowdown":
            gpu.faults.hw_slowdown = slowdown
        elif kind == "silent_slowdown":   # slower kernels that no counter shows
            if state is not None:
                state.runner.slow.speed[state.rank_of(fault.node, fault.gpu)] *= 1 - slowdown
        elif kind == "pcie_downgrade":
            gpu.faults.pcie_width = 4
            gpu.faults.pcie_replays_per_s = 0.5
            if state is not None:
                state.runner.slow.speed[state.rank_of(fault.node, fault.gpu)] *= 1 - slowdown
        elif kind == "nvlink_errors":
            gpu.faults.nvlink_errors_per_s = 5.0
            if state is not None:
                state.runner.slow.comm_extra += step_extra
        elif kind in ("slow_nic", "nic_link_flap", "cable_flap"):
            nic = node.nics[fault.nic]
            if kind == "slow_nic":
                nic.faults.slow = 0.5
            else:
                nic.faults.flapping = True
            if state is not None:
                state.runner.slow.comm_extra += step_extra
        elif kind in ("host_cpu_contention", "gc_pause", "dataloader_stall") and state is not None:
            position = state.runner.spec.nodes.index(fault.node)
            gpn = state.runner.fleet.gpus_per_node
            ranks = slice(position * gpn, (position + 1) * gpn)
            if kind == "dataloader_stall":
                state.runner.slow.data_extra[ranks] += step_extra
            else:
                state.runner.slow.other_extra[ranks] += step_extra
            if kind == "host_cpu_contention":
                node.host_cpu_busy = 0.97

    def _trace_worker_truth(self, state: JobState) -> dict[str, object] | None:
        """A fault record for the worker a trace's study blames (nothing is injected: the trace holds it).

        It names that worker's rank, node and GPU as this fleet places it, cause unknown (the study
        does not say why), for the whole job: so the page on that rank is a true detection and a
        page on any other rank a false one. Indices count down from -1, apart from the scenario's.
        """
        blamed = state.runner.trace_bad_worker()
        if blamed is None:
            return None
        rank, slowdown = blamed
        runner, spec = state.runner, state.runner.spec
        node = spec.nodes[rank // runner.fleet.gpus_per_node]
        index = -1 - sum(1 for f in self.truth.faults if f["kind"] == TRACE_WORKER_KIND)
        return {
            "index": index, "kind": TRACE_WORKER_KIND, "cause": "unknown", "node": node_name(node),
            "node_index": node, "gpu": rank % runner.fleet.gpus_per_node, "nic": None, "device": None,
            "job_id": spec.id, "rank": rank, "stage": int(runner.stage[rank]), "dp_rank": int(runner.dp_rank[rank]),
            "start": spec.start, "end": spec.end if spec.end is not None else self.scenario.duration,
            "slowdown": slowdown, "xid": None,
        }

    def _fault_truth(self, fault: FaultSpec) -> dict[str, object]:
        job = next((j for j in self.jobs.values() if fault.node in j.runner.spec.nodes
                    and j.runner.spec.start <= fault.start < (j.runner.spec.end or math.inf)), None)
        rank = job.rank_of(fault.node, fault.gpu) if job is not None and fault.gpu is not None else None
        record = {
            "index": fault.index, "kind": fault.kind, "cause": fault.cause,
            "node": node_name(fault.node) if fault.node is not None else None,
            "node_index": fault.node, "gpu": fault.gpu, "nic": fault.nic,
            "device": f"mlx5_{fault.nic}" if fault.nic is not None else None,
            "job_id": job.runner.spec.id if job else None, "rank": rank,
            "start": fault.start, "end": fault.end, "slowdown": fault.slowdown, "xid": fault.xid,
        }
        if fault.kind in FABRIC_KINDS and self.fabric_faults is not None:
            record.update(self.fabric_faults.truth(fault))
            jobs = record.get("jobs")
            if record["job_id"] is None and jobs:
                record["job_id"] = jobs[0]
        return record
