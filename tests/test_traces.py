"""The What-if trace reader against the study's three published traces and a broken one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flopwatch.traces import whatif
from flopwatch.train.wire import PHASE_INDEX

#: The study's traces as FlopWatch ships them (copied unchanged from the study's artifact).
TRACES = whatif.shipped("AR").parent


@pytest.fixture(scope="module")
def traces() -> dict[str, whatif.Trace]:
    return {name: whatif.load(TRACES / f"trace-{name}.parquet") for name in ("AR", "ST", "SE")}


def _compute(trace: whatif.Trace, dp_rank: int, stage: int) -> float:
    i = next(i for i, w in enumerate(trace.workers) if (w.dp_rank, w.stage) == (dp_rank, stage))
    return float(trace.phase("compute")[:, i].mean())


@pytest.mark.parametrize(("name", "workers", "dp", "pp"), [("AR", 16, 4, 4), ("ST", 8, 2, 4), ("SE", 64, 32, 2)])
def test_shapes_and_sizes(traces, name, workers, dp, pp):
    trace = traces[name]
    assert len(trace.workers) == workers
    assert (trace.dp_size, trace.pp_size) == (dp, pp)
    assert trace.phases.shape == (len(trace.steps), workers, 5)
    assert trace.step_seconds.shape == (len(trace.steps), workers)
    assert trace.steps == sorted(trace.steps)
    assert len({(w.dp_rank, w.stage) for w in trace.workers}) == workers


def test_phases_add_up_to_the_step(traces):
    for trace in traces.values():
        assert np.all(trace.phases >= 0)
        assert np.all(trace.phase("data") == 0)
        np.testing.assert_allclose(trace.phases.sum(axis=2), trace.step_seconds, rtol=1e-9)


def test_ar_bad_worker_computes_longer(traces):
    trace = traces["AR"]
    bad = _compute(trace, 0, 0)
    peers = [_compute(trace, d, s) for d in range(4) for s in range(4) if (d, s) != (0, 0)]
    assert bad == pytest.approx(45.0, rel=0.05)
    assert max(peers) < 21.0
    assert np.median(peers) == pytest.approx(19.2, rel=0.05)


def test_st_last_stage_is_heavy(traces):
    trace = traces["ST"]
    last = [_compute(trace, d, 3) for d in range(2)]
    others = [_compute(trace, d, s) for d in range(2) for s in range(3)]
    assert np.mean(last) == pytest.approx(1.37, abs=0.03)
    assert np.mean(others) == pytest.approx(0.84, abs=0.03)


def test_optimizer_and_other_come_from_their_ops(traces):
    trace = traces["ST"]
    assert np.all(trace.phase("optimizer") > 0)
    assert np.all(trace.phase("compute") > trace.phase("optimizer"))


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_floor_estimator_agrees_with_the_study(traces, name):
    """The rules' estimator (comm above the collective's floor) within 5 points of 1 - 1/S."""
    study = whatif.study_result(traces[name].path)
    estimate = whatif.lost_share_from_floor(traces[name])
    assert abs(estimate - study.lost_share) < 0.05, (name, estimate, study.lost_share)


def test_study_result_figures(traces):
    ar = whatif.study_result(TRACES / "result-AR.json")
    assert ar.lost_share == pytest.approx(0.493, abs=0.001)
    assert max(ar.by_stage, key=ar.by_stage.get) == 0
    assert max(ar.by_dp_rank, key=ar.by_dp_rank.get) == 0
    st = whatif.study_result(traces["ST"].path)
    assert max(st.by_stage, key=st.by_stage.get) == 3
    assert st.lost_share == pytest.approx(0.152, abs=0.001)
    se = whatif.study_result(traces["SE"].path)
    assert max(se.by_stage, key=se.by_stage.get) == 1


def _write(tmp_path: Path, drop: str | None = None) -> Path:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({
        "dp_rank": [0, 0, 1, 1, 1, 1], "stage": [0] * 6, "rank": [0, 0, 1, 1, 1, 1], "step": [7] * 6,
        "optype": ["forward-compute", "grads-reduce-scatter", "forward-compute", "grads-reduce-scatter",
                   "optimizer", "gc"],
        "start_ts": [0.0, 1.0, 0.0, 2.0, 2.0, 2.2], "duration": [1.0, 2.0, 2.0, 0.5, 0.2, 0.1],
    })
    if drop:
        frame = frame.drop(columns=[drop])
    path = tmp_path / "trace-tiny.parquet"
    frame.to_parquet(path)
    return path


def test_small_trace(tmp_path):
    trace = whatif.load(_write(tmp_path))
    assert [(w.dp_rank, w.stage, w.rank) for w in trace.workers] == [(0, 0, 0), (1, 0, 1)]
    np.testing.assert_allclose(trace.step_seconds, [[3.0, 2.5]])
    np.testing.assert_allclose(trace.phase("compute"), [[1.0, 2.0]])
    np.testing.assert_allclose(trace.phase("optimizer"), [[0.0, 0.2]])
    np.testing.assert_allclose(trace.phases[:, :, PHASE_INDEX["other"]], [[0.0, 0.1]])
    np.testing.assert_allclose(trace.phase("comm"), [[2.0, 0.2]])   # overlapping ops: the rest of the step
    assert (trace.dp_size, trace.pp_size) == (2, 1)   # no meta file: from the data


def test_missing_column_names_file_and_column(tmp_path):
    path = _write(tmp_path, drop="duration")
    with pytest.raises(whatif.TraceError) as err:
        whatif.load(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "'duration'" in message


def test_missing_file_and_bad_result(tmp_path):
    with pytest.raises(whatif.TraceError, match="no such trace file"):
        whatif.load(tmp_path / "trace-none.parquet")
    (tmp_path / "result-x.json").write_text('{"job_meta": {}}')
    with pytest.raises(whatif.TraceError, match="blocking_slowdown"):
        whatif.study_result(tmp_path / "result-x.json")
