"""The report's PromQL: catalogue names only, the cluster label kept, sized by the grid."""

from __future__ import annotations

import re

import yaml

from flopwatch import resources
from flopwatch.catalog import by_name
from flopwatch.report import queries
from flopwatch.report.queries import ALERTS_STRAGGLER, QueryBuilder, probe_queries
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import Window, grid_for

WEEK = Window(1_790_000_000.0 - 7 * 86400, 1_790_000_000.0)


def every_query(settings: ReportSettings, spacing: float = 15.0) -> list:
    grid = grid_for(WEEK, spacing)
    p = QueryBuilder(settings, WEEK, grid, spacing)
    nodes = {name: ["node0001", "node.2"] for name in ("lost_candidates", "nvlink_candidates", "ib_candidates",
                                                       "pcie_candidates", "ecc_candidates")}
    return [*p.range_queries(), *p.counter_queries(), *p.total_queries(WEEK), *p.hardware_candidates(),
            *p.hardware_ranges(nodes),
            *p.total_queries(WEEK.previous(), "prev_"), *p.previous_range_queries(grid), p.straggler_arrivals(),
            p.straggler_alerts(), p.power_fallback(), *probe_queries(settings, WEEK), *p.step_time_queries(),
            p.straggler_detail("d", "east", "job-1", "3", "node0001", "2", WEEK.end - 7200, WEEK.end),
            p.gpu_job("o", "east", "node0001", "2", WEEK.end)]


def test_only_catalogue_names():
    known = set(by_name())
    for query in every_query(ReportSettings()):
        names = set(re.findall(r"(?<![:\w])flopwatch_[a-z0-9_]+(?!:)", query.expr))   # not level:metric:op
        assert names <= known, (query.name, names - known)


def test_recorded_series_and_alerts_are_the_shipped_rules():
    """The rules' results the report reads (a renamed rule would leave the report empty-handed)."""
    rules = [rule for path in resources.rule_files() for group in yaml.safe_load(path.read_text())["groups"]
             for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    alerts = {rule["alert"] for rule in rules if "alert" in rule}
    used = " ".join(q.expr for q in every_query(ReportSettings()))
    assert set(re.findall(r"[a-z_]+:flopwatch_[a-z0-9_]+:[a-z0-9_]+", used)) <= recorded
    assert {queries.STEP_TIME_LOST, queries.STEP_TIME_LOST_BY_CLASS, queries.STAGE_IMBALANCE} <= recorded
    assert set(re.findall(r'alertname="(\w+)"', used)) == {"FlopWatchStraggler", "FlopWatchPipelineImbalance"} <= alerts
    classes = {rule.get("labels", {}).get("class") for rule in rules
               if rule.get("record") == queries.STEP_TIME_LOST_BY_CLASS}
    assert classes == {"worker", "stage", "scattered"}


def test_every_aggregation_keeps_the_cluster_label():
    for query in every_query(ReportSettings(cluster_label="site")):
        for grouping in re.findall(r"\b(?:by|on) \(([^)]*)\)", query.expr):
            if query.name.startswith(("detail", "o")) or grouping in ("job_id, user",):
                continue
            assert grouping.split(", ")[0] == "site", (query.name, grouping)


def test_names_are_unique_and_balanced():
    queries = every_query(ReportSettings())
    names = [q.name for q in queries]
    assert len(names) == len(set(names))
    for query in queries:
        assert query.expr.count("(") == query.expr.count(")"), query.name
        assert query.expr.count("{") == query.expr.count("}"), query.name


def test_ranges_follow_the_grid_and_the_window():
    grid = grid_for(WEEK, 15)
    p = QueryBuilder(ReportSettings(), WEEK, grid, 15)
    assert grid.step == 3600 and "[3599999ms]" in next(q for q in p.range_queries() if q.name == "busy").expr
    total = next(q for q in p.total_queries(WEEK) if q.name == "energy_total")
    assert "[604800s]" in total.expr and total.at == WEEK.end
    prev = {q.name: q for q in p.total_queries(WEEK.previous(), "prev_")}
    assert prev["prev_energy_total"].at == WEEK.start
    assert prev["prev_alloc_samples"].expr.startswith(
        "sum by (cluster) (count_over_time(flopwatch_gpu_job_info[604800s]")
    totals = {q.name: q.expr for q in p.total_queries(WEEK)}
    assert totals["alloc_samples"].startswith("sum by (cluster, job_id, user) (count_over_time(")
    assert 'sum_over_time(flopwatch_gpu_peak_dense_flops{dtype="bf16"}[604800s])' in totals["peak_samples"]
    xid = next(q for q in p.counter_queries() if q.name == "xid")
    assert xid.start == grid.first - grid.step  # one bucket of baseline before the window


def test_dtype_thresholds_and_sparse_samples():
    settings = ReportSettings(dtype="fp8")
    queries = {q.name: q.expr for q in every_query(settings)}
    assert 'dtype="fp8"' in queries["peak"]
    assert ">= 0.1" in queries["busy"]
    assert "flopwatch_train_steps_total" in queries["straggler_arrivals"]
    assert "last_over_time" not in queries["gpus"]
    sparse = {q.name: q.expr for q in every_query(settings, spacing=600)}
    assert "last_over_time(flopwatch_gpu_up[1201s])" in sparse["gpus"]


def test_hardware_ranges_only_for_candidate_nodes():
    grid = grid_for(WEEK, 15)
    p = QueryBuilder(ReportSettings(), WEEK, grid, 15)
    assert p.hardware_ranges({}) == []
    ranges = {q.name: q for q in p.hardware_ranges({"nvlink_candidates": ["n1", "n1", "n.2"],
                                                     "ecc_candidates": ["n3"]})}
    assert set(ranges) == {"nvlink_bad", "ecc"}
    assert 'node=~"n\\\\.2|n1"' in ranges["nvlink_bad"].expr   # sorted, once each, regex-escaped
    assert ranges["ecc"].start == grid.first - grid.step


def test_straggler_detail_names_the_rank_and_its_node():
    detail = every_query(ReportSettings())[-2].expr
    assert 'job_id="job-1", rank="3"' in detail
    assert 'node="node0001", gpu="2"' in detail
    assert detail.count("label_replace(") == 13
    assert "[7200s]" in detail
    alerts = next(q for q in every_query(ReportSettings()) if q.name == "straggler_alerts")
    assert ALERTS_STRAGGLER in alerts.expr and "cause" in alerts.expr
