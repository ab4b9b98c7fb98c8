"""bench/scale_prometheus.py --engine prometheus,victoriametrics on a tiny fleet (2 nodes, 16 GPUs):
the same simulated fleet and rule files measured through Prometheus and then through
VictoriaMetrics + vmalert, every figure present and sane for both, on both releases (the
`server_release` matrix: Debian's packages, and the current ones built by scripts/build-servers.sh).

The rule files are the shipped ones with every group at 5 s (one at 10 s, to see each group's own
interval honoured), so that every group runs inside a few seconds' window, and one alert given
`keep_firing_for`, which Debian's vmalert 1.79 does not know: on it the benchmark must take the
field out and say so rather than stop; the current vmalert (1.151) evaluates it, nothing removed.
Only the GPUs are simulated; Prometheus, VictoriaMetrics, vmalert and Alertmanager (Debian packages
`prometheus`, `victoria-metrics`, `prometheus-alertmanager`, or the current builds) are real.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flopwatch.stack import releases
from flopwatch.stack.vmalert_rules import dry_run, vmalert_rules

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SLOWER_GROUP = "flopwatch-agent"


def tiny_rules(folder: Path) -> dict[str, float]:
    """The shipped rule files at 5 s per group (SLOWER_GROUP at 10 s), one alert given a field
    vmalert 1.79 rejects; group name -> interval written."""
    folder.mkdir()
    intervals = {}
    for source in sorted((ROOT / "alerts").glob("flopwatch-*.yml")):
        doc = yaml.safe_load(source.read_text())
        for group in doc["groups"]:
            intervals[group["name"]] = 10.0 if group["name"] == SLOWER_GROUP else 5.0
            group["interval"] = f"{intervals[group['name']]:g}s"
            if group["name"] == SLOWER_GROUP:
                next(rule for rule in group["rules"] if "alert" in rule)["keep_firing_for"] = "1m"
        (folder / source.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return intervals


def test_both_engines_measured_on_the_same_fleet(server_release: str, tmp_path: Path) -> None:
    for program in ("prometheus", "victoria-metrics", "vmalert", "alertmanager"):
        releases.binary(program)
    intervals = tiny_rules(tmp_path / "rules")
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "bench.scale_prometheus", "--nodes", "2", "--seconds", "10",
                           "--warmup", "6", "--skip-tsdb", "--engine", "prometheus,victoriametrics",
                           "--rules", str(tmp_path / "rules"), "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    prom, vm = results["serve"], results["serve_victoriametrics"]
    ratio = results["ratio_victoriametrics_to_prometheus"]

    assert (prom["engine"], vm["engine"]) == ("prometheus", "victoriametrics")
    # the same fleet, every target scraped by both: the same series per node, none failed
    assert vm["targets"] == 2 and vm["failed_scrapes_with_rules"] == prom["failed_scrapes_with_rules"] == 0
    assert vm["series_per_node"] == prom["series_per_node"] > 100
    assert prom["head_series"] >= 2 * prom["series_per_node"]
    rounds = vm["samples_per_s_scrape_only"] * vm["window_s_scrape_only"] / (2 * vm["series_per_node"])
    assert 0.9 <= rounds <= vm["window_s_scrape_only"] / 5 + 1.1  # whole scrapes of both nodes in the window
    assert ratio["series_per_node"] == 1.0

    # every group of every rule file evaluated by both, at its own interval, none missed
    assert set(vm["groups"]) == set(prom["groups"]) == set(intervals)
    for engine in (prom, vm):
        for name, group in engine["groups"].items():
            assert group["interval_s"] == intervals[name], (engine["engine"], name)
            assert group["iterations_run"] >= 1 and group["missed"] == 0, (engine["engine"], name, group)
            # durations as the engines report them (how long is the machine's, not asserted)
            assert 0 < group["duration_mean_s"] <= group["duration_max_s"], (engine["engine"], name, group)
        assert engine["missed_iterations"] == 0 and engine["rule_evaluation_failures"] == 0
        assert engine["rule_iterations_run_share"] > 0.7
        assert engine["load_average_1m_at_start"] >= 0 and engine["load_average_1m_at_end"] >= 0
        # the simulator (this process) serves every scrape in both windows
        assert engine["sim_cpu_pct_of_core_scrape_only"] > 0 and engine["sim_cpu_pct_of_core"] > 0
    assert vm["rules_in_error_at_end"] == []

    # CPU and memory of both of VictoriaMetrics' processes, and the ratios from them
    assert vm["vmalert_cpu_cores"] > 0 and vm["victoria_metrics_cpu_cores_with_rules"] > 0
    assert vm["cpu_cores_with_rules"] == pytest.approx(
        vm["vmalert_cpu_cores"] + vm["victoria_metrics_cpu_cores_with_rules"], abs=0.002)
    assert vm["rss_gib_max"] >= vm["victoria_metrics_rss_gib_max"] > 0 and prom["prometheus_rss_gib_max"] > 0
    assert ratio["cpu_cores_with_rules"] == pytest.approx(
        vm["cpu_cores_with_rules"] / prom["prometheus_cpu_cores_with_rules"], rel=0.02)

    # what vmalert 1.79 rejected was taken out and said, the rest evaluated; the current vmalert
    # evaluates every rule file whole
    if server_release == "debian":
        removed = [r for r in vm["vmalert_removed"] if r["file"] == "flopwatch-agent.yml"]
        assert [(r["group"], r["removed"]) for r in removed] == [(SLOWER_GROUP, "field keep_firing_for")]
        assert "keep_firing_for" in removed[0]["reason"]
    else:
        assert vm["vmalert_removed"] == []


#: What each release's vmalert refuses in test_vmalert_rules_takes_out_what_vmalert_rejects_and_says_why's
#: file (group, rule, what is removed), and how it words a bad expression (its own dry run's words).
ODD_REFUSED = {"debian": [("broken", "Kept", "field keep_firing_for"), ("broken", "a:b", "rule"),
                          ("offset", "*", "field query_offset")],
               "current": [("broken", "a:b", "rule"), ("offset", "*", "field query_offset")]}
BAD_EXPRESSION = {"debian": 'invalid expression for rule "broken"."a:b": bad prometheus expr: "rate(foo[5m]"',
                  "current": 'invalid expression for rule "a:b": bad MetricsQL expr: "rate(foo[5m]"'}


def test_vmalert_rules_takes_out_what_vmalert_rejects_and_says_why(server_release: str, tmp_path: Path) -> None:
    """1.79 and the current release word their complaints differently (`rule "group"."name"` and
    `rule "name"`); both are read to the same rule."""
    source = tmp_path / "flopwatch-odd.yml"
    source.write_text(yaml.safe_dump({"groups": [
        {"name": "broken", "rules": [{"record": "a:b", "expr": "rate(foo[5m]"},
                                     {"alert": "Kept", "expr": "up == 0", "keep_firing_for": "1m"}]},
        {"name": "offset", "query_offset": "1m", "rules": [{"record": "c:d", "expr": "sum(up)"}]},
    ]}))
    copies, removals = vmalert_rules([source], tmp_path / "out")
    assert sorted((r["group"], r["rule"], r["removed"]) for r in removals) == ODD_REFUSED[server_release]
    assert next(r["reason"] for r in removals if r["rule"] == "a:b").startswith(BAD_EXPRESSION[server_release])
    kept = yaml.safe_load(copies[0].read_text())
    assert [[rule.get("alert") or rule["record"] for rule in g["rules"]] for g in kept["groups"]] == [["Kept"], ["c:d"]]
    assert ("keep_firing_for" in kept["groups"][0]["rules"][0]) == (server_release == "current")
    assert dry_run(releases.binary("vmalert"), copies[0]) == []


def test_unknown_engine_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.scale_prometheus", "--engine", "prometheus,influx",
                           "--skip-serve", "--skip-tsdb"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("--engine: expected prometheus and/or victoriametrics, "
                                                         "comma-separated, each once")


def test_bad_fleet_sizes_are_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.scale_prometheus", "--nodes", "125,lots", "--skip-serve",
                           "--skip-tsdb"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("--nodes: expected node counts separated by commas, "
                                                         "got '125,lots'")
