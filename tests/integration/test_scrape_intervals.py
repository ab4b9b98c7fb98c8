"""Goodput, badput, ETTR and lost progress at 5 s, 15 s and 30 s scrapes, on Prometheus 2.42 and 3.x.

One simulated job (8 GPUs, 45 minutes) loses a GPU three times, right after a checkpoint, a little
later and long after one, so it redoes about 5 s, about 30 s and about 5 minutes of steps. The rules
are built for each scrape interval (`scrape_interval` in the settings, `flopwatch rules build`) and
evaluated over the simulated samples by the detection benchmark's engine in a real Prometheus of
each release (flopwatch.stack.releases): the job's goodput, every badput cause and its ETTR must be
within 1 pp of the simulator's truth, and the lost progress the rules read around each replay within
10% of the truth, plus the documented edge: a tile's worth of every rank's steps (docs/rules.md). The
5 s replay starts and ends between two of the goodput group's evaluations: only the agent's own
count of replayed steps (flopwatch_train_replayed_step_seconds_total) can see it.
Only the GPUs and the training job are simulated (flopwatch.sim); Prometheus is the real one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flopwatch.detect import rules as bench_rules
from flopwatch.detect.engine import START_UNIX, PrometheusEngine
from flopwatch.mixin import build, scrape
from flopwatch.mixin.config import load as load_settings
from flopwatch.sim.scenario import parse
from flopwatch.stack import releases

pytestmark = pytest.mark.integration

LLAMA_8B = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
GPUS = 8
#: GPU losses placed after the job's checkpoints (every 495 s of training, 10 s each, counted from
#: each restart; a restart comes 2 minutes after the loss) so that it redoes about 5 s, 30 s and 5
#: minutes of steps; multiples of 30 s, so that every scrape interval applies them at the same time.
LOSSES = (510, 1030, 1800)
#: The replays those give, as (shortest, longest) seconds: the test fails if the scenario drifts.
REPLAYS = ((2, 10), (20, 60), (240, 360))
OBSERVE = ("job_id:flopwatch_goodput:ratio", "job_id:flopwatch_badput:ratio", "job_id:flopwatch_ettr:ratio")


def scenario(interval: str):
    return parse({
        "name": f"replays-{interval}", "seed": 4, "duration": "90m", "scrape_interval": interval,
        "fleet": {"nodes": 1, "gpus_per_node": GPUS, "gpu_model": "H100-SXM", "nics_per_node": 2},
        "jobs": [{"id": "llm", "nodes": "0", "tokens_per_step": 131072, "target_mfu": 0.4, "model": LLAMA_8B,
                  "step_jitter": 0.02, "checkpoint_every": "495s", "checkpoint_seconds": 10}],
        "faults": [{"kind": "gpu_lost", "node": 0, "gpu": 2, "start": start, "duration": "1m"} for start in LOSSES],
    })


def rules_for(interval: str, folder: Path) -> bench_rules.RuleSet:
    settings = folder / "settings.yml"
    settings.write_text(f"scrape_interval: {interval}\n")
    built = folder / "alerts"
    for name, text in build.rules(load_settings(settings)).items():
        if not name.startswith("tests/"):
            (built / name).parent.mkdir(parents=True, exist_ok=True)
            (built / name).write_text(text)
    shipped = bench_rules.load(built, 15.0)
    return bench_rules.RuleSet([rule for rule in shipped.rules if rule.kind == "record"], shipped.files)


def series(result, name: str, **labels: str) -> tuple[np.ndarray, np.ndarray]:
    """The one observed series of `name` with `labels` (seconds since the start, values), from the
    stretches the engine evaluated it in."""
    found = [(have, t, v) for have, t, v in result.observed[name] if all(have.get(k) == x for k, x in labels.items())]
    assert found and len({tuple(sorted(have.items())) for have, _, _ in found}) == 1, f"{name}{labels}: {found}"
    times = np.concatenate([np.asarray(t, dtype=float) for _, t, _ in found])
    values = np.concatenate([np.asarray(v, dtype=float) for _, _, v in found])
    order = np.argsort(times)
    return times[order] - START_UNIX, values[order]


def time_mean(times: np.ndarray, values: np.ndarray, end: float) -> float:
    """The mean over [0, end] of a step function that holds each evaluation until the next (the
    rules' figures are 5-minute means, so their mean over the run is the run's own)."""
    edges = np.append(times, end)
    return float(np.sum(values * np.diff(edges)) / (end - times[0]))


@pytest.fixture(scope="module", params=["5s", "15s", "30s"])
def evaluated(request: pytest.FixtureRequest, server_release: str, tmp_path_factory: pytest.TempPathFactory):
    interval = request.param
    recorded = rules_for(interval, tmp_path_factory.mktemp(f"rules-{interval}"))
    result = PrometheusEngine(recorded, observe=OBSERVE).run(scenario(interval))
    return interval, result, result.truth["jobs"]["llm"]


def test_the_scenario_redoes_5_s_30_s_and_5_minutes(evaluated) -> None:
    _, _, truth = evaluated
    lengths = [end - start for start, end in truth["replays"]]
    assert len(lengths) == len(REPLAYS) and all(lo <= n <= hi for n, (lo, hi) in zip(lengths, REPLAYS, strict=True)), \
        lengths


def test_goodput_badput_and_ettr_are_within_1_pp_of_the_truth(evaluated) -> None:
    interval, result, truth = evaluated
    end = result.scenario.duration
    goodput = time_mean(*series(result, "job_id:flopwatch_goodput:ratio", job_id="llm"), end)
    assert goodput == pytest.approx(truth["goodput"], abs=0.01), (interval, goodput, truth["goodput"])
    ettr = time_mean(*series(result, "job_id:flopwatch_ettr:ratio", job_id="llm"), end)
    assert ettr == pytest.approx(truth["ettr"], abs=0.01), (interval, ettr, truth["ettr"])
    for cause in ("lost_progress", "restart", "checkpoint", "data", "straggler"):
        share = time_mean(*series(result, "job_id:flopwatch_badput:ratio", job_id="llm", cause=cause), end)
        assert share == pytest.approx(truth["badput"].get(cause, 0.0), abs=0.01), (interval, cause, share)


def test_each_replay_is_read_as_lost_progress_however_short(evaluated) -> None:
    interval, result, truth = evaluated
    times, share = series(result, "job_id:flopwatch_badput:ratio", job_id="llm", cause="lost_progress")
    held = np.diff(np.append(times, result.scenario.duration))
    tile = scrape.Scrape.of(interval).tile_seconds()
    for start, end in truth["replays"]:
        # the 5-minute means spread a replay over the 5 minutes after it, one tile late (the tiles
        # are read a tile back, when every scrape in them has landed)
        around = (times >= start - 60) & (times <= end + 360 + tile)
        read = float(np.sum(share[around] * held[around])) * GPUS
        true = (end - start) * GPUS
        edge = tile / 2 * GPUS
        assert 0.9 * true <= read <= 1.1 * true + edge, (interval, releases.current(), start, read, true)
