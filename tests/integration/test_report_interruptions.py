"""The report's interruptions and checkpoint advice against a simulated job with drawn failures.

Llama 3's failure mix at 6,000x its rate on a 32-GPU job for 3 hours (tens of interruptions would
take years at the real rate): the shipped rules run over the simulated samples in the detection
benchmark's engine, and what a live Prometheus would hold (the raw series and the recorded ones) is
remote-written into the Prometheus the report reads. The report must count the interruptions and
their causes as drawn, read ETTR within 1 pp of the truth, measure the save cost the scenario set,
and recommend the Young/Daly interval sqrt(2 x C x MTBF) within 10% of the one computed from the
scenario's checkpoint cost and the failures it drew (their count over the time the job ran).
"""

from __future__ import annotations

import math

import pytest

from flopwatch import resources
from flopwatch.detect import interruptions
from flopwatch.detect import rules as bench_rules
from flopwatch.detect.engine import START_UNIX, PrometheusEngine
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus
from tests.integration.test_report_step_time import write_rule_results
from tests.integration.test_report_week import LLAMA_8B
from tests.integration.test_report_windows import load, report, rows

pytestmark = pytest.mark.integration

SAVE_S = 30.0
DURATION_S = 3 * 3600
SCENARIO = {
    "name": "report-interruptions", "seed": 8, "duration": "3h", "scrape_interval": "5s",
    "fleet": {"nodes": 4, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
    "jobs": [{"id": "llm", "nodes": "0-3", "user": "alice", "tokens_per_step": 524288, "target_mfu": 0.4,
              "model": LLAMA_8B, "step_jitter": 0.02, "checkpoint_every": "10m", "checkpoint_seconds": SAVE_S}],
    "failures": {"preset": "llama3", "rate_scale": 6000, "detect": "1m", "restart": "4m"},
}
RECORDED = ("job_id:flopwatch_ettr:ratio", "job_id:flopwatch_badput:ratio", "job_id:flopwatch_step_time_lost:ratio",
            *interruptions.OBSERVED)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    scenario = parse(SCENARIO)
    shipped = bench_rules.load(resources.folder("alerts"), 15.0)
    wanted = bench_rules.RuleSet([r for r in shipped.rules if r.kind == "record"], shipped.files)
    result = PrometheusEngine(wanted, observe=RECORDED).run(scenario)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d",
                    extra_args=["--storage.tsdb.retention.time=10y"]) as prom:
        load(Fleet(scenario, start_unix=START_UNIX), prom.url, round(scenario.duration / scenario.scrape_interval))
        write_rule_results(prom.url, result, 15.0)
        out = report(prom.url, START_UNIX, START_UNIX + scenario.duration, tmp_path_factory.mktemp("report"))
    return result.truth["jobs"]["llm"], out


def test_interruptions_their_causes_and_ettr_are_the_truths(reported):
    truth, out = reported
    row = rows(out / "interruptions_by_job.csv")["llm"]
    # one that starts in the last minutes is not an interruption yet (the threshold has not passed)
    drawn = [i for i in truth["interruptions"] if i["start"] < DURATION_S - 300]
    assert int(row["interruptions"]) == len(drawn) >= 8
    causes = {}
    for item in drawn:
        causes[item["telemetry_cause"]] = causes.get(item["telemetry_cause"], 0) + 1
    assert row["causes"] == ", ".join(f"{c} {n}" for c, n in sorted(causes.items()))
    assert float(row["ettr"]) == pytest.approx(truth["ettr"], abs=0.01)
    restarted = [i["restart_seconds"] for i in drawn if i["restart_seconds"] is not None]
    assert float(row["restart"]) == pytest.approx(sum(restarted) / len(restarted), rel=0.1)


def test_the_recommended_interval_is_young_daly_of_the_true_cost_and_failures(reported):
    truth, out = reported
    advice = rows(out / "checkpoint_advice.csv")["llm"]
    assert float(advice["save"]) == pytest.approx(SAVE_S, rel=0.01)
    drawn = [i for i in truth["interruptions"] if i["start"] < DURATION_S - 300]
    true_mtbf = truth["allocated_seconds"] / len(drawn)
    assert advice["mtbf_source"] == "its own"
    assert float(advice["mtbf"]) == pytest.approx(true_mtbf, rel=0.1)
    assert float(advice["optimal"]) == pytest.approx(math.sqrt(2 * SAVE_S * true_mtbf), rel=0.1)
    assert float(advice["gain"]) > 0


def test_goodput_and_each_badput_cause_of_an_interrupted_job_are_the_truths(reported):
    truth, out = reported
    row = rows(out / "goodput_by_job.csv")["llm"]
    assert float(row["goodput"]) == pytest.approx(truth["goodput"], abs=0.01)
    for cause in ("lost_progress", "restart", "checkpoint"):
        assert float(row[cause]) == pytest.approx(truth["badput"].get(cause, 0.0), abs=0.01), cause
