"""Scenario files (YAML, DESIGN.md "Scenario files"): parsed into typed objects or one clear error.

    name: thermal-straggler
    seed: 7
    duration: 20m
    scrape_interval: 5s
    fleet: {nodes: 128, gpus_per_node: 8, gpu_model: H100-SXM, nics_per_node: 8}
    jobs:
      - id: llm-70b
        nodes: "0-127"
        model: {params: 70e9, layers: 80, heads: 64, head_dim: 128, seq_len: 4096}
        tokens_per_step: 4194304
        target_mfu: 0.42
        step_jitter: 0.02
    faults:
      - {kind: thermal_throttle, node: 17, gpu: 3, start: 5m, duration: 10m, slowdown: 0.08}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopwatch import yamlfile
from flopwatch.hardware import GpuModel, known_names, model_by_name
from flopwatch.sim import failures as failure_draws
from flopwatch.sim.scenario_pipeline import PipelineSpec, parse_pipeline

# The field reader's names are part of this module's interface (callers import them from here).
from flopwatch.sim.scenario_reader import (  # noqa: F401
    Reader,
    ScenarioError,
    fault_nic,
    fault_window,
    node_name,
    parse_duration,
    parse_index_set,
)
from flopwatch.topology.model import Fabric, TopologyError
from flopwatch.train.flops import DecoderShape

#: Shortest healthy step the simulator accepts: it advances step by step, so a sub-millisecond
#: step (a toy model on many GPUs) would make one tick take minutes.
MIN_STEP_SECONDS = 0.05

#: Fault kind -> (what it names: "gpu", "nic", "node", "switch" (a leaf), "uplink" (a leaf's link to
#: an upper switch) or "link" (one cable: node, NIC and its leaf); the alert cause it should produce,
#: for switch_degrade the fault's `mode`).
FAULT_KINDS: dict[str, tuple[str, str]] = {
    "thermal_throttle": ("gpu", "thermal"),
    "power_cap": ("gpu", "power"),
    "hw_slowdown": ("gpu", "hw_slowdown"),
    "pcie_downgrade": ("gpu", "pcie"),
    "nvlink_errors": ("gpu", "nvlink"),
    "xid": ("gpu", "xid"),
    "gpu_lost": ("gpu", "gpu_lost"),
    "slow_nic": ("nic", "nic"),
    "nic_link_flap": ("nic", "nic"),
    "host_cpu_contention": ("node", "host_cpu"),
    "dataloader_stall": ("node", "dataloader"),
    "gc_pause": ("node", "host_stall"),
    "silent_slowdown": ("gpu", "unknown"),
    "switch_degrade": ("switch", "errors"),
    "uplink_slow": ("uplink", "congestion"),
    "spine_degrade": ("switch", "congestion"),
    "cable_flap": ("link", "nic"),
}
#: What a degrading switch does to every port beneath it (`mode:` of switch_degrade).
SWITCH_MODES = ("errors", "rate", "flap")
#: `fleet.exporter`: FlopWatch's agent, dcgm-exporter with FlopWatch's counters file, or with its
#: default counters (docs/dcgm-exporter.md, "The detection benchmark on dcgm-exporter").
EXPORTERS = ("agent", "dcgm", "dcgm-default")
#: Fault kinds that need the scenario's `fabric:`.
FABRIC_KINDS = {"switch_degrade", "uplink_slow", "spine_degrade", "cable_flap"}
#: Default fractional slowdown of the affected rank(s) per fault kind, when the file gives none.
DEFAULT_SLOWDOWN = {
    "thermal_throttle": 0.08, "power_cap": 0.08, "hw_slowdown": 0.1, "pcie_downgrade": 0.05,
    "nvlink_errors": 0.05, "slow_nic": 0.1, "nic_link_flap": 0.05, "host_cpu_contention": 0.08,
    "dataloader_stall": 0.1, "gc_pause": 0.05, "silent_slowdown": 0.08, "xid": 0.0, "gpu_lost": 0.0,
    # fabric faults: switch_degrade and uplink_slow slow a job's communication by this fraction
    # (its step by slowdown x its communication share); cable_flap as nic_link_flap
    "switch_degrade": 0.5, "uplink_slow": 0.5, "spine_degrade": 0.5, "cable_flap": 0.05,
}



@dataclass(frozen=True)
class TraceSpec:
    """A recorded What-if trace the job replays instead of simulated physics."""

    path: Path
    workers: int
    time_scale: float
    loop: bool


@dataclass(frozen=True)
class JobSpec:
    id: str
    nodes: list[int]
    model: DecoderShape
    tokens_per_step: float
    target_mfu: float
    step_jitter: float
    start: float
    end: float | None
    user: str
    checkpoint_every: float
    checkpoint_seconds: float
    recompute: bool
    pipeline: PipelineSpec | None = None
    sequence_imbalance: float = 0.0
    trace: TraceSpec | None = None

    def ranks(self, gpus_per_node: int) -> int:
        """Ranks of the job: one per GPU of its nodes, or one per worker of its trace."""
        return self.trace.workers if self.trace is not None else len(self.nodes) * gpus_per_node


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    node: int | None        # None for switch and uplink faults
    gpu: int | None
    nic: int | None
    start: float
    end: float
    slowdown: float
    xid: int | None
    index: int  # position in the file, for truth and messages
    switch: str | None = None   # the leaf a fabric fault hits (cable_flap: the port's leaf; spine_degrade: the spine)
    uplink: str | None = None   # uplink_slow: the upper end of the slow link
    mode: str | None = None     # switch_degrade: errors, rate or flap

    @property
    def target(self) -> str:
        return FAULT_KINDS[self.kind][0]

    @property
    def cause(self) -> str:
        return self.mode if self.kind == "switch_degrade" and self.mode else FAULT_KINDS[self.kind][1]


@dataclass(frozen=True)
class FleetSpec:
    nodes: int
    gpus_per_node: int
    gpu_model: GpuModel
    nics_per_node: int
    #: What serves the GPUs' telemetry: FlopWatch's agent, or dcgm-exporter beside an agent that
    #: serves only steps, NICs and host (flopwatch/sim/dcgm_exposition.py EXPORTERS).
    exporter: str = "agent"


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    duration: float
    scrape_interval: float
    fleet: FleetSpec
    jobs: list[JobSpec]
    faults: list[FaultSpec] = field(default_factory=list)
    source: str = ""
    fabric: Fabric | None = None     # `fabric:`, over the fleet's node names
    failures: failure_draws.FailureSpec | None = None   # `failures:`, interruptions drawn at a rate


def parse(data: Any, source: str = "") -> Scenario:
    top = Reader(data, "")
    top.check_keys({"name", "seed", "duration", "scrape_interval", "fleet", "jobs", "faults", "description",
                    "fabric", "failures"})
    fleet_r = Reader(top.raw("fleet"), "fleet")
    fleet_r.check_keys({"nodes", "gpus_per_node", "gpu_model", "nics_per_node", "exporter"})
    model_name = fleet_r.text("gpu_model", "H100-SXM")
    gpu_model = model_by_name(model_name)
    if gpu_model is None:
        raise ScenarioError(f"fleet.gpu_model: unknown GPU model {model_name!r} (known: {', '.join(known_names())})")
    fleet = FleetSpec(
        nodes=fleet_r.integer("nodes", 1, 100_000),
        gpus_per_node=fleet_r.integer("gpus_per_node", 1, 64, 8),
        gpu_model=gpu_model,
        nics_per_node=fleet_r.integer("nics_per_node", 0, 64, 8),
        exporter=fleet_r.text("exporter", "agent"),
    )
    if fleet.exporter not in EXPORTERS:
        raise ScenarioError(f"fleet.exporter: expected one of {', '.join(EXPORTERS)}, got {fleet.exporter!r}")
    duration = top.duration("duration")
    if duration <= 0:
        raise ScenarioError("duration: must be longer than 0s")
    scrape_interval = top.duration("scrape_interval", 5.0)
    if not 0.5 <= scrape_interval <= 300:
        raise ScenarioError(f"scrape_interval: expected 0.5s to 5m, got {top.raw('scrape_interval')!r}")
    jobs_raw = top.raw("jobs", [])
    if not isinstance(jobs_raw, list):
        raise ScenarioError("jobs: expected a list of jobs")
    base = Path(source).parent if source else Path.cwd()
    jobs = [_job(item, f"jobs[{i}]", fleet, duration, base) for i, item in enumerate(jobs_raw)]
    seen: set[str] = set()
    owner: dict[int, str] = {}
    for job in jobs:
        if job.id in seen:
            raise ScenarioError(f"jobs: job id {job.id!r} appears twice")
        seen.add(job.id)
        for node in job.nodes:
            if node in owner and _overlap(job, next(j for j in jobs if j.id == owner[node])):
                raise ScenarioError(f"jobs: node {node} is in both {owner[node]!r} and {job.id!r} at the same time")
            owner[node] = job.id
    peak = gpu_model.peak_dense_flops["bf16"]
    for i, job in enumerate(jobs):
        if job.trace is not None:
            continue
        step = job.model.model_flops_per_token() * job.tokens_per_step / \
            (len(job.nodes) * fleet.gpus_per_node * peak * job.target_mfu)
        if step < MIN_STEP_SECONDS:
            raise ScenarioError(
                f"jobs[{i}]: a healthy step of {job.id!r} would take {step * 1000:.3g} ms; the simulator needs "
                f"{MIN_STEP_SECONDS * 1000:.0f} ms or more (real steps take 0.1 s to minutes): raise tokens_per_step "
                "or the model size")
    faults_raw = top.raw("faults", [])
    if not isinstance(faults_raw, list):
        raise ScenarioError("faults: expected a list of faults")
    fabric = parse_fabric(top, fleet, base)
    faults = [parse_fault(item, f"faults[{i}]", i, fleet, duration, fabric) for i, item in enumerate(faults_raw)]
    seed = top.integer("seed", 0, 2**32 - 1, 0)
    drawn = failure_draws.parse(top.raw("failures"), "failures", seed, Reader, ScenarioError) \
        if top.has("failures") else None
    return Scenario(
        name=top.text("name", "scenario"), seed=seed, duration=duration,
        scrape_interval=scrape_interval, fleet=fleet, jobs=jobs, faults=faults, source=source, fabric=fabric,
        failures=drawn,
    )


def _overlap(a: JobSpec, b: JobSpec) -> bool:
    a_end = a.end if a.end is not None else float("inf")
    b_end = b.end if b.end is not None else float("inf")
    return a.start < b_end and b.start < a_end


#: Model and tokens a trace job uses for its FLOPs (MFU figures only) when the file gives none.
TRACE_DEFAULT_MODEL = {"params": 7e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 4096}
TRACE_DEFAULT_TOKENS = 1_048_576


def _trace(r: Reader, base: Path) -> TraceSpec | None:
    """`trace: PATH` (relative to the scenario file) or `trace: whatif:AR` (a trace FlopWatch ships),
    with `time_scale` and `loop`; read once to check it."""
    if not r.has("trace"):
        return None
    from flopwatch.traces import whatif

    text = r.text("trace")
    if text.startswith(whatif.SHIPPED_PREFIX):
        path = whatif.shipped(text.removeprefix(whatif.SHIPPED_PREFIX))
    else:
        path = Path(text)
        path = path if path.is_absolute() else (base / path).resolve()
    try:
        trace = whatif.load_cached(path)
    except whatif.TraceError as error:
        raise ScenarioError(f"{r.path('trace')}: {error}") from None
    return TraceSpec(path, len(trace.workers), r.number("time_scale", 1e-3, 1e3, 1.0), bool(r.raw("loop", False)))


def _trace_seconds(trace: TraceSpec) -> float:
    from flopwatch.traces import whatif

    return float(whatif.load_cached(trace.path).step_seconds.max(axis=1).sum()) * trace.time_scale


def _job(data: Any, where: str, fleet: FleetSpec, duration: float, base: Path | None = None) -> JobSpec:
    r = Reader(data, where)
    r.check_keys({"id", "nodes", "model", "tokens_per_step", "target_mfu", "step_jitter", "start", "end",
                  "user", "checkpoint_every", "checkpoint_seconds", "recompute", "pipeline",
                  "sequence_imbalance", "trace", "time_scale", "loop"})
    trace = _trace(r, base or Path.cwd())
    if trace is None:
        for key in ("time_scale", "loop"):
            if r.has(key):
                raise ScenarioError(f"{r.path(key)}: only a job with `trace:` takes this field")
    elif r.has("pipeline") or r.has("sequence_imbalance"):
        raise ScenarioError(f"{r.path('pipeline' if r.has('pipeline') else 'sequence_imbalance')}: a trace job "
                            "replays its recorded phases; drop this field or the trace")
    if trace is not None and not r.has("model"):
        data = {**data, "model": TRACE_DEFAULT_MODEL, "tokens_per_step": data.get("tokens_per_step",
                                                                                  TRACE_DEFAULT_TOKENS)}
        r = Reader(data, where)
    m = Reader(r.raw("model"), f"{where}.model")
    m.check_keys({"params", "layers", "heads", "head_dim", "seq_len"})
    shape = DecoderShape(
        params=m.number("params", 1e6, 1e14), layers=m.integer("layers", 1, 10_000),
        heads=m.integer("heads", 1, 10_000), head_dim=m.integer("head_dim", 1, 100_000),
        seq_len=m.integer("seq_len", 1, 10_000_000),
    )
    start = r.duration("start", 0.0)
    end = r.duration("end") if r.has("end") else None
    if trace is not None and not trace.loop and end is None:
        end = start + _trace_seconds(trace)   # the recording played once, then the job ends
    if end is not None and end <= start:
        raise ScenarioError(f"{where}.end: must come after start")
    if start >= duration:
        raise ScenarioError(f"{where}.start: the job would start after the scenario ends")
    checkpoint_every = r.duration("checkpoint_every", 1800.0)
    checkpoint_seconds = r.duration("checkpoint_seconds", 20.0)
    if checkpoint_every == 0:
        checkpoint_every = float("inf")  # 0: never checkpoint
    elif checkpoint_seconds >= checkpoint_every:
        raise ScenarioError(f"{where}.checkpoint_seconds: must be shorter than checkpoint_every "
                            "(0 turns checkpoints off)")
    nodes = _job_nodes(r, where, fleet, trace)
    return JobSpec(
        id=r.text("id"), nodes=nodes, model=shape,
        tokens_per_step=r.number("tokens_per_step", 1, 1e12),
        target_mfu=r.number("target_mfu", 0.01, 0.9, 0.4 if trace else ...),
        step_jitter=r.number("step_jitter", 0, 0.5, 0.02), start=start, end=end,
        user=r.text("user", "ml-team"), checkpoint_every=checkpoint_every,
        checkpoint_seconds=checkpoint_seconds,
        recompute=bool(r.raw("recompute", False)),
        pipeline=parse_pipeline(r, len(nodes) * fleet.gpus_per_node),
        sequence_imbalance=r.number("sequence_imbalance", 0, 5, 0.0), trace=trace,
    )


def _job_nodes(r: Reader, where: str, fleet: FleetSpec, trace: TraceSpec | None) -> list[int]:
    """The job's nodes; a trace job needs ceil(workers / gpus_per_node) of them (the first ones by default)."""
    if trace is None:
        return parse_index_set(r.raw("nodes"), f"{where}.nodes", fleet.nodes)
    need = -(-trace.workers // fleet.gpus_per_node)
    if not r.has("nodes"):
        if need > fleet.nodes:
            raise ScenarioError(f"{where}.trace: {trace.workers} workers need {need} nodes of "
                                f"{fleet.gpus_per_node} GPUs; the fleet has {fleet.nodes}")
        return list(range(need))
    nodes = parse_index_set(r.raw("nodes"), f"{where}.nodes", fleet.nodes)
    if len(nodes) != need:
        raise ScenarioError(f"{where}.nodes: the trace's {trace.workers} workers need {need} nodes of "
                            f"{fleet.gpus_per_node} GPUs, got {len(nodes)}")
    return nodes


def parse_fault(data: Any, where: str, index: int, fleet: FleetSpec, duration: float,
                fabric: Fabric | None = None) -> FaultSpec:
    r = Reader(data, where)
    r.check_keys({"kind", "node", "gpu", "nic", "start", "duration", "slowdown", "xid", "switch", "uplink", "mode"})
    kind = r.text("kind")
    if kind not in FAULT_KINDS:
        raise ScenarioError(f"{where}.kind: unknown fault kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
    if kind in FABRIC_KINDS:
        return parse_fabric_fault(r, kind, index, fleet, duration, fabric)
    node = r.integer("node", 0, 10**9)
    if node >= fleet.nodes:
        raise ScenarioError(f"{where}.node: node {node} is out of range (the fleet has nodes 0-{fleet.nodes - 1})")
    target = FAULT_KINDS[kind][0]
    gpu = nic = None
    if target in ("nic", "link"):
        nic = fault_nic(r, kind, fleet.nics_per_node)
    if target == "gpu":
        gpu = r.integer("gpu", 0, 10**9, 0)
        if gpu >= fleet.gpus_per_node:
            raise ScenarioError(f"{where}.gpu: GPU {gpu} is out of range (nodes have GPUs 0-{fleet.gpus_per_node - 1})")
    start, end = fault_window(r, duration)
    xid = None
    if kind == "xid":
        xid = r.integer("xid", 1, 1000)
    elif kind == "gpu_lost":
        xid = 79
    return FaultSpec(
        kind=kind, node=node, gpu=gpu, nic=nic, start=start, end=end,
        slowdown=r.number("slowdown", 0, 0.9, DEFAULT_SLOWDOWN[kind]), xid=xid, index=index,
    )


def parse_fabric(top: Reader, fleet: FleetSpec, base: Path) -> Fabric | None:
    """`fabric: {rail_optimised: true, nodes_per_leaf, spines, rail_spines}` or `{topology: FILE, rails: FILE}`
    (paths relative to the scenario file), over the fleet's node names."""
    if not top.has("fabric"):
        return None
    r = Reader(top.raw("fabric"), "fabric")
    r.check_keys({"rail_optimised", "nodes_per_leaf", "spines", "rail_spines", "topology", "rails"})
    names = [node_name(i) for i in range(fleet.nodes)]
    if r.raw("rail_optimised", False) is True:
        for key in ("topology", "rails"):
            if r.has(key):
                raise ScenarioError(f"fabric.{key}: a rail_optimised fabric is generated; drop this field or "
                                    "rail_optimised")
        if fleet.nics_per_node == 0:
            raise ScenarioError("fabric.rail_optimised: needs NICs, but fleet.nics_per_node is 0")
        return Fabric.rail_optimised(names, fleet.nics_per_node, r.integer("nodes_per_leaf", 1, 100_000, 16),
                                     r.integer("spines", 1, 1024, 4), rail_spines=r.raw("rail_spines", False) is True)
    if not (r.has("topology") or r.has("rails")):
        raise ScenarioError("fabric: expected `rail_optimised: true` or `topology:` and/or `rails:` files")
    from flopwatch.topology.rails import read_rails
    from flopwatch.topology.slurm import read_topology_conf

    def path(key: str) -> Path:
        given = Path(r.text(key))
        return given if given.is_absolute() else (base / given).resolve()

    try:
        fabric = read_topology_conf(path("topology"), known_nodes=names) if r.has("topology") else None
        if r.has("rails"):
            fabric = read_rails(path("rails"), fabric, known_nodes=names)
    except (TopologyError, OSError) as error:
        raise ScenarioError(f"fabric: {error}") from None
    return fabric


def parse_fabric_fault(r: Reader, kind: str, index: int, fleet: FleetSpec, duration: float,
                  fabric: Fabric | None) -> FaultSpec:
    """switch_degrade {switch, mode}, uplink_slow {switch, uplink}, spine_degrade {switch} (a spine),
    cable_flap {node, nic}: named in the scenario's fabric."""
    where = r.where
    if fabric is None:
        raise ScenarioError(f"{where}: a {kind} fault needs the scenario's `fabric:` (which switches there are)")
    allowed = {"kind", "start", "duration", "slowdown"} | (
        {"node", "nic"} if kind == "cable_flap" else {"switch"} if kind == "spine_degrade"
        else {"switch", "mode" if kind == "switch_degrade" else "uplink"})
    r.check_keys(allowed)
    node = nic = uplink = mode = None
    if kind == "cable_flap":
        node = r.integer("node", 0, 10**9)
        if node >= fleet.nodes:
            raise ScenarioError(f"{where}.node: node {node} is out of range (the fleet has nodes 0-{fleet.nodes - 1})")
        nic = fault_nic(r, kind, fleet.nics_per_node)
        switch = port_switch(fabric, node_name(node), nic)
        if switch is None:
            raise ScenarioError(f"{where}: the fabric does not say which leaf {node_name(node)} NIC {nic} plugs into")
    else:
        switch, level = r.text("switch"), "spine" if kind == "spine_degrade" else "leaf"
        named = sorted(s.name for s in fabric.switches.values() if s.level == level)
        if switch not in named:
            shown = ", ".join(named[:6]) + (", ..." if len(named) > 6 else "")
            raise ScenarioError(f"{where}.switch: {switch!r} is no {level} switch of the fabric "
                                f"({'spines' if level == 'spine' else 'leaves'}: {shown or 'none'})")
        if kind == "switch_degrade":
            mode = r.text("mode", "errors")
            if mode not in SWITCH_MODES:
                raise ScenarioError(f"{where}.mode: expected one of {', '.join(SWITCH_MODES)}, got {mode!r}")
        elif kind == "uplink_slow":
            uplink = r.text("uplink")
            if uplink not in fabric.uplinks(switch):
                raise ScenarioError(f"{where}.uplink: {switch} has no uplink to {uplink!r} "
                                    f"(it has: {', '.join(fabric.uplinks(switch)) or 'none'})")
    start, end = fault_window(r, duration)
    return FaultSpec(kind=kind, node=node, gpu=None, nic=nic, start=start, end=end,
                     slowdown=r.number("slowdown", 0, 0.9, DEFAULT_SLOWDOWN[kind]), xid=None, index=index,
                     switch=switch, uplink=uplink, mode=mode)


def port_switch(fabric: Fabric, node: str, nic: int) -> str | None:
    """The leaf NIC `nic` (mlx5_<nic>) of `node` plugs into: its link, else the node's only leaf."""
    device = f"mlx5_{nic}"
    for link in fabric.links:
        if link.node == node and link.device == device:
            return link.switch
    leaves = fabric.leaves_of(node)
    return leaves[0] if len(leaves) == 1 else None


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        data = yamlfile.load(path, "scenario file")
    except yamlfile.YamlFileError as error:
        raise ScenarioError(str(error)) from None
    try:
        return parse(data, str(path))
    except ScenarioError as error:
        raise ScenarioError(f"scenario file {path}: {error}") from None
