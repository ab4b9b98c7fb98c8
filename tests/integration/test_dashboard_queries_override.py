"""The dashboards and rules of an override config work together on a real Prometheus: every panel
query of `flopwatch rules build --config` (agent selector job="gpu-agents", fp16, other URLs) returns
series with its legend labels, as test_dashboard_queries.py checks for the defaults.

Prometheus (Debian package) scrapes the same simulated fleet twice: as job `gpu-agents`, the
selector, and as job `copy`, which the selector must leave out. A rule or panel that forgot the
selector would count every GPU's model FLOPs twice and read each job's MFU twice as high. Faked,
because they cannot run here: the GPUs, NICs and training ranks (flopwatch.sim).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flopwatch import dashboards
from flopwatch.mixin import build
from flopwatch.mixin.config import load
from flopwatch.promql import PromClient
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus
from integration import dashboard_checks as checks
from integration.fleets import serving
from integration.test_dashboard_queries import DEADLINE_S, SCENARIO, UNFILLED_COLUMNS, VARIABLES

pytestmark = pytest.mark.integration

OVERRIDE = 'selectors:\n  agent: job="gpu-agents"\ndtype: fp16\nurls:\n  docs: https://wiki.example.internal/gpu\n'


@pytest.fixture(scope="module")
def override(tmp_path_factory):
    root = tmp_path_factory.mktemp("override")
    (root / "fw.yml").write_text(OVERRIDE)
    config = load(root / "fw.yml")
    build.write(config, root / "alerts", root / "dashboards")
    return root


@pytest.fixture(scope="module")
def prometheus(override, tmp_path_factory):
    scenario = parse(SCENARIO)
    start = time.time()
    with serving(scenario, scenario.scrape_interval) as server:
        targets = server.write_file_sd(tmp_path_factory.mktemp("sim") / "targets.json")
        jobs = [{"job_name": name, "file_sd_configs": [{"files": [str(targets)]}]} for name in ("gpu-agents", "copy")]
        rules = sorted(p for p in (override / "alerts").glob("*.yml") if p.name != "alertmanager.yml")
        prom = Prometheus(jobs, rule_files=rules)
        try:
            prom.start()
            yield PromClient(prom.url), start
        finally:
            prom.stop()


def override_targets(override: Path) -> list[checks.Target]:
    out = []
    for path in sorted((override / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in dashboards.panels(board):
            for target in panel.get("targets", []):
                expr = checks.substitute(target["expr"], VARIABLES[board["uid"]])
                out.append(checks.Target(board["uid"], panel, target, expr))
    return out


def test_override_panel_queries_return_series_with_their_labels(override, prometheus) -> None:
    client, start = prometheus
    targets = override_targets(override)
    assert any("job='gpu-agents'" in t.expr for t in targets), "no panel reads a raw series: nothing checked"
    problems = checks.until_clean(client, start, targets, UNFILLED_COLUMNS, DEADLINE_S)
    assert not problems, f"{len(problems)} of {len(targets)} queries fail:\n" + "\n".join(problems)


def test_the_selector_keeps_the_copy_out_of_mfu(prometheus) -> None:
    """The rules' model FLOP/s of a job are the selected scrape job's, half of what both jobs report (the
    two scrape jobs sample at different moments, so the halves agree within a few percent; a rule without
    the selector would read twice as much). Compared at the rule's own evaluation (its group runs every
    15 s), once both jobs' series fill the rules' minute there: before that, rate() extrapolates each
    job's first samples differently and the halves can differ by 2x."""
    client, _ = prometheus
    rule = 'job_id:flopwatch_model_flops:rate1m{job_id="llm-a"}'
    queries = {"selected": 'sum(rate(flopwatch_train_model_flops_total{job="gpu-agents",job_id="llm-a"}[1m]))',
               "both": 'sum(rate(flopwatch_train_model_flops_total{job_id="llm-a"}[1m]))',
               "filled": 'min(count_over_time(flopwatch_train_model_flops_total{job_id="llm-a"}[1m]))'}
    deadline = time.monotonic() + DEADLINE_S + 60
    values: dict[str, float] = {}
    while time.monotonic() < deadline and not (len(values) == 4 and values["rule"] > 0 and values["filled"] >= 50):
        evaluated = client.query(f"timestamp({rule})")    # the rule and the raw sums see the same samples there
        if evaluated:
            at = evaluated[0].value
            values = {"rule": client.query(rule, at)[0].value}
            values |= {name: sample.value for name, query in queries.items() for sample in client.query(query, at)}
        time.sleep(1)
    assert len(values) == 4 and values["filled"] >= 50, values
    assert values["selected"] == pytest.approx(values["both"] / 2, rel=0.1)    # the copy is there ...
    assert values["rule"] == pytest.approx(values["selected"], rel=0.1)       # ... and the rule leaves it out
