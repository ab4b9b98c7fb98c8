"""Samples of a simulated fleet whose GPUs are behind dcgm-exporter (`fleet.exporter: dcgm`).

Each node is two scrape targets, as on a cluster that runs both: dcgm-exporter at `<node>:9400`
(job `dcgm-exporter`, its DCGM_FI_* series from flopwatch/sim/dcgm_exposition.py) and the FlopWatch
agent with its GPU collector and attribution off (the fast or exact agent path of sampler.py,
asked for no flopwatch_gpu_* series). Jobs reach the rules through dcgm-exporter's `hpc_job`.
"""

from __future__ import annotations

from collections.abc import Iterator

from flopwatch.detect.fast_sampler import Group, Labels
from flopwatch.sim import dcgm_exposition as dcgm
from flopwatch.sim.fleet import Fleet

#: The agent's series a node beside dcgm-exporter does not serve: its GPU collector and the
#: attribution collector are off (flopwatch_gpu_job_info is one of these names).
AGENT_GPU_PREFIX = "flopwatch_gpu_"


def agent_names(names: set[str]) -> set[str]:
    """`names` less what the agent does not serve beside dcgm-exporter."""
    return {name for name in names if not name.startswith(AGENT_GPU_PREFIX)}


class DcgmSampler:
    """dcgm-exporter's series of the fleet's `nodes` (indices), for the wanted names, a tick at a time."""

    def __init__(self, fleet: Fleet, nodes: list[int], wanted: set[str], opt_in: bool) -> None:
        self.exporters = [dcgm.DcgmNodeExporter(fleet, fleet.nodes[i], opt_in) for i in nodes]
        self.fields = wanted & dcgm.field_names(opt_in)
        self.up = "up" in wanted
        self._labels: dict[tuple[str, str, tuple[tuple[str, str], ...]], Labels] = {}
        self._groups: dict[tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...], tuple[Labels, ...]] = {}

    def _label(self, key: tuple[str, str, tuple[tuple[str, str], ...]]) -> Labels:
        labels = self._labels.get(key)
        if labels is None:
            name, instance, pairs = key
            labels = self._labels[key] = tuple(sorted(
                [("__name__", name), *pairs, ("instance", instance), ("job", dcgm.SCRAPE_JOB)]))
        return labels

    def _group(self, keys: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...]) -> tuple[Labels, ...]:
        labels = self._groups.get(keys)
        if labels is None:
            labels = self._groups[keys] = tuple(self._label(key) for key in keys)
        return labels

    def sample(self) -> Iterator[Group]:
        if self.up:
            keys = tuple(("up", exporter.instance, ()) for exporter in self.exporters)
            yield self._group(keys), [1.0] * len(keys)
        keys_out: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
        values: list[float] = []
        for exporter in self.exporters:
            for name, pairs, value in exporter.series(self.fields):
                keys_out.append((name, exporter.instance, pairs))
                values.append(value)
        if keys_out:
            yield self._group(tuple(keys_out)), values
