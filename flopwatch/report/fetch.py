"""Running the report's queries: a few at a time, with progress, and failures kept per query.

A query that Prometheus rejects (too many samples, a timeout) becomes a note in its section, not
a crash; an unreachable Prometheus stops the report (`Unreachable`, one line for the CLI).
Range results are laid on the report's grid as numpy arrays (NaN where a bucket has no value).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flopwatch.promql import PromClient, PromError
from flopwatch.report.queries import Query
from flopwatch.report.window import Grid

#: progress(done, total, title of the query just finished)
Progress = Callable[[int, int, str], None]


class Unreachable(RuntimeError):
    """Prometheus cannot be reached (or stopped answering): the report cannot be built."""


@dataclass
class Outcome:
    query: Query
    data: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Results:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    _matrices: dict[tuple[object, ...], dict[tuple[str, ...], np.ndarray]] = field(default_factory=dict, repr=False)

    def get(self, name: str) -> Outcome | None:
        return self.outcomes.get(name)

    def error(self, name: str) -> str | None:
        outcome = self.outcomes.get(name)
        return outcome.error if outcome is not None else None

    def vector(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """An instant result keyed by label values (missing labels read as "")."""
        outcome = self.outcomes.get(name)
        if outcome is None or not outcome.ok:
            return {}
        return {tuple(s.labels.get(k, "") for k in keys): s.value for s in outcome.data}

    def scalar(self, name: str) -> float | None:
        values = list(self.vector(name).values())
        return values[0] if values else None

    def matrix(self, name: str, grid: Grid, *keys: str) -> dict[tuple[str, ...], np.ndarray]:
        """A range result on `grid` (n points, NaN where absent), keyed by label values (parsed once)."""
        outcome = self.outcomes.get(name)
        if outcome is None or not outcome.ok:
            return {}
        cached = self._matrices.get((name, grid, keys))
        if cached is not None:
            return cached
        start = outcome.query.start if outcome.query.start is not None else grid.first
        step = outcome.query.step or grid.step
        n = round((grid.end - start) / step) + 1
        out: dict[tuple[str, ...], np.ndarray] = {}
        for series in outcome.data:
            key = tuple(series["metric"].get(k, "") for k in keys)
            values = np.full(n, np.nan)
            for t, v in series["values"]:
                i = round((float(t) - start) / step)
                if 0 <= i < n:
                    values[i] = float(v)
            previous = out.get(key)
            out[key] = values if previous is None else np.fmax(previous, values)
        self._matrices[(name, grid, keys)] = out
        return out


class Fetcher:
    """Runs batches of queries against one Prometheus, counting progress across batches."""

    def __init__(self, client: PromClient, grid: Grid | None = None, workers: int = 4,
                 progress: Progress | None = None) -> None:
        self.client = client
        self.grid = grid
        self.workers = max(1, workers)
        self.progress = progress
        self.done = 0
        self.total = 0
        self.results = Results()

    def check(self) -> None:
        """Fail fast, in one line, when the server cannot be reached."""
        try:
            self.client.query("vector(1)")
        except PromError as error:
            raise Unreachable(str(error)) from None

    def run(self, queries: Iterable[Query]) -> Results:
        batch = list(queries)
        self.total += len(batch)
        if not batch:
            return self.results
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for future in as_completed([pool.submit(self._one, query) for query in batch]):
                outcome = future.result()
                self.results.outcomes[outcome.query.name] = outcome
                self.done += 1
                self._report(outcome.query.title)
        failed = [o for o in batch if not self.results.outcomes[o.name].ok]
        if failed and len(failed) == len(batch):
            self.check()  # every query failed: is the server gone?
        return self.results

    def _report(self, title: str) -> None:
        if self.progress is not None:
            self.progress(self.done, max(self.total, self.done), title)

    def _one(self, query: Query) -> Outcome:
        try:
            if query.kind == "instant":
                return Outcome(query, self.client.query(query.expr, at=query.at))
            grid = self.grid
            if grid is None:
                raise ValueError("range queries need a grid")
            start = query.start if query.start is not None else grid.first
            end = query.end if query.end is not None else grid.end
            step = query.step or grid.step
            return Outcome(query, self.client.query_range(query.expr, start, end, step))
        except PromError as error:
            message = str(error)
            if "cannot reach" in message:
                return Outcome(query, error=message)
            return Outcome(query, error=_short(message))


def _short(message: str, limit: int = 200) -> str:
    """Prometheus errors quote the whole query; keep the reason."""
    reason = message.rsplit(": ", 1)[-1] if ": " in message else message
    return reason if len(reason) <= limit else reason[:limit] + "..."


def job_clusters(jobs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """job_id -> its cluster, for the job ids of (cluster, job_id) keys seen in one cluster only."""
    seen: dict[str, set[str]] = {}
    for cluster, job_id in jobs:
        seen.setdefault(job_id, set()).add(cluster)
    return {job_id: next(iter(clusters)) for job_id, clusters in seen.items() if len(clusters) == 1}


def with_job_clusters(matrix: dict[tuple[str, ...], np.ndarray],
                      clusters: Mapping[str, str]) -> dict[tuple[str, ...], np.ndarray]:
    """A recording-rule result keyed (cluster, job_id, ...) where series without the cluster label
    take their job's cluster: a global tier's rules sum each job over every shard, so their records
    carry no cluster label while the job's raw series do (docs/scaling.md)."""
    return {((clusters[key[1]], *key[1:]) if not key[0] and key[1] in clusters else key): values
            for key, values in matrix.items()}
