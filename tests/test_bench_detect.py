"""Scoring of the detection benchmark against hand-made truth and alert episodes, and the suite
plumbing (loading, --quick). No servers: the end-to-end run is in tests/integration/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flopwatch.detect import detect
from flopwatch.detect.alerts import Episode
from flopwatch.detect.scoring import GRACE_S, alert_cause, classify, healthy_gpu_hours, score_scenario
from flopwatch.detect.summary import summarize
from flopwatch.sim.scenario import parse

START = 1_700_000_000.0
MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
SUITE = Path(__file__).resolve().parents[1] / "flopwatch" / "detect" / "scenarios"


def scenario(faults=(), jobs=None, duration="1h", nodes=4):
    return parse({
        "name": "hand-made", "duration": duration, "fleet": {"nodes": nodes, "gpus_per_node": 8},
        "jobs": jobs or [{"id": "j", "nodes": f"0-{nodes - 1}", "model": MODEL, "tokens_per_step": 262144,
                          "target_mfu": 0.4}],
        "faults": list(faults),
    })


def fault(index, kind, node, start, end, gpu=None, nic=None, cause="thermal", job="j", slowdown=0.05):
    return {"index": index, "kind": kind, "cause": cause, "node": f"node{node:04d}", "node_index": node,
            "gpu": gpu, "nic": nic, "device": f"mlx5_{nic}" if nic is not None else None, "job_id": job,
            "rank": None, "start": start, "end": end, "slowdown": slowdown, "xid": None}


def truth(faults, ranks=32, steps=1000, allocated=3600.0, gpu_hours=32.0, series=()):
    return {"gpu_hours": gpu_hours, "faults": faults,
            "jobs": {"j": {"ranks": ranks, "steps": steps, "allocated_seconds": allocated, "series": list(series)}}}


def episode(name, at, end=None, **labels):
    return Episode(name, {"alertname": name, **labels}, START + at - 10, START + at,
                   START + end if end is not None else None)


def straggler(at, node, gpu, cause, end=None):
    return episode("FlopWatchStraggler", at, end, node=f"node{node:04d}", gpu=str(gpu), job_id="j", cause=cause)


# -- classification ----------------------------------------------------------------------------
def test_alert_naming_the_faulty_gpu_in_time_is_a_true_detection_with_latency_and_cause():
    t = truth([fault(0, "thermal_throttle", 1, 300, 600, gpu=2)])
    score = score_scenario(scenario(), t, [straggler(325, 1, 2, "thermal", 620)], START)
    [f] = score.faults
    assert (f.detected, f.latency, f.cause_right, f.detected_by) == (True, 25, True, "FlopWatchStraggler")
    assert f.latency_target == 30 and f.within_target
    assert [(e.true, e.names_culprit) for e in score.episodes] == [(True, True)]


def test_wrong_gpu_on_the_right_node_is_a_false_alert_and_no_detection():
    t = truth([fault(0, "thermal_throttle", 1, 300, 600, gpu=2)])
    score = score_scenario(scenario(), t, [straggler(330, 1, 5, "thermal")], START)
    assert not score.faults[0].detected
    assert [e.true for e in score.episodes] == [False]


def test_alert_before_the_fault_or_after_the_grace_window_is_false():
    t = truth([fault(0, "power_cap", 1, 300, 600, gpu=2, cause="power")])
    early = straggler(290, 1, 2, "power")
    late = straggler(600 + GRACE_S + 5, 1, 2, "power")
    within = straggler(600 + GRACE_S - 5, 1, 2, "power")
    score = score_scenario(scenario(), t, [early, within, late], START)
    assert [e.true for e in score.episodes] == [False, True, False]


def test_wrong_cause_counts_as_detected_but_not_right():
    t = truth([fault(0, "power_cap", 1, 300, 600, gpu=2, cause="power")])
    score = score_scenario(scenario(), t, [straggler(320, 1, 2, "unknown"), straggler(340, 1, 2, "power")], START)
    f = score.faults[0]
    assert f.detected and f.latency == 20 and f.causes == ["unknown"] and f.cause_right is False


def test_node_fault_is_named_by_any_gpu_of_the_node_and_nic_fault_needs_the_device():
    faults = [fault(0, "dataloader_stall", 2, 300, 600, cause="dataloader"),
              fault(1, "slow_nic", 3, 900, 1200, nic=4, cause="nic")]
    episodes = [
        straggler(320, 2, 6, "dataloader"),
        episode("FlopWatchIbSymbolErrors", 950, node="node0003", device="mlx5_1"),   # another NIC: false
        straggler(960, 3, 0, "nic"),                                                  # right node, no NIC named
        episode("FlopWatchIbSymbolErrors", 1000, node="node0003", device="mlx5_4"),
    ]
    score = score_scenario(scenario(nodes=4), truth(faults), episodes, START)
    assert [(f.detected, f.latency) for f in score.faults] == [(True, 20), (True, 100)]
    assert [e.true for e in score.episodes] == [True, False, True, True]
    assert score.faults[1].cause_right


def test_hardware_alerts_imply_their_cause_and_throttling_maps_its_reason():
    assert alert_cause(episode("FlopWatchGpuLost", 1, node="n", gpu="1")) == "gpu_lost"
    assert alert_cause(episode("FlopWatchGpuXidCritical", 1, node="n", gpu="1", xid="48")) == "xid"
    assert alert_cause(episode("FlopWatchGpuXidCritical", 1, node="n", gpu="1", xid="79")) == "gpu_lost"
    assert alert_cause(episode("FlopWatchGpuThrottled", 1, node="n", gpu="1", reason="sw_power_cap")) == "power"
    assert alert_cause(episode("FlopWatchNvlinkErrors", 1, node="n", gpu="1")) == "nvlink"
    assert alert_cause(episode("FlopWatchStraggler", 1, node="n", gpu="1", cause="pcie")) == "pcie"
    assert alert_cause(episode("FlopWatchSomethingNew", 1)) is None


def test_cause_is_judged_on_the_first_firing_step_only():
    t = truth([fault(0, "gpu_lost", 1, 300, 600, gpu=4, cause="gpu_lost")])
    both = [episode("FlopWatchGpuXidCritical", 315, node="node0001", gpu="4", xid="63"),
            episode("FlopWatchGpuLost", 315, node="node0001", gpu="4")]
    assert score_scenario(scenario(), t, both, START).faults[0].cause_right
    later = [both[0], episode("FlopWatchGpuLost", 345, node="node0001", gpu="4")]
    f = score_scenario(scenario(), t, later, START).faults[0]
    assert f.causes == ["xid"] and not f.cause_right


def test_job_level_alerts_are_true_only_while_a_fault_of_their_job_is_on():
    t = truth([fault(0, "gpu_lost", 1, 300, 600, gpu=4, cause="gpu_lost")])
    stalled = episode("FlopWatchTrainingStalled", 400, job_id="j")
    other_job = episode("FlopWatchTrainingStalled", 400, job_id="other")
    healthy_time = episode("FlopWatchTrainingStalled", 2000, job_id="j")
    score = score_scenario(scenario(), t, [stalled, other_job, healthy_time], START)
    assert [(e.located, e.true) for e in score.episodes] == [(False, True), (False, False), (False, False)]
    assert not score.faults[0].detected  # a job-level alert names no culprit


def test_long_steps_get_a_three_step_latency_target():
    t = truth([fault(0, "hw_slowdown", 1, 300, 900, gpu=0, cause="hw_slowdown")], steps=100, allocated=1800.0)
    f = score_scenario(scenario(), t, [straggler(340, 1, 0, "hw_slowdown")], START).faults[0]
    assert f.step_seconds == 18 and f.latency_target == 54 and f.within_target


def test_classify_picks_the_fault_the_alert_names_when_two_overlap():
    faults = [fault(0, "host_cpu_contention", 1, 300, 600, cause="host_cpu"),
              fault(1, "thermal_throttle", 1, 310, 600, gpu=3)]
    scored = classify(straggler(330, 1, 3, "thermal"), faults, START)
    assert scored.true and scored.fault in (0, 1) and scored.names_culprit


# -- GPU-hours and MFU -------------------------------------------------------------------------
def test_healthy_gpu_hours_leave_out_fault_windows_and_their_grace():
    sc = scenario(duration="2h")
    t = truth([fault(0, "thermal_throttle", 1, 1800, 2400, gpu=2)])
    expected = 32 * (7200 - (600 + GRACE_S)) / 3600
    assert healthy_gpu_hours(sc, t) == pytest.approx(expected)


def test_mfu_error_compares_means_over_steady_stretches():
    sc = scenario(duration="1h")
    times = np.arange(5.0, 3600.1, 5.0)
    true_mfu = np.where((times // 5) % 2 == 0, 0.38, 0.42)      # noisy per tick, 0.40 on average
    series = [[t, m, 0.9] for t, m in zip(times, true_mfu, strict=True)]
    observed = [({"job_id": "j"}, START + times, np.full(times.shape, 0.403))]
    score = score_scenario(sc, truth([], series=series), [], START, observed)
    [stretch] = score.mfu
    assert (stretch.start, stretch.end) == (120.0, 3600.0)
    assert stretch.error_pp == pytest.approx(0.3, abs=0.01)


# -- the summary -------------------------------------------------------------------------------
def test_summary_counts_precision_recall_and_false_alerts_per_gpu_day():
    faults = [fault(0, "thermal_throttle", 1, 300, 600, gpu=2), fault(1, "power_cap", 2, 900, 1200, gpu=1,
                                                                       cause="power")]
    episodes = [straggler(320, 1, 2, "thermal"), straggler(2500, 3, 0, "unknown")]
    score = score_scenario(scenario(), truth(faults, gpu_hours=48.0), episodes, START)
    s = summarize([score])
    assert (s["precision"], s["recall"], s["cause_accuracy"]) == (0.5, 0.5, 1.0)
    assert s["false_straggler_episodes"] == 1
    assert s["false_alerts_per_1000_gpu_days"] == pytest.approx(1 / 2 * 1000)
    assert s["by_kind"]["power_cap"] == {"faults": 1, "detected": 0, "cause_right": 0, "median_latency_s": None,
                                         "max_latency_s": None, "max_pages": None}
    met = {t["what"].split(" ")[0]: t["met"] for t in s["targets"]}
    assert met["precision"] is False and met["recall"] is False


def test_summary_headline_target_uses_5pct_faults_of_1024_gpu_jobs_only():
    t = truth([fault(0, "thermal_throttle", 17, 240, 660, gpu=3)], ranks=1024)
    score = score_scenario(scenario(nodes=128, jobs=[{"id": "j", "nodes": "0-127", "model": MODEL,
                                                      "tokens_per_step": 4194304, "target_mfu": 0.42}]),
                           t, [straggler(265, 17, 3, "thermal")], START)
    head = summarize([score])["targets"][0]
    assert head["measured"] == "25 s" and head["met"] is True


def test_summary_counts_slow_rank_faults_named_within_15_s_against_90_percent():
    t = truth([fault(0, "thermal_throttle", 1, 300, 600, gpu=2), fault(1, "power_cap", 2, 900, 1200, gpu=1,
                                                                      cause="power")])
    score = score_scenario(scenario(), t, [straggler(310, 1, 2, "thermal"), straggler(925, 2, 1, "power")], START)
    fast = [target for target in summarize([score])["targets"] if "within 15 s" in target["what"]]
    assert fast == [{"what": "90% of slow-rank faults named within 15 s", "measured": "1/2, 90th percentile 25 s",
                     "met": False}]
    quick = score_scenario(scenario(), t, [straggler(310, 1, 2, "thermal"), straggler(915, 2, 1, "power")], START)
    assert [target["met"] for target in summarize([quick])["targets"] if "within 15 s" in target["what"]] == [True]


# -- suite plumbing ----------------------------------------------------------------------------
def test_the_shipped_suite_covers_every_fault_kind_and_10000_healthy_gpu_hours():
    from flopwatch.sim.scenario import FAULT_KINDS

    suite = detect.load_suite(SUITE)
    kinds = {f.kind for s in suite for f in s.faults}
    assert kinds == set(FAULT_KINDS)
    assert any(s.fleet.nodes * s.fleet.gpus_per_node >= 1024 and any(f.slowdown == 0.05 for f in s.faults)
               for s in suite)
    healthy = 0.0
    for s in suite:  # truth-free estimate: job time outside fault windows (+ grace)
        fake = {"jobs": {}, "faults": []}
        for job in s.jobs:
            fake["jobs"][job.id] = {"ranks": len(job.nodes) * s.fleet.gpus_per_node}
        for f in s.faults:   # a switch or uplink fault: counted against every job (a lower bound)
            owners = [j.id for j in s.jobs if f.node is None or f.node in j.nodes]
            fake["faults"].append({"job_id": owners[0], "jobs": owners, "start": f.start, "end": f.end})
        healthy += healthy_gpu_hours(s, fake)
    assert healthy >= 10_000


def test_quick_cuts_small_scenarios_and_drops_large_ones():
    big = scenario(nodes=16)
    assert detect.quick(big) is None
    small = scenario(faults=[{"kind": "thermal_throttle", "node": 1, "gpu": 0, "start": "10m", "duration": "30m"},
                             {"kind": "power_cap", "node": 2, "gpu": 0, "start": "25m"}], duration="1h")
    cut = detect.quick(small)
    assert cut.duration == detect.QUICK_DURATION_S
    assert [(f.kind, f.end) for f in cut.faults] == [("thermal_throttle", detect.QUICK_DURATION_S)]


def test_load_suite_errors_are_one_line(tmp_path):
    with pytest.raises(detect.SuiteError, match="no scenario files"):
        detect.load_suite(tmp_path)
    (tmp_path / "bad.yml").write_text("name: x\nduration: 1h\nfleet: {nodes: 1}\njobs: [1]\n")
    with pytest.raises(detect.SuiteError, match=r"bad.yml: jobs\[0\]"):
        detect.load_suite(tmp_path)
    with pytest.raises(detect.SuiteError, match="no scenario matches nope"):
        detect.load_suite(SUITE, ["nope"])


def test_stage_tickets_and_job_figures_are_scored_against_truth():
    scenario = parse({"name": "pp", "duration": "30m", "fleet": {"nodes": 1},
                               "jobs": [{"id": "a", "nodes": "0", "tokens_per_step": 1e6, "target_mfu": 0.4,
                                         "model": {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128,
                                                   "seq_len": 8192},
                                         "pipeline": {"stages": 4, "stage_weights": [1, 1, 1, 2]}}]})
    truth = {"gpu_hours": 4.0, "faults": [], "jobs": {"a": {
        "ranks": 8, "steps": 10, "allocated_seconds": 1800, "series": [], "goodput": 0.7, "slow_stage": 3,
        "badput": {"straggler": 0.2}, "lost": {"culprit": "stage", "share": 0.25}}}}
    t = np.arange(0, 1800, 60.0) + 1000
    recorded = {"job_id:flopwatch_goodput:ratio": [({"job_id": "a"}, t, np.full(t.size, 0.705))],
                "job_id:flopwatch_badput:ratio": [({"job_id": "a", "cause": "straggler"}, t, np.full(t.size, 0.19)),
                                                  ({"job_id": "a", "cause": "data"}, t, np.full(t.size, 0.5))],
                "job_id:flopwatch_step_time_lost:ratio": [({"job_id": "a"}, t, np.full(t.size, 0.22))]}
    wrong = Episode("FlopWatchPipelineImbalance", {"job_id": "a", "stage": "2"}, 1300.0, 1900.0)
    right = Episode("FlopWatchPipelineImbalance", {"job_id": "a", "stage": "3"}, 1300.0, 1900.0)
    for episodes, ok in (([right], True), ([right, wrong], False), ([], False)):
        score = score_scenario(scenario, truth, episodes, 1000.0, recorded=recorded)
        job = score.jobs[0]
        assert job.stage_right is ok
        assert job.error_pp["goodput"] == pytest.approx(0.5)
        assert job.error_pp["straggler_badput"] == pytest.approx(1.0)   # the data badput is not mixed in
        assert job.error_pp["lost_share"] == pytest.approx(3.0)
        summary = summarize([score])
        assert summary["false_episodes"] == 0   # tickets are scored by stage, not as false alerts
        assert summary["imbalance_only_pages"] == 0


def test_trace_jobs_are_scored_against_the_study_in_their_own_row():
    jobs = [{"id": job, "nodes": str(i), "tokens_per_step": 1e6, "target_mfu": 0.4, "model": MODEL}
            for i, job in enumerate(("sim", "tr"))]
    sc = scenario(jobs=jobs, duration="30m", nodes=2)
    figures = {"goodput": 0.7, "badput": {"straggler": 0.2}, "lost": {"culprit": "stage", "share": 0.25}}
    truth = {"gpu_hours": 8.0, "faults": [], "jobs": {
        "sim": {"ranks": 8, "steps": 10, "allocated_seconds": 1800, "series": [], "slow_stage": None, **figures},
        "tr": {"ranks": 8, "steps": 10, "allocated_seconds": 1800, "series": [], "slow_stage": None,
               "source": "trace", **figures}}}
    t = np.arange(0, 1800, 60.0) + START

    def series(sim: float, tr: float) -> list:
        return [({"job_id": "sim"}, t, np.full(t.size, sim)), ({"job_id": "tr"}, t, np.full(t.size, tr))]

    recorded = {"job_id:flopwatch_goodput:ratio": series(0.705, 0.67),      # the trace job 3 pp off
                "job_id:flopwatch_badput:ratio": [({**labels, "cause": "straggler"}, x, v)
                                                  for labels, x, v in series(0.198, 0.23)],
                "job_id:flopwatch_step_time_lost:ratio": series(0.26, 0.29)}   # 1 pp and 4 pp off
    summary = summarize([score_scenario(sc, truth, [], START, recorded=recorded)])
    rows = {row["what"]: row for row in summary["targets"]}
    physics = rows["goodput and straggler badput per job within 1 pp of truth (simulated jobs)"]
    assert physics["met"] is True and "goodput 0.50 pp worst" in physics["measured"]
    assert rows["share of step time lost per job within 5 pp of truth (simulated jobs)"]["measured"] == "1.00 pp worst"
    study = rows["share of step time lost within 5 pp of the study (trace jobs)"]
    assert (study["measured"], study["met"]) == ("4.00 pp worst", True)
    assert summary["trace_job_error_pp_max"]["goodput"] == pytest.approx(3.0)
    recorded["job_id:flopwatch_step_time_lost:ratio"] = series(0.26, 0.31)
    summary = summarize([score_scenario(sc, truth, [], START, recorded=recorded)])
    assert {r["what"]: r["met"] for r in summary["targets"]}[study["what"]] is False


def test_the_worker_a_traces_study_blames_is_a_fault_only_its_page_detects(tmp_path):
    from flopwatch.sim.fleet import Fleet
    from flopwatch.traces import whatif

    trace = whatif.shipped("AR")
    (tmp_path / "s.yml").write_text("")
    sc = parse({"name": "ar", "duration": "20m", "fleet": {"nodes": 2, "gpus_per_node": 8},
                "jobs": [{"id": "ar", "trace": str(trace), "loop": True}]}, str(tmp_path / "s.yml"))
    fleet = Fleet(sc)
    truth_dict = fleet.truth.as_dict()
    [blamed] = truth_dict["faults"]
    page = episode("FlopWatchStraggler", 40, node=blamed["node"], gpu=str(blamed["gpu"]), job_id="ar",
                   rank=str(blamed["rank"]), cause="unknown")
    other = episode("FlopWatchStraggler", 40, node="node0001", gpu="4", job_id="ar", rank="12", cause="unknown")
    neighbour = episode("FlopWatchStraggler", 40, node=blamed["node"], gpu=str(blamed["gpu"] + 1), job_id="ar",
                        cause="unknown")
    score = score_scenario(sc, truth_dict, [page, other, neighbour], START)
    [f] = score.faults
    assert f.detected and f.cause_right and f.latency == 40 and f.latency_target is None
    assert [e.true for e in score.episodes] == [True, False, False]
    assert not score.imbalance_only   # a bad worker: pages are expected


# -- fabric faults and pages -------------------------------------------------------------------
def switch_fault(index, kind, switch, start, end, uplink=None, cause="errors", jobs=("j",)):
    ports = [[f"node{n:04d}", "mlx5_1"] for n in range(4)]
    return {"index": index, "kind": kind, "cause": cause, "node": None, "node_index": None, "gpu": None,
            "nic": None, "device": None, "job_id": jobs[0] if jobs else None, "jobs": list(jobs), "rank": None,
            "start": start, "end": end, "slowdown": 0.5, "xid": None, "switch": switch, "level": "leaf",
            "uplink": uplink, "ports": ports}


def test_a_switch_alert_names_its_switch_fault_and_the_ports_beneath_are_true_symptoms():
    faults = [switch_fault(0, "switch_degrade", "leaf1-r1", 300, 900),
              switch_fault(1, "uplink_slow", "leaf2-r0", 1200, 1800, uplink="spine1", cause="congestion"),
              {**fault(2, "cable_flap", 3, 2000, 2300, nic=0, cause="nic"), "switch": "leaf1-r0"}]
    episodes = [
        episode("FlopWatchSwitchDegraded", 340, switch="leaf1-r1", level="leaf", cause="errors", severity="page"),
        episode("FlopWatchIbSymbolErrors", 330, node="node0002", device="mlx5_1", switch="leaf1-r1"),
        episode("FlopWatchIbSymbolErrors", 335, node="node0002", device="mlx5_0", switch="leaf1-r0"),  # other rail
        episode("FlopWatchUplinkDegraded", 1250, switch="leaf2-r0", uplink="spine2"),                   # wrong uplink
        episode("FlopWatchUplinkDegraded", 1260, switch="leaf2-r0", uplink="spine1"),
        episode("FlopWatchUplinkDegraded", 1270, switch="leaf2-r0"),     # several uplinks: named by its leaf
        episode("FlopWatchSwitchDegraded", 2030, switch="leaf1-r0", cause="flap"),        # one cable is no switch
        episode("FlopWatchIbLinkFlapping", 2040, node="node0003", device="mlx5_0", port="1", switch="leaf1-r0"),
        episode("FlopWatchJobCommSlow", 1300, job_id="j"),
    ]
    score = score_scenario(scenario(), truth(faults), episodes, START)
    assert [(e.located, e.true, e.names_culprit) for e in score.episodes] == [
        (True, True, True), (True, True, False), (True, False, False), (True, False, False), (True, True, True),
        (True, True, True), (True, False, False), (True, True, True), (False, True, False)]
    assert [(f.detected, f.latency, f.cause_right, f.latency_target) for f in score.faults] == [
        (True, 40, True, 60), (True, 60, True, 60), (True, 40, True, 60)]
    assert [f.target for f in score.faults] == ["switch leaf1-r1", "uplink leaf2-r0 -> spine1",
                                                "link mlx5_0 -> leaf1-r0"]
    rows = {t["what"]: t for t in summarize([score])["targets"]}
    named = rows["switch, uplink and cable faults named by the right switch or link within 60 s"]
    assert (named["measured"], named["met"]) == ("3/3", True)


def test_pages_per_fault_follow_the_inhibitions_and_a_storm_shows_as_a_number():
    from flopwatch.detect.pages import AlertmanagerConfig

    faults = [switch_fault(0, "switch_degrade", "leaf1-r1", 300, 900, cause="flap")]
    ports = [episode("FlopWatchIbLinkFlapping", 330, node=f"node{n:04d}", device="mlx5_1", port="1",
                     switch="leaf1-r1", severity="page") for n in range(4)]
    source = episode("FlopWatchSwitchDegraded", 330, switch="leaf1-r1", cause="flap", severity="page")
    stray = episode("FlopWatchIbLinkFlapping", 3000, node="node0009", device="mlx5_0", port="1", severity="page")
    config = {"route": {"receiver": "page", "group_by": ["job_id", "node"], "group_wait": "10s",
                        "group_interval": "1m"},
              "receivers": [{"name": "page"}],
              "inhibit_rules": [{"source_matchers": ['alertname="FlopWatchSwitchDegraded"'],
                                 "target_matchers": ['alertname=~"FlopWatchIb.*"'], "equal": ["switch"]}]}
    inhibited = score_scenario(scenario(), truth(faults), [source, *ports, stray], START,
                               alertmanager=AlertmanagerConfig.from_dict(config))
    assert (inhibited.faults[0].pages, inhibited.max_pages_per_fault, inhibited.false_pages) == (1, 1, 1)
    storm = score_scenario(scenario(), truth(faults), [source, *ports, stray], START,
                           alertmanager=AlertmanagerConfig.from_dict({**config, "inhibit_rules": []}))
    assert (storm.faults[0].pages, storm.max_pages_per_fault) == (5, 5)
    summary = summarize([storm])
    assert (summary["max_pages_per_fault"], summary["pages"], summary["false_pages"]) == (5, 5, 1)
    row = {t["what"]: t for t in summary["targets"]}["at most one page per switch or uplink fault (after the "
                                                     "shipped inhibitions)"]
    assert (row["measured"], row["met"]) == ("5 worst", False)
    assert summary["by_kind"]["switch_degrade"]["max_pages"] == 5
    assert score_scenario(scenario(), truth(faults), ports, START).faults[0].pages is None   # no config: not counted


def test_pages_are_counted_through_the_alertmanager_config_beside_the_rules_or_the_one_given(tmp_path):
    assert detect.alertmanager_config(None, tmp_path) is None             # no config beside: not counted
    shipped = SUITE.parents[2] / "alerts"
    assert detect.alertmanager_config(None, shipped).pager_receivers() == {"page"}
    (tmp_path / "am.yml").write_text("route: {receiver: pager, group_wait: soon}\n")
    with pytest.raises(detect.SuiteError, match=r"am\.yml: route\.group_wait: expected a duration"):
        detect.alertmanager_config(tmp_path / "am.yml", shipped)
