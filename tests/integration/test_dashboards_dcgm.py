"""Every dashboard panel on a Prometheus that scrapes only dcgm-exporter, against the panel table of
docs/dcgm-exporter.md: a panel the table says works on dcgm-exporter's default counters returns series
(with its legend's labels and its table columns) for a node on the default counters; one that needs
FlopWatch's counters file does so for a node on that file, and not all of it for the default-counters
node; a panel or query the table gives to the agent returns nothing. So the table cannot claim more,
or less, than the dashboards do.

Real: Prometheus (Debian package) with every rule file of alerts/, the panels' queries as Grafana sends
them (integration/dashboard_checks.py). Faked, because no GPU or DCGM runs here: dcgm-exporter itself,
its expositions rendered from its source's formats (tests/fixtures/dcgm_exporter/, served by
integration/dcgm_serving.py): a healthy node, and two that break (XID 79, a throttled GPU, a lost GPU,
ECC, NVLink, PCIe faults) after their healthy state is scraped, one on the default counters and one on
FlopWatch's counters file.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from flopwatch import dashboards
from flopwatch.promql import PromClient
from flopwatch.stack import Prometheus
from integration import dashboard_checks as checks
from integration.dcgm_serving import FIX, serve

pytestmark = pytest.mark.integration

DOC = checks.ROOT / "docs" / "dcgm-exporter.md"
NODES = {
    "healthy": FIX.Node(host="dgx01", generation="v4-Hostname", job="j1"),
    "default": FIX.Node(host="dgx08", generation="expfmt", job="j8"),
    "flopwatch": FIX.Node(host="dgx09", generation="v4-hostname", job="j9", opt_in=True),
}
DEFAULT, FLOPWATCH_CSV, AGENT = "default", "FlopWatch CSV", "agent only"


def variables(job: str, node: str) -> dict[str, dict[str, str]]:
    """What a user of one broken node picks on each dashboard (GPUs 3 and 5: the XID and the throttling)."""
    return {"flopwatch-fleet": {"job_id": ".*"},
            "flopwatch-job": {"job_id": job, "node": ".*", "gpu": ".*"},
            "flopwatch-node": {"node": node, "gpu": "(3|5)"},
            "flopwatch-network": {"node": node},
            "flopwatch-fabric": {"level": ".*", "switch": ".*"},
            "flopwatch-reliability": {"job_id": ".*", "node": node}}


ON_DEFAULT = checks.all_targets(variables("j8", "dgx08"))
ON_FLOPWATCH_CSV = checks.all_targets(variables("j9", "dgx09"))
#: Table columns dcgm-exporter cannot fill, and why (the doc's table says the same).
UNFILLED = {
    ("flopwatch-fleet", "FlopWatch alerts", "device"): "only the InfiniBand alerts carry device (agent NICs)",
    ("flopwatch-fleet", "FlopWatch alerts", "rank"): "only step-telemetry straggler alerts carry rank",
    ("flopwatch-fleet", "FlopWatch alerts", "cause"): "only straggler alerts carry cause; the gpu_clock one "
                                                       "needs minutes of a slow clock, longer than this test",
    ("flopwatch-fleet", "Jobs", "user"): "dcgm-exporter attributes no user",
    **{("flopwatch-node", "GPUs on this node", column): "model, UUID, driver and user come from the agent"
       for column in ("model", "uuid", "driver_version", "user")},
    ("flopwatch-reliability", "Lost GPUs", "job_id"): "a lost GPU's dcgm-exporter series, job labels with them, stop",
}
#: Telemetry MFU on dcgm-exporter reads three minute groups in a chain (dcgm-exporter's peaks, the
#: canonical peaks, telemetry MFU itself), each first run anywhere in its minute: up to three
#: minutes after the first scrapes.
DEADLINE_S = 210


def panel_table() -> dict[tuple[str, str], tuple[str, set[str]]]:
    """docs/dcgm-exporter.md's panel table: (uid, title) -> (class, refIds that need the agent)."""
    text = DOC.read_text()
    section = text[text.index("## Dashboard panels"):]
    table: dict[tuple[str, str], tuple[str, set[str]]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or " / " not in cells[0] or cells[0].startswith("dashboard"):
            continue
        uid, title = cells[0].split(" / ", 1)
        entry = (cells[1], set(re.findall(r"\b[A-Z]\b", cells[2])))
        assert table.setdefault((uid, title), entry) == entry, f"{cells[0]}: two rows that disagree"
        assert entry[0] in (DEFAULT, FLOPWATCH_CSV, AGENT), f"{cells[0]}: unknown class {entry[0]!r}"
    return table


TABLE = panel_table()


def test_the_table_lists_every_panel_once() -> None:
    built = {(uid, panel["title"]) for uid, dashboard in dashboards.build_all().items()
             for panel in dashboards.panels(dashboard)}
    assert set(TABLE) == built, f"missing: {built - set(TABLE)}; not a panel: {set(TABLE) - built}"


@pytest.fixture(scope="module")
def prometheus():
    with serve(NODES) as scrape:
        prom = Prometheus(scrape, rule_files=checks.RULE_FILES)
        try:
            prom.start()
            client, start = PromClient(prom.url), time.time()
            deadline = time.monotonic() + DEADLINE_S
            while not client.query("count(node_gpu:flopwatch_gpu_up:max == 1) >= 24"):
                assert time.monotonic() < deadline, "dcgm-exporter GPUs never came up"
                time.sleep(2)
            time.sleep(5)                   # the healthy state is in the TSDB before the faults
            NODES["default"].broken = NODES["flopwatch"].broken = True
            yield client, start
        finally:
            prom.stop()


def _split(targets: list[checks.Target], classes: tuple[str, ...]) -> tuple[list, list]:
    """(queries expected to work, queries the agent must feed) of the panels of `classes`."""
    works, agent = [], []
    for target in targets:
        kind, needs_agent = TABLE[target.key]
        if kind == AGENT or target.target["refId"] in needs_agent:
            agent.append(target)
        elif kind in classes:
            works.append(target)
    return works, agent


def test_panels_the_table_gives_dcgm_exporter_return_series(prometheus) -> None:
    client, start = prometheus
    on_default, _ = _split(ON_DEFAULT, (DEFAULT,))
    on_csv, _ = _split(ON_FLOPWATCH_CSV, (DEFAULT, FLOPWATCH_CSV))
    assert on_default and len(on_csv) > len(on_default)
    problems = checks.until_clean(client, start, on_default + on_csv, UNFILLED, DEADLINE_S)
    assert not problems, f"{len(problems)} queries fail on dcgm-exporter:\n" + "\n".join(problems)


def test_flopwatch_csv_panels_need_the_counters_file(prometheus) -> None:
    """Each panel marked FlopWatch CSV has a query that the default-counters node leaves empty."""
    client, start = prometheus
    checks.until_clean(client, start, _split(ON_FLOPWATCH_CSV, (FLOPWATCH_CSV,))[0], UNFILLED, DEADLINE_S)
    works, _ = _split(ON_DEFAULT, (FLOPWATCH_CSV,))
    empty = {t.key for t in works if not checks.run(client, start, t)[1]}
    assert empty == {t.key for t in works}, f"work on the default counters: {sorted({t.key for t in works} - empty)}"


def test_what_the_table_gives_the_agent_returns_nothing(prometheus) -> None:
    client, start = prometheus
    checks.until_clean(client, start, _split(ON_FLOPWATCH_CSV, (DEFAULT, FLOPWATCH_CSV))[0], UNFILLED,
                       DEADLINE_S)          # the rules have run and the faults are visible
    _, agent = _split(ON_DEFAULT + ON_FLOPWATCH_CSV, ())
    answering = sorted({f"{t.uid} / {t.panel['title']} / {t.target['refId']}"
                        for t in agent if checks.run(client, start, t)[1]})
    assert not answering, "the table says these need the agent, but dcgm-exporter feeds them:\n" + \
        "\n".join(answering)


def test_every_query_passes_promtool_parsing(tmp_path: Path) -> None:
    checks.promtool_parses(ON_FLOPWATCH_CSV, tmp_path)
