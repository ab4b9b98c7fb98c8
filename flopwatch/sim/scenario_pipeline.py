"""A scenario job's `pipeline:` section: stages, their relative work, micro-batches and the
changes of that work mid-run (flopwatch/sim/scenario.py reads the rest of the job)."""

from __future__ import annotations

from dataclasses import dataclass

from flopwatch.sim.scenario_reader import Reader, ScenarioError


@dataclass(frozen=True)
class PipelineSpec:
    """Pipeline parallelism of a job: stages, each stage's relative compute, micro-batches (1F1B).

    `reweight` holds (at, stage_weights) pairs in time order: from scenario time `at` on, the stages
    do that much work (a stage slowing mid-run on every data-parallel replica, not a fault).
    """

    stages: int
    stage_weights: tuple[float, ...]
    micro_batches: int
    reweight: tuple[tuple[float, tuple[float, ...]], ...] = ()


def parse_pipeline(r: Reader, ranks: int) -> PipelineSpec | None:
    """`pipeline: {stages, stage_weights, micro_batches, reweight}`; ranks must split evenly into stages."""
    if not r.has("pipeline"):
        return None
    where = r.path("pipeline")
    p = Reader(r.raw("pipeline"), where)
    p.check_keys({"stages", "stage_weights", "micro_batches", "reweight"})
    stages = p.integer("stages", 1, 1024)
    stage_weights = _stage_weights(p, stages)
    micro = p.integer("micro_batches", 1, 100_000, max(1, 4 * stages))
    if ranks % stages:
        raise ScenarioError(f"{where}.stages: the job's {ranks} ranks do not split evenly into {stages} stages")
    changes_raw = p.raw("reweight", [])
    if not isinstance(changes_raw, list):
        raise ScenarioError(f"{where}.reweight: expected a list of {{at, stage_weights}}, got {changes_raw!r}")
    changes: list[tuple[float, tuple[float, ...]]] = []
    for i, item in enumerate(changes_raw):
        c = Reader(item, f"{where}.reweight[{i}]")
        c.check_keys({"at", "stage_weights"})
        if not c.has("stage_weights"):
            raise ScenarioError(f"{c.path('stage_weights')}: required field is missing")
        at = c.duration("at")
        if changes and at <= changes[-1][0]:
            raise ScenarioError(f"{c.path('at')}: must come after the previous change's")
        changes.append((at, _stage_weights(c, stages)))
    return PipelineSpec(stages, stage_weights, micro, tuple(changes))


def _stage_weights(r: Reader, stages: int) -> tuple[float, ...]:
    """`stage_weights`: one relative compute per stage (all 1.0 when absent)."""
    where = r.path("stage_weights")
    weights_raw = r.raw("stage_weights", [1.0] * stages)
    if not isinstance(weights_raw, list) or len(weights_raw) != stages:
        raise ScenarioError(f"{where}: expected a list of {stages} numbers (one per stage), got {weights_raw!r}")
    weights = Reader({str(i): w for i, w in enumerate(weights_raw)}, where)
    return tuple(weights.number(str(i), 0.05, 20) for i in range(stages))
