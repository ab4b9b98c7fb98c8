"""`flopwatch demo --shards 2` end to end, at its smallest: two nodes, one per shard, and the demo's
first job (16 ranks) spanning both. Each shard is an HA pair of Prometheus servers; the global tier
(VictoriaMetrics behind the cluster's paths, vmalert) feeds the view and the report; two
Alertmanagers gossip. The thermal straggler the demo injects into the spanning job must page exactly
once (both replicas of its shard send the alert to both Alertmanagers), naming node, GPU, rank and
cause, and nothing else may page; `--json` is what a script reads to check that.

Current release only (Prometheus 3.16, Alertmanager 0.31, VictoriaMetrics and vmalert 1.151): the
HA pair and the Alertmanager cluster are tested on both releases by test_ha_pages.py, and the layout
on the current one by test_global_tier.py; this is the command line over them. The shard split is
checked first, without servers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from flopwatch.cli import main
from flopwatch.commands.demo_shards import shard_nodes
from flopwatch.commands.sim import load_scenario
from flopwatch.errors import UsageError
from flopwatch.stack.servers import REPLICA_LABEL

DURATION_S, INJECT_AFTER_S = 75, 10
#: The folders of the layout's server processes in the stack's folder (flopwatch.stack.sharded).
SERVERS = ("global-store", "vmalert", "alertmanager-1", "alertmanager-2",
           *(f"prometheus-shard-{k}-{r}" for k in (1, 2) for r in "ab"))


@pytest.mark.parametrize("shards", [2, 3, 4, 10])
def test_the_shards_are_contiguous_and_the_first_job_spans_them_all(shards: int) -> None:
    scenario = load_scenario("demo")
    split = shard_nodes(scenario, shards)
    first_job = set(scenario.jobs[0].nodes)
    assert list(split) == [f"shard-{k}" for k in range(1, shards + 1)]
    assert [node for nodes in split.values() for node in nodes] == list(range(scenario.fleet.nodes))
    assert all(nodes == list(range(nodes[0], nodes[-1] + 1)) for nodes in split.values())
    assert all(first_job & set(nodes) for nodes in split.values()), split


def test_a_split_the_first_job_cannot_span_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = load_scenario("demo")
    small = replace(scenario, jobs=[replace(scenario.jobs[0], nodes=[0, 1]), *scenario.jobs[1:]])
    with pytest.raises(UsageError, match=r"--shards 3: the first job \(llm-8b\) runs on 2 nodes"):
        shard_nodes(small, 3)
    assert shard_nodes(small, 2) == {"shard-1": [0], "shard-2": list(range(1, 16))}
    assert main(["demo", "--shards", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "flopwatch demo: --shards 1: the two-tier layout needs at least 2 shards (leave --shards out for one "
        "Prometheus)"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, str, Path]]:
    folder = tmp_path_factory.mktemp("demo-shards")
    pages, out = folder / "pages.json", folder / "report"
    result = subprocess.run(
        [sys.executable, "-m", "flopwatch", "demo", "--nodes", "2", "--shards", "2", "--duration", str(DURATION_S),
         "--inject-after", str(INJECT_AFTER_S), "--json", str(pages), "--out", str(out)],
        env={**os.environ, "COLUMNS": "120", "FLOPWATCH_SERVERS": "current", "FLOPWATCH_KEEP_STACK_DIRS": "1"},
        capture_output=True, text=True, timeout=300, check=False)
    kept = re.search(r"servers' files in (\S+);", result.stderr)   # kept for the checks below, then removed
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "demo summary" in result.stderr, result.stderr[-2000:]
        yield json.loads(pages.read_text()), result.stderr, out
    finally:
        if kept:
            shutil.rmtree(Path(kept.group(1)).parent, ignore_errors=True)


@pytest.mark.integration
def test_the_spanning_jobs_straggler_pages_exactly_once(demo: tuple[dict, str, Path]) -> None:
    summary, stderr, _ = demo
    assert "2 simulated nodes in 2 shards (shard-1: node0000, shard-2: node0001)" in stderr, stderr[:2000]
    assert summary["injected"] == "thermal_throttle on node0001 GPU 5 (job llm-8b), 8% slower"
    pages = [incident for incident in summary["incidents"] if incident["receiver"] == "page"]
    assert [(page["alertname"], page["job_id"], page["node"], page["gpu"], page["rank"], page["cause"])
            for page in pages] == [("FlopWatchStraggler", "llm-8b", "node0001", "5", "13", "thermal")], pages
    assert pages[0]["firing"] == 1, f"the straggler paged {pages[0]['firing']} times, from {pages[0]['senders']}"
    assert pages[0]["labels"]["shard"] == "shard-2" and REPLICA_LABEL not in pages[0]["labels"], pages[0]["labels"]


@pytest.mark.integration
def test_the_report_comes_from_the_global_tier_and_nothing_is_left_running(demo: tuple[dict, str, Path]) -> None:
    _, stderr, out = demo
    tier = re.search(r"global tier (http://127\.0\.0\.1:\d+/select/0/prometheus)", stderr)
    assert tier, stderr[:2000]
    report = re.search(r"report: (\S+report\.html)", stderr)
    assert report and Path(report.group(1)) == out / "report.html", stderr[-2000:]
    assert "llm-8b" in (out / "mfu_by_job.csv").read_text()
    folder = re.search(r"servers' files in (\S+);", stderr)
    assert folder and Path(folder.group(1)).name == "stack", stderr[:2000]
    started = [line for line in (Path(folder.group(1)) / name / "server.log" for name in SERVERS)
               if line.is_file()]
    assert len(started) == len(SERVERS), f"not every server of the layout ran: {started}"
    left = subprocess.run(["pgrep", "-f", folder.group(1)], capture_output=True, text=True, check=False).stdout
    assert not left.strip(), f"the demo left servers running: {left}"
