"""The report's "where the step time goes" against a simulated fleet with a pipeline job: a
4-stage pipeline whose last stage does 40% more work and whose sequence lengths vary (stage and
scattered imbalance), next to a plain data-parallel job.

The shipped rules run over the simulated samples in the detection benchmark's engine (a real
Prometheus evaluates every recording rule the share of step time lost needs, and the
FlopWatchPipelineImbalance alert with its `for:`); what a live Prometheus would then hold (the raw
series, the recorded ones, the ALERTS series of the ticket) is remote-written into the Prometheus
the report reads. The report's figures must match the rules' over the window (weighted by step
time), the simulator's truth within 5 percentage points (as the detection benchmark holds the
rules), the ticket must name stage 3, and the recommendations must say what to do, only when the
figures cover enough step time.
"""

from __future__ import annotations

import numpy as np
import pytest

from flopwatch import resources
from flopwatch.detect import remote_write
from flopwatch.detect import rules as bench_rules
from flopwatch.detect.engine import START_UNIX, PrometheusEngine, RunResult
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus
from tests.integration.test_report_week import LLAMA_8B
from tests.integration.test_report_windows import load, report, rows

pytestmark = pytest.mark.integration

MINUTES = 30
RECORDED = ("job_id:flopwatch_step_time_lost:ratio", "job_id_class:flopwatch_step_time_lost:ratio",
            "job_id_stage:flopwatch_stage_imbalance:ratio")
TICKET = "FlopWatchPipelineImbalance"
SCENARIO = {
    "name": "report-step-time", "seed": 5, "duration": f"{MINUTES}m", "scrape_interval": "5s",
    "fleet": {"nodes": 6, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
    "jobs": [
        {"id": "llm-pp4", "nodes": "0-3", "user": "alice", "tokens_per_step": 1048576, "target_mfu": 0.4,
         "model": LLAMA_8B, "step_jitter": 0.02, "sequence_imbalance": 0.3,
         "pipeline": {"stages": 4, "stage_weights": [1.0, 1.0, 1.0, 1.4], "micro_batches": 8}},
        {"id": "llm-dp", "nodes": "4-5", "user": "bob", "tokens_per_step": 524288, "target_mfu": 0.4,
         "model": LLAMA_8B, "step_jitter": 0.02},
    ],
    "faults": [],
}


def write_series(url: str, name: str, labels: dict[str, str], times: np.ndarray, values: np.ndarray) -> None:
    label_bytes = remote_write.encode_labels(remote_write.sorted_labels(name, labels))
    remote_write.post(url + "/api/v1/write", remote_write.encode_request(
        [label_bytes], values[None, :], np.ones((1, len(values)), dtype=bool), np.rint(times * 1000).astype(np.int64)))


def write_rule_results(url: str, result: RunResult, interval: float) -> None:
    """What a Prometheus evaluating the rules would hold besides the raw series: the recorded
    series the engine evaluated, and ALERTS for the ticket (pending, then firing until the end)."""
    for name, items in result.observed.items():
        for labels, times, values in items:
            write_series(url, name, {k: v for k, v in labels.items() if k != "__name__"}, times, values)
    end = result.start_unix + result.scenario.duration
    for episode in result.episodes:
        labels = {k: v for k, v in episode.labels.items()}
        resolved = episode.resolved_at or end + interval
        for state, lo, hi in (("pending", episode.active_at, episode.fired_at), ("firing", episode.fired_at, resolved)):
            times = np.arange(lo, min(hi, end + 1e-6), interval)
            if times.size:
                write_series(url, "ALERTS", {**labels, "alertstate": state}, times, np.ones(times.size))


@pytest.fixture(scope="module")
def fleet_with_rules(tmp_path_factory):
    """The scenario through the rules, and a Prometheus holding what a live one would; yields the
    Prometheus URL, the engine's result and the report directories (whole window, first minutes)."""
    scenario = parse(SCENARIO)
    shipped = bench_rules.load(resources.folder("alerts"), 15.0)
    wanted = bench_rules.RuleSet([r for r in shipped.rules if r.kind == "record" or r.name == TICKET], shipped.files)
    result = PrometheusEngine(wanted, observe=RECORDED).run(scenario)
    ticket_interval = next(r.interval for r in shipped.alerting if r.name == TICKET)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d",
                    extra_args=["--storage.tsdb.retention.time=10y"]) as prom:
        load(Fleet(scenario, start_unix=START_UNIX), prom.url, round(scenario.duration / scenario.scrape_interval))
        write_rule_results(prom.url, result, ticket_interval)
        whole = report(prom.url, START_UNIX, START_UNIX + scenario.duration, tmp_path_factory.mktemp("whole"))
        short = report(prom.url, START_UNIX, START_UNIX + 8 * 60, tmp_path_factory.mktemp("short"))
    return result, whole, short


def rule_mean(result: RunResult, name: str, job_id: str, **match: str) -> float:
    """The rule's mean over the window (its evaluations are evenly spaced and the job steps at an
    even pace, so the step-time weighted mean is the plain mean)."""
    values = [v[np.isfinite(v)] for labels, _, v in result.observed[name]
              if labels.get("job_id") == job_id and all(labels.get(k) == x for k, x in match.items())]
    return float(np.concatenate(values).mean())


def test_the_shares_of_step_time_lost_are_the_rules_and_near_the_truth(fleet_with_rules):
    result, whole, _ = fleet_with_rules
    table = rows(whole / "step_time_by_job.csv")
    assert set(table) == {"llm-pp4", "llm-dp"}
    figures = {}
    for job_id, job in result.truth["jobs"].items():
        row = table[job_id]
        lost = float(row["lost"])
        assert lost == pytest.approx(rule_mean(result, RECORDED[0], job_id), abs=0.005), job_id
        assert lost == pytest.approx(job["lost"]["share"], abs=0.05), job_id
        assert float(row["slowdown"]) == pytest.approx(1 / (1 - lost), rel=1e-3), job_id
        for cls in ("worker", "stage", "scattered"):
            share = float(row[cls])
            assert share == pytest.approx(rule_mean(result, RECORDED[1], job_id, **{"class": cls}), abs=0.005)
            assert share == pytest.approx(job["lost"]["by_class"][cls], abs=0.05), (job_id, cls)
            figures[f"{job_id} {cls}"] = f"{100 * share:.1f}% (truth {100 * job['lost']['by_class'][cls]:.1f}%)"
        figures[f"{job_id} lost"] = f"{100 * lost:.1f}% (truth {100 * job['lost']['share']:.1f}%)"
        # step-hours covered: the job's ranks stepping for (nearly) the whole window
        assert 0.9 * job["ranks"] * MINUTES / 60 <= float(row["covered_hours"]) <= job["ranks"] * MINUTES / 60
    pipeline = table["llm-pp4"]
    assert pipeline["slowest_stage"] == str(result.truth["jobs"]["llm-pp4"]["slow_stage"]) == "3"
    assert float(pipeline["slowest_by"]) == pytest.approx(0.4, abs=0.05)   # stage weight 1.4
    assert table["llm-dp"]["slowest_stage"] == "" and table["llm-dp"]["tickets"] == "0"
    print("where the step time goes:", figures)


def test_the_stage_ticket_names_the_slow_stage(fleet_with_rules):
    result, whole, _ = fleet_with_rules
    tickets = list(rows(whole / "stage_tickets.csv", "stage").values())
    assert [(t["job_id"], t["stage"]) for t in tickets] == [("llm-pp4", "3")]
    fired = next(e for e in result.episodes if e.alertname == TICKET).fired_at
    assert tickets[0]["start"] and float(tickets[0]["slower"]) == pytest.approx(0.4, abs=0.05)
    assert float(tickets[0]["duration"]) == pytest.approx(START_UNIX + MINUTES * 60 - fired, abs=60)


def test_recommendations_say_what_to_do(fleet_with_rules):
    _, whole, _ = fleet_with_rules
    markdown = (whole / "report.md").read_text()
    recommendations = markdown[markdown.index("## Recommendations"):].split("\n## ")[0]
    assert "Job llm-pp4: pipeline stage 3 is 40% slower than the fastest stage, FlopWatchPipelineImbalance " \
           "ticket for" in recommendations
    assert "repartition its layers (move layers out of stage 3" in recommendations
    assert "Job llm-pp4: scattered imbalance" in recommendations and "pack sequences by length" in recommendations
    assert "bad workers" not in recommendations and "llm-dp" not in recommendations  # both under 5%
    # its straggler badput is imbalance, not slow GPUs: the goodput line must not send anyone to drain nodes
    assert "most of the waiting is stage imbalance" in recommendations
    assert "drain the slow GPUs" not in recommendations
    assert "## Where the step time goes" in markdown
    html = (whole / "report.html").read_text()
    assert 'id="step_time"' in html and "Pipeline-stage tickets" in html


def test_too_little_step_time_makes_no_recommendation(fleet_with_rules):
    """8 minutes of 32 ranks are 4.3 step-hours, under the tenth of min_gpu_hours (10) a share of
    step time needs: the figures are shown, the recommendations say they cover too little."""
    _, _, short = fleet_with_rules
    table = rows(short / "step_time_by_job.csv")
    assert float(table["llm-pp4"]["covered_hours"]) < 10 and float(table["llm-pp4"]["stage"]) > 0.05
    markdown = (short / "report.md").read_text()
    recommendations = markdown[markdown.index("## Recommendations"):].split("\n## ")[0]
    assert "pipeline stage" not in recommendations and "scattered imbalance" not in recommendations
    assert "too little" in recommendations


def test_straggler_badput_counts_waiting_step_by_step_as_the_rules_do(fleet_with_rules):
    """With the rules' per-step measure recorded, the report's straggler badput counts the waits a
    moving slowest rank causes (window averages of arrivals miss them): within 1 pp of the truth."""
    result, whole, _ = fleet_with_rules
    table = rows(whole / "goodput_by_job.csv")
    for job_id, job in result.truth["jobs"].items():
        true_share = job["badput_seconds"].get("straggler", 0.0) / job["allocated_seconds"]
        reported = float(table[job_id]["straggler"])
        assert reported == pytest.approx(true_share, abs=0.01), (job_id, reported, true_share)
