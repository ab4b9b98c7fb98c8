"""What every simulated node's agent would expose, read straight from the fleet's state in bulk.

Rendering 128 nodes through their agents costs about 150 ms a tick (most of it building text for
series no rule reads); the detection benchmark needs millions of GPU-ticks. This reads the same
values from the same objects (SimulatedGpu, RankCounters, SimulatedNic) a metric at a time over all
GPUs, for the metrics the rules read. `tests/test_bench_sampler.py` holds it to the agents' own
exposition, series for series and value for value, over every fault kind, so it cannot drift from
what a scrape returns. GPUs that are lost (XID 79) take the agent's collector state machine (up=0,
backoff, read errors): nodes that can lose a GPU are sampled through their real agents instead.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator

import numpy as np

from flopwatch import __version__
from flopwatch.catalog import Metric, metrics_of
from flopwatch.catalog import agent as agent_metrics
from flopwatch.catalog import fabric as fabric_metrics
from flopwatch.catalog import host as host_metrics
from flopwatch.catalog import job as job_metrics
from flopwatch.catalog import train as t
from flopwatch.sim.fleet import SERIES_EXPIRY_S, Fleet
from flopwatch.sim.gpu_values import GPU_DYNAMIC, GPU_METRICS, GPU_VARIANTS, SCALAR_INDEX, scalar_row
from flopwatch.sim.jobs import PHASES
from flopwatch.sim.node import (
    NIC_FIXED,
    NIC_METRICS,
    NIC_STATES,
    SimHostCollector,
    SimNodeAgent,
    rank_sums,
    sim_fabric_collector,
)
from flopwatch.sim.state import STEP_BUCKETS, JobState, SimNode
from flopwatch.train.wire import ARRIVAL_INDEX

Labels = tuple[tuple[str, str], ...]
#: One group of series for a tick: their label sets (a cached tuple) and values.
Group = tuple[tuple[Labels, ...], list[float] | np.ndarray]

SCRAPE_JOB = "flopwatch"

TRAIN_METRICS = (t.STEPS, t.TOKENS, t.MODEL_FLOPS, t.HARDWARE_FLOPS, t.PHASE_SECONDS, t.ARRIVAL_SECONDS,
                 t.CHECKPOINT_SECONDS, t.LAST_STEP, t.COMM_MIN, t.RECENT_ARRIVAL, t.RECENT_PHASE, t.ITERATION,
                 t.FLOPS_PER_STEP, t.STEP_SECONDS, t.REPLAYED_STEPS, t.REPLAYED_STEP_SECONDS, t.JOB_RANKS,
                 t.JOB_PHASE_SECONDS, t.JOB_CHECKPOINT_SECONDS)


def supported_names() -> set[str]:
    """Series names (histogram parts included) this sampler produces, plus `up`."""
    names = {metric.name for metric in (*GPU_METRICS, *NIC_METRICS, *TRAIN_METRICS, job_metrics.GPU_JOB_INFO,
                                        agent_metrics.COLLECTOR_ERRORS, agent_metrics.BUILD_INFO,
                                        *metrics_of(host_metrics), *metrics_of(fabric_metrics))}
    names |= {t.STEP_SECONDS.name + suffix for suffix in ("_bucket", "_count", "_sum")}
    names.add("up")
    return names


class LabelCache:
    """Sorted label tuples (with the scrape's `job` and `instance`), built once per series."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Labels] = {}

    def get(self, name: str, names: tuple[str, ...], values: tuple[str, ...]) -> Labels:
        key = (name, names, values)
        labels = self._cache.get(key)
        if labels is None:
            pairs = dict(zip(names, values, strict=True))
            pairs["job"] = SCRAPE_JOB
            pairs["instance"] = pairs["node"]
            labels = self._cache[key] = tuple(sorted([("__name__", name), *pairs.items()]))
        return labels


class FastSampler:
    """Series of the fleet's `nodes` (indices) for the wanted series names, one tick at a time."""

    def __init__(self, fleet: Fleet, nodes: list[int], wanted: set[str]) -> None:
        self.fleet = fleet
        self.nodes = [fleet.nodes[i] for i in nodes]
        self.node_set = set(nodes)
        self.wanted = wanted
        self.labels = LabelCache()
        self.gpu_metrics = [metric for metric in GPU_METRICS if metric.name in wanted]
        self.nic_metrics = [metric for metric in NIC_METRICS if metric.name in wanted]
        self.gpus = [(node, gpu) for node in self.nodes for gpu in node.gpus]
        self.fleet_gpus = [gpu for _, gpu in self.gpus]
        self.host_metrics = [metric for metric in metrics_of(host_metrics) if metric.name in wanted]
        self.hosts = [SimHostCollector(fleet, node) for node in self.nodes] if self.host_metrics else []
        # the agent's own collectors, named as a simulated node's agent names them
        self.collector_names = sorted(SimNodeAgent(fleet, fleet.nodes[0]).agent.errors) if fleet.nodes else []
        self.nics = [(node, nic) for node in self.nodes for nic in node.nics]
        self.fleet_nics = [nic for _, nic in self.nics]
        self._groups: dict[object, tuple[Labels, ...]] = {}
        self.fabric = self._fabric_series()

    def _group(self, key: object, build: Callable[[], tuple[Labels, ...]]) -> tuple[Labels, ...]:
        labels = self._groups.get(key)
        if labels is None:
            labels = self._groups[key] = build()
        return labels

    def sample(self) -> Iterator[Group]:
        yield from self.fabric
        yield from self._up()
        yield from self._gpus()
        yield from self._nics()
        yield from self._hosts()
        yield from self._jobs()
        yield from self._train()

    # -- per node --------------------------------------------------------------------------------
    def _up(self) -> Iterator[Group]:
        if "up" in self.wanted:
            labels = self._group("up", lambda: tuple(
                self.labels.get("up", ("node",), (node.name,)) for node in self.nodes))
            yield labels, [1.0] * len(labels)
        build = agent_metrics.BUILD_INFO
        if build.name in self.wanted:
            version = (__version__, "sim", platform.python_version())
            labels = self._group("build", lambda: tuple(
                self.labels.get(build.name, build.all_labels, (node.name, *version)) for node in self.nodes))
            yield labels, [1.0] * len(labels)
        errors = agent_metrics.COLLECTOR_ERRORS
        if errors.name in self.wanted:
            labels = self._group("errors", lambda: tuple(
                self.labels.get(errors.name, errors.all_labels, (node.name, collector))
                for node in self.nodes for collector in self.collector_names))
            yield labels, [0.0] * len(labels)

    def _fabric_series(self) -> list[Group]:
        """The fabric info series: fixed for a run, from the agents' own fabric collector, once."""
        wanted = [metric for metric in metrics_of(fabric_metrics) if metric.name in self.wanted]
        if not wanted or self.fleet.scenario.fabric is None:
            return []
        keys: dict[str, list[tuple[str, ...]]] = {metric.name: [] for metric in wanted}
        spec = {metric.name: metric for metric in wanted}
        for node in self.nodes:
            collector = sim_fabric_collector(self.fleet, node)
            for family in collector.collect() if collector is not None else ():
                for sample in family.samples if family.name in keys else ():
                    keys[family.name].append(tuple(sample.labels[n] for n in spec[family.name].all_labels))
        return [(self._labels(spec[name], found), [1.0] * len(found)) for name, found in keys.items() if found]

    def _gpus(self) -> Iterator[Group]:
        gpus = self.gpus
        rows = [scalar_row(gpu) for _, gpu in gpus] if any(m in SCALAR_INDEX for m in self.gpu_metrics) else []
        for metric in self.gpu_metrics:
            if metric in SCALAR_INDEX:
                column = SCALAR_INDEX[metric]
                labels = self._group(metric, lambda metric=metric: self._labels(
                    metric, [(node.name, str(gpu.index)) for node, gpu in gpus]))
                yield labels, [row[column] for row in rows]
            elif metric in GPU_VARIANTS:
                variants, values = GPU_VARIANTS[metric]
                labels = self._group(metric, lambda metric=metric, variants=variants: self._labels(
                    metric, [(node.name, str(gpu.index), *rest) for node, gpu in gpus for rest in variants(gpu)]))
                yield labels, values(self.fleet_gpus)
            else:
                dynamic = GPU_DYNAMIC[metric]
                keys, found = [], []
                for node, gpu in gpus:
                    for rest, value in dynamic(gpu):
                        keys.append((node.name, str(gpu.index), *rest))
                        found.append(value)
                if keys:
                    yield self._group((metric, tuple(keys)), lambda metric=metric, keys=keys: self._labels(
                        metric, keys)), found

    def _labels(self, metric: Metric, keys: list[tuple[str, ...]]) -> tuple[Labels, ...]:
        return tuple(self.labels.get(metric.name, metric.all_labels, key) for key in keys)

    def _nics(self) -> Iterator[Group]:
        nics = self.nics
        for metric in self.nic_metrics:
            if metric in NIC_FIXED:
                variants, values = NIC_FIXED[metric]
                labels = self._group(metric, lambda metric=metric, variants=variants: self._labels(
                    metric, [(node.name, nic.device, "1", *rest) for node, nic in nics for rest in variants]))
                yield labels, values(self.fleet_nics)
            else:
                state = NIC_STATES[metric]
                pairs = [state(nic) for _, nic in nics]
                words = tuple(rest for rest, _ in pairs)
                labels = self._group((metric, words), lambda metric=metric, words=words: self._labels(
                    metric, [(node.name, nic.device, "1", *rest) for (node, nic), rest in zip(nics, words,
                                                                                             strict=True)]))
                yield labels, [value for _, value in pairs]

    def _hosts(self) -> Iterator[Group]:
        """Host series come from the simulator's own host collector (a handful per node)."""
        if not self.host_metrics:
            return
        per_metric: dict[Metric, tuple[list[tuple[str, ...]], list[float]]] = {m: ([], []) for m in self.host_metrics}
        for collector in self.hosts:
            blocks = collector.blocks()
            for metric, (keys, values) in per_metric.items():
                series = blocks.series.get(metric)
                if series:
                    keys.extend(series)
                    values.extend(blocks.values[metric])
        for metric, (keys, values) in per_metric.items():
            if keys:
                yield self._group((metric, tuple(keys)), lambda metric=metric, keys=keys: self._labels(
                    metric, keys)), values

    def _jobs(self) -> Iterator[Group]:
        info = job_metrics.GPU_JOB_INFO
        if info.name not in self.wanted:
            return
        keys = []
        for node in self.nodes:
            state = self.fleet.active_job(node)
            if state is not None:
                keys += [(node.name, str(gpu.index), state.runner.spec.id, state.runner.spec.user)
                         for gpu in node.gpus]
        if keys:
            yield self._group((info, tuple(keys)), lambda: self._labels(info, keys)), [1.0] * len(keys)

    # -- training --------------------------------------------------------------------------------
    def _visible_jobs(self) -> Iterator[tuple[JobState, list[tuple[SimNode, int]]]]:
        for state in self.fleet.jobs.values():
            if state.counters.step_count == 0:
                continue
            if state.finished_at is not None and self.fleet.t - state.finished_at > SERIES_EXPIRY_S:
                continue
            placed = [(self.fleet.nodes[index], position) for position, index in enumerate(state.runner.spec.nodes)
                      if index in self.node_set]
            if placed:
                yield state, placed

    def _train(self) -> Iterator[Group]:
        for state, placed in self._visible_jobs():
            yield from self._train_job(state, placed)

    def _train_job(self, state: JobState, placed: list[tuple[SimNode, int]]) -> Iterator[Group]:
        c, runner = state.counters, state.runner
        gpn = runner.fleet.gpus_per_node
        job_id = runner.spec.id
        placed_ranks = [(node, gpu, position * gpn + gpu) for node, position in placed for gpu in range(gpn)
                        if position * gpn + gpu < runner.ranks]   # a trace job's last node may be partly used
        ranks = np.array([rank for _, _, rank in placed_ranks])
        rank_keys = [(node.name, job_id, str(rank), str(gpu), str(runner.stage[rank]), str(runner.dp_rank[rank]))
                     for node, gpu, rank in placed_ranks]
        for metric, array in ((t.STEPS, c.steps), (t.TOKENS, c.tokens), (t.MODEL_FLOPS, c.model_flops),
                              (t.HARDWARE_FLOPS, c.hardware_flops), (t.LAST_STEP, c.last_step_time)):
            if metric.name in self.wanted:
                yield self._job_group(metric, job_id, "", rank_keys), array[ranks]
        if t.COMM_MIN.name in self.wanted and c.comm_min_ready:
            yield self._job_group(t.COMM_MIN, job_id, "", rank_keys), c.comm_min[ranks]
        wants_recent = t.RECENT_ARRIVAL.name in self.wanted or t.RECENT_PHASE.name in self.wanted
        recent = c.recent_window(self.fleet.now_unix) if wants_recent else None
        if recent is not None:
            if t.RECENT_ARRIVAL.name in self.wanted:
                yield self._job_group(t.RECENT_ARRIVAL, job_id, "", rank_keys), recent[0, ranks]
            if t.RECENT_PHASE.name in self.wanted:
                for row, phase in enumerate(t.RECENT_PHASES, 1):
                    keys = [(*key, phase) for key in rank_keys]
                    yield self._job_group(t.RECENT_PHASE, job_id, phase, keys), recent[row, ranks]
        if t.ITERATION.name in self.wanted:
            yield self._job_group(t.ITERATION, job_id, "", rank_keys), np.full(len(rank_keys), float(c.iteration))
        if t.ARRIVAL_SECONDS.name in self.wanted:
            yield self._job_group(t.ARRIVAL_SECONDS, job_id, "", rank_keys), \
                c.phase_seconds[list(ARRIVAL_INDEX)][:, ranks].sum(axis=0)
        if t.PHASE_SECONDS.name in self.wanted:
            for i, phase in enumerate(PHASES):
                keys = [(*key, phase) for key in rank_keys]
                yield self._job_group(t.PHASE_SECONDS, job_id, phase, keys), c.phase_seconds[i, ranks]
        if t.CHECKPOINT_SECONDS.name in self.wanted:   # from the first step, as the agent's intake
            keys = [(*key, "save") for key in rank_keys]
            yield self._job_group(t.CHECKPOINT_SECONDS, job_id, "save", keys), c.checkpoint_seconds[ranks]
        if t.FLOPS_PER_STEP.name in self.wanted:
            keys = [(node, job, rank, "analytic") for node, job, rank, *_ in rank_keys]
            yield (self._job_group(t.FLOPS_PER_STEP, job_id, "", keys),
                   np.full(len(keys), runner.flops_per_step / runner.ranks))
        yield from self._histogram(state, placed)
        yield from self._job_sums(state, placed)

    def _job_group(self, metric: Metric, job_id: str, variant: str,
                   keys: list[tuple[str, ...]]) -> tuple[Labels, ...]:
        key = (metric.name, job_id, variant, len(keys))
        return self._group(key, lambda: tuple(self.labels.get(metric.name, metric.all_labels, k) for k in keys))

    def _histogram(self, state: JobState, placed: list[tuple[SimNode, int]]) -> Iterator[Group]:
        hist = t.STEP_SECONDS
        names = [hist.name + suffix for suffix in ("_bucket", "_count", "_sum")]
        if not any(name in self.wanted for name in (*names, t.REPLAYED_STEPS.name, t.REPLAYED_STEP_SECONDS.name,
                                                    t.JOB_RANKS.name)):
            return
        c = state.counters
        gpn = state.runner.fleet.gpus_per_node
        job_id = state.runner.spec.id
        local = [min(gpn, state.runner.ranks - position * gpn) for _, position in placed]
        bounds = ["+Inf" if np.isinf(b) else repr(float(b)) for b in STEP_BUCKETS]
        if names[0] in self.wanted:
            labels = self._group(("bucket", job_id, len(placed)), lambda: tuple(
                self.labels.get(names[0], (*hist.all_labels, "le"), (node.name, job_id, le))
                for node, _ in placed for le in bounds))
            yield labels, [v for n in local for v in (c.step_buckets * n).tolist()]
        per_node = ((names[1], hist.all_labels, float(c.step_buckets[-1])), (names[2], hist.all_labels, c.step_sum),
                    (t.REPLAYED_STEPS.name, t.REPLAYED_STEPS.all_labels, float(c.replayed_steps)),
                    (t.REPLAYED_STEP_SECONDS.name, t.REPLAYED_STEP_SECONDS.all_labels, c.replayed_seconds))
        for name, label_names, per_rank in per_node:   # one series per node and job, summed over its ranks
            if name in self.wanted:
                labels = self._group((name, job_id, len(placed)), lambda name=name, label_names=label_names: tuple(
                    self.labels.get(name, label_names, (node.name, job_id)) for node, _ in placed))
                yield labels, [float(per_rank * n) for n in local]
        if t.JOB_RANKS.name in self.wanted:   # the job's whole size on every node it runs on
            labels = self._group((t.JOB_RANKS.name, job_id, len(placed)), lambda: tuple(
                self.labels.get(t.JOB_RANKS.name, t.JOB_RANKS.all_labels, (node.name, job_id)) for node, _ in placed))
            yield labels, [float(state.runner.ranks)] * len(placed)

    def _job_sums(self, state: JobState, placed: list[tuple[SimNode, int]]) -> Iterator[Group]:
        """Phase and checkpoint seconds per node and job, summed over the job's ranks on each node
        as the node's agent sums them (rank_sums): every placed node's ranks at once, a grid of
        node x GPU with 0 where a trace job's last node is partly used."""
        phase, checkpoint = t.JOB_PHASE_SECONDS, t.JOB_CHECKPOINT_SECONDS
        if phase.name not in self.wanted and checkpoint.name not in self.wanted:
            return
        c, runner = state.counters, state.runner
        gpn, job_id = runner.fleet.gpus_per_node, runner.spec.id
        grid = (np.array([position for _, position in placed])[:, None] * gpn + np.arange(gpn)).ravel()
        present = grid < runner.ranks
        rows = np.vstack([c.phase_seconds[:, grid[present]], c.checkpoint_seconds[grid[present]]])
        if not present.all():
            padded = np.zeros((len(rows), len(grid)))
            padded[:, present] = rows
            rows = padded
        totals = rank_sums(rows.reshape(len(rows), len(placed), gpn))   # [phases..., save] x node
        if phase.name in self.wanted:
            labels = self._group((phase.name, job_id, len(placed)), lambda: self._labels(
                phase, [(node.name, job_id, name) for node, _ in placed for name in PHASES]))
            yield labels, totals[:-1].T.ravel()
        if checkpoint.name in self.wanted:
            labels = self._group((checkpoint.name, job_id, len(placed)), lambda: self._labels(
                checkpoint, [(node.name, job_id, "save") for node, _ in placed]))
            yield labels, totals[-1]
