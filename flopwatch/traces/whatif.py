"""Read a trace in the What-if format (OSDI'25, "Understanding Stragglers in Large Model Training").

A trace is one parquet file with a row per operation of every worker (one worker = one (dp rank,
pipeline stage) pair; tensor-parallel peers are folded in) for a sample of steps. This module turns
it into FlopWatch's per-step phases (flopwatch.train.wire.PHASES), so that the simulator can replay
it and tests can check the rules' estimators against the study's own what-if results
(result-*.json beside the trace).

Phases of one worker in one step:
    data       0 (the trace does not record the data loader)
    compute    forward-compute + backward-compute durations
    comm       the step time minus the other phases: waits, p2p sends/receives and collectives,
               which overlap and include waiting for peers, so their own durations do not add up
    optimizer  optimizer + optimizer-clip-main-grad
    other      gc
and the step time is the end of the worker's last op in that step (start_ts + duration).

pandas and pyarrow are imported only when a trace is read (`pip install flopwatch[traces]`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from flopwatch import yamlfile
from flopwatch.train.wire import PHASE_INDEX, PHASES

COLUMNS: tuple[str, ...] = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
#: Which op types make up each phase that is not derived (comm is the rest of the step).
PHASE_OPS: dict[str, tuple[str, ...]] = {
    "compute": ("forward-compute", "backward-compute"),
    "optimizer": ("optimizer", "optimizer-clip-main-grad"),
    "other": ("gc",),
}


#: `trace: whatif:AR` in a scenario: one of the study's traces that ship with FlopWatch.
SHIPPED_PREFIX = "whatif:"
SHIPPED = ("AR", "SE", "ST")


def shipped(name: str) -> Path:
    """The packaged trace-<name>.parquet (its result, meta and M_S/M_W files lie beside it)."""
    if name not in SHIPPED:
        raise TraceError(f"{SHIPPED_PREFIX}{name}: no such shipped trace (shipped: {', '.join(SHIPPED)})")
    return Path(str(resources.files("flopwatch.traces") / "whatif_data" / f"trace-{name}.parquet"))


class TraceError(ValueError):
    """A trace that cannot be read; the message is one line naming the file (and the column)."""


@dataclass(frozen=True)
class Worker:
    """One worker of the trace: a (dp rank, pipeline stage) pair and its global rank."""

    dp_rank: int
    stage: int
    rank: int


@dataclass
class Trace:
    """Per-step phases of every worker; rows of `phases`/`step_seconds` follow `steps`, columns `workers`."""

    path: Path
    workers: list[Worker]
    steps: list[int]
    phases: np.ndarray          # (n_steps, n_workers, len(PHASES)) seconds
    step_seconds: np.ndarray    # (n_steps, n_workers) seconds
    dp_size: int
    pp_size: int
    meta: dict = field(default_factory=dict)

    def phase(self, name: str) -> np.ndarray:
        """(n_steps, n_workers) seconds of one phase."""
        return self.phases[:, :, PHASE_INDEX[name]]


def _read_frame(path: Path):
    """The parquet file as a DataFrame with the columns this reader needs, or TraceError."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - depends on the install
        raise TraceError(f"{path}: reading What-if traces needs pandas and pyarrow "
                         "(pip install 'flopwatch[traces]')") from e
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        schema = pq.read_schema(path)
    except Exception as e:
        raise TraceError(f"{path}: not a parquet file ({type(e).__name__})") from e
    for column in COLUMNS:
        if column not in schema.names:
            raise TraceError(f"{path}: missing column {column!r}")
    try:
        return pq.read_table(path, columns=list(COLUMNS)).to_pandas()
    except Exception as e:
        raise TraceError(f"{path}: cannot read ({type(e).__name__}: {e})".splitlines()[0]) from e


def _read_meta(path: Path) -> dict:
    """meta-<name>.yaml beside trace-<name>.parquet, or {} when there is none."""
    name = path.stem.removeprefix("trace-")
    meta_path = path.with_name(f"meta-{name}.yaml")
    if not meta_path.is_file():
        return {}
    try:
        meta = yamlfile.load(meta_path, "trace metadata")
    except yamlfile.YamlFileError as error:
        raise TraceError(str(error)) from None
    return meta if isinstance(meta, dict) else {}


def load(path: str | Path) -> Trace:
    """Read a What-if trace into per-step phases; TraceError (one line) for a missing file or column."""
    path = Path(path)
    df = _read_frame(path)
    if df.empty:
        raise TraceError(f"{path}: no operations")
    df["optype"] = df["optype"].astype(str)
    df["end"] = df["start_ts"].astype(np.float64) + df["duration"].astype(np.float64)
    df["duration"] = df["duration"].astype(np.float64)
    keys = df[["dp_rank", "stage", "rank"]].drop_duplicates().sort_values(["stage", "dp_rank"])
    workers = [Worker(int(d), int(s), int(r)) for d, s, r in keys.itertuples(index=False)]
    if len({(w.dp_rank, w.stage) for w in workers}) != len(workers):
        raise TraceError(f"{path}: column 'rank': a (dp_rank, stage) pair has more than one rank")
    steps = sorted(int(s) for s in df["step"].unique())
    w_index = {(w.dp_rank, w.stage): i for i, w in enumerate(workers)}
    s_index = {s: i for i, s in enumerate(steps)}
    wi = np.array([w_index[k] for k in zip(df["dp_rank"], df["stage"], strict=True)])
    si = df["step"].map(s_index).to_numpy()
    shape = (len(steps), len(workers))
    step_seconds = np.zeros(shape)
    np.maximum.at(step_seconds, (si, wi), df["end"].to_numpy())
    phases = np.zeros((*shape, len(PHASES)))
    for phase, ops in PHASE_OPS.items():
        mask = df["optype"].isin(ops).to_numpy()
        np.add.at(phases[:, :, PHASE_INDEX[phase]], (si[mask], wi[mask]), df["duration"].to_numpy()[mask])
    rest = step_seconds - phases.sum(axis=2)
    phases[:, :, PHASE_INDEX["comm"]] = np.maximum(rest, 0.0)
    meta = _read_meta(path)
    dp_size = int(meta.get("dp_size") or len({w.dp_rank for w in workers}))
    pp_size = int(meta.get("pp_size") or len({w.stage for w in workers}))
    return Trace(path, workers, steps, phases, step_seconds, dp_size, pp_size, meta)


_CACHE: dict[tuple[Path, float], Trace] = {}


def load_cached(path: str | Path) -> Trace:
    """load(), once per file version: a scenario and its simulator read the same trace."""
    path = Path(path).resolve()
    try:
        key = (path, path.stat().st_mtime)
    except OSError:
        return load(path)   # raises the one-line TraceError
    if key not in _CACHE:
        _CACHE[key] = load(path)
    return _CACHE[key]


def lost_share_from_floor(trace: Trace) -> float:
    """Share of step time lost to waiting for slower workers, estimated from comm alone.

    The collective's own cost is the floor: the smallest per-step comm any worker saw (the last
    to arrive waits for nobody). Everything a worker spends in comm above that floor is waiting;
    its mean over workers and steps, over the mean step time, is the share lost. This is what the
    rules compute from each rank's comm floor gauge, so the traces check it against the study.
    """
    comm = trace.phase("comm")
    floor = float(comm.min(axis=0).min())
    return float((comm.mean() - floor) / trace.step_seconds.mean())


@dataclass(frozen=True)
class StudyResult:
    """The study's what-if figures for one trace (result-*.json)."""

    slowdown: float                 # S: recorded step time over the step time with typical ops
    by_stage: dict[int, float]      # S when only that stage keeps its recorded durations
    by_dp_rank: dict[int, float]    # the same per dp rank (empty where the file has none)
    per_step: dict[int, float] = field(default_factory=dict)   # S of each step
    worker_share: float | None = None   # M_W (mw-*.json): share of the slowdown due to single workers
    stage_share: float | None = None    # M_S (ms-*.json): share due to stage partitioning

    @property
    def lost_share(self) -> float:
        """Share of step time lost, 1 - 1/S."""
        return 1.0 - 1.0 / self.slowdown


def study_result(path: str | Path) -> StudyResult:
    """Read result-<name>.json (the path, or the trace path beside which it lies)."""
    path = Path(path)
    if path.suffix == ".parquet":
        path = path.with_name(f"result-{path.stem.removeprefix('trace-')}.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TraceError(f"{path}: cannot read the study's result ({type(e).__name__})") from e
    if not isinstance(data, dict) or not isinstance(data.get("blocking_slowdown"), int | float):
        raise TraceError(f"{path}: missing field 'blocking_slowdown'")

    def _by(key: str) -> dict[int, float]:
        value = data.get(key) or {}
        return {int(k): float(v) for k, v in value.items()} if isinstance(value, dict) else {}

    return StudyResult(float(data["blocking_slowdown"]), _by("blocking_decompose_by_stage"),
                       _by("blocking_decompose_by_dp_rank"), _by("blocking_step_slowdown"),
                       _share(path, "mw", "Mw"), _share(path, "ms", "Ms"))


def _share(result: Path, prefix: str, key: str) -> float | None:
    """M_W or M_S from mw-<name>.json / ms-<name>.json beside result-<name>.json, if there."""
    path = result.with_name(f"{prefix}-{result.stem.removeprefix('result-')}.json")
    try:
        value = json.loads(path.read_text()).get(key)
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None
