"""The rules hold at any scrape interval from 1s to 1m: built for 5s, 15s, 30s and 60s they pass
real promtool's checks on both releases, every range window holds at least two samples of its
source on Prometheus 3's left-open ranges (a raw series is scraped every `scrape_interval`, a
recorded one is written every evaluation of its group), goodput's tiled differences, their
offsets and divisors agree with their group's interval, FlopWatchScrapeIntervalTooCoarse's
promtool cases hold for each build, and a value out of range stops the build with one line
(exit 2). Real promtool (Debian package `prometheus`, and the current release's build)."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import program

from flopwatch.cli import main
from flopwatch.durations import format_duration
from flopwatch.mixin import build, scrape
from flopwatch.mixin.config import MixinConfig, ScrapeInterval, duration_seconds
from flopwatch.stack import releases

INTERVALS = ("5s", "15s", "30s", "60s")
on_both = pytest.mark.parametrize("release", releases.RELEASES)
_DURATION = r"(?:\d+(?:ms|[smhdwy]))+"
#: A range selector (`name{...}[w]`) and a subquery (`)[w:r]`), after rendering.
_RANGE = re.compile(rf"(?<![\w:])([a-zA-Z_:][\w:]*)(\{{[^}}]*\}})?\[({_DURATION})\]")
_SUBQUERY = re.compile(rf"\)\s*\[{_DURATION}:")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The rules folder of a build for each scrape interval."""
    out = {}
    for interval in INTERVALS:
        root = tmp_path_factory.mktemp(f"scrape{interval}")
        (root / "fw.yml").write_text(f"scrape_interval: {interval}\n")
        assert main(["rules", "build", "--config", str(root / "fw.yml"), "--out", str(root / "alerts")]) == 0
        out[interval] = root / "alerts"
    return out


def rule_files(alerts: Path) -> list[Path]:
    return sorted(p for p in alerts.glob("flopwatch-*.yml"))


def groups(alerts: Path) -> list[dict]:
    return [group for path in rule_files(alerts) for group in yaml.safe_load(path.read_text())["groups"]]


def _expr(rule: dict) -> str:
    return "\n".join(line for line in rule["expr"].split("\n") if not line.lstrip().startswith("#"))


def test_the_helper_keeps_the_written_windows_at_5s_and_widens_them_beyond() -> None:
    base, at15, at60 = scrape.Scrape(), scrape.Scrape(15), scrape.Scrape(60)
    assert [base.span(w) for w in ("30s", "1m", "2m", "1h")] == ["30s", "1m", "2m", "1h"]
    assert (base.tile, base.every("5s"), base.every("5s", 2), base.every("1m")) == ("15s", "5s", "10s", "1m")
    assert [at15.span(w) for w in ("30s", "1m", "2m")] == ["1m", "1m", "2m"]
    assert (at15.tile, at15.every("5s"), at15.every("5s", 2), at15.every("30s")) == ("30s", "15s", "30s", "30s")
    assert [at60.span(w) for w in ("30s", "1m", "2m", "5m")] == ["4m", "4m", "4m", "5m"]
    assert (at60.tile, at60.every("10s"), at60.every("5s", 2)) == ("2m", "1m", "2m")
    assert scrape.Scrape(7.5).tile == "15s" and scrape.Scrape(7.5).span("20s") == "30s"
    assert [scrape.Scrape(s).tile_seconds() for s in (5, 10, 60)] == [15, 20, 120]
    assert [format_duration(s) for s in (240, 90, 7.5, 3600, 0.5)] == ["4m", "1m30s", "7s500ms", "1h", "500ms"]


@pytest.mark.parametrize("seconds", [1, 1.5, 2, 5, 7, 10, 13, 15, 20, 30, 45, 59, 60])
def test_the_helper_windows_hold_their_samples_on_left_open_ranges(seconds: float) -> None:
    """floor(w / s): what a left-open range of length w holds at the least, samples s apart."""
    helper = scrape.Scrape(seconds)
    for written in ("30s", "1m", "2m", "5m"):
        assert math.floor(duration_seconds(helper.span(written)) / seconds) >= scrape.SPAN_SCRAPES
    tile = duration_seconds(helper.tile)
    assert math.floor(tile / seconds) >= scrape.TILE_SCRAPES and tile >= scrape.TILE_SECONDS
    assert duration_seconds(helper.every("5s")) >= seconds


@on_both
@pytest.mark.parametrize("interval", INTERVALS)
def test_promtool_accepts_the_rules_of_every_scrape_interval(builds: dict[str, Path], interval: str,
                                                            release: str) -> None:
    files = rule_files(builds[interval])
    result = subprocess.run([program("promtool", release), "check", "rules", *map(str, files)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files), result.stdout


@pytest.mark.parametrize("interval", INTERVALS)
def test_every_range_window_holds_two_samples_of_its_source(builds: dict[str, Path], interval: str) -> None:
    scraped = duration_seconds(interval)
    every: dict[str, float] = {}       # record -> the longest interval of a group that writes it
    for group in groups(builds[interval]):
        assert duration_seconds(group["interval"]) >= scraped, group["name"]
        for rule in group["rules"]:
            if "record" in rule:
                every[rule["record"]] = max(every.get(rule["record"], 0), duration_seconds(group["interval"]))
    checked = 0
    for group in groups(builds[interval]):
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            assert not _SUBQUERY.search(_expr(rule)), f"{name}: a subquery; count its samples here too"
            for series, _, window in _RANGE.findall(_expr(rule)):
                source = every[series] if ":" in series else scraped
                held = math.floor(duration_seconds(window) / source)
                assert held >= 2, f"{group['name']} / {name}: {series}[{window}] holds {held} at {interval}"
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("interval", INTERVALS)
def test_tiled_differences_offsets_and_divisors_follow_their_group(builds: dict[str, Path], interval: str) -> None:
    by_name = {group["name"]: group for group in groups(builds[interval])}
    goodput, interruptions = by_name["flopwatch-goodput"], by_name["flopwatch-interruptions"]
    tile = goodput["interval"]
    assert tile == scrape.Scrape.of(interval).tile
    exprs = {rule["record"]: _expr(rule) for rule in goodput["rules"] if "record" in rule}
    # the per-node phase, checkpoint, step and replayed step time: the tile before the evaluation,
    # one tile to two tiles back (every scrape in it has landed), on the group's own grid; at each
    # end, where a failed scrape left a stale marker, the scrape before it (a scrape on either side)
    twice = scrape.Scrape.of(interval).settled_tile
    assert duration_seconds(twice) == 2 * duration_seconds(tile)
    for record in ("job_id_phase:flopwatch_train_phase_seconds:increase15s", "job_id:flopwatch_step_time:increase15s",
                   "job_id:flopwatch_replayed_step_time:increase15s",
                   "job_id:flopwatch_checkpoint_seconds:increase15s"):
        ends = {duration_seconds(tile), duration_seconds(twice)}
        beside = {end + sign * duration_seconds(interval) for end in ends for sign in (-1, 1)}
        offsets = {duration_seconds(offset) for offset in re.findall(rf"offset ({_DURATION})", exprs[record])}
        assert offsets == ends | beside, record
        assert not re.findall(rf"\[({_DURATION})\]", exprs[record]), record
    assert set(re.findall(rf"offset ({_DURATION})", exprs["job_id:flopwatch_train_iteration:max"])) == {tile}
    assert exprs["job_id_phase:flopwatch_train_phase_seconds:rate5m"].endswith(f"/ {int(duration_seconds(tile))}")
    assert set(re.findall(rf"offset ({_DURATION})", exprs["job_id:flopwatch_replayed_steps:ratio15s"])) == {tile}
    # The interruptions group: its offsets read its own evaluation before, and its held hours count
    # its samples by its interval.
    step = interruptions["interval"]
    offsets = {rule["record"]: set(re.findall(rf"offset ({_DURATION})", _expr(rule)))
               for rule in interruptions["rules"] if "offset" in rule["expr"]}
    for record in ("node_cause:flopwatch_fault_signal:start_timestamp", "job_id:flopwatch_interruption_started:bool",
                   "job_id:flopwatch_pause:seconds"):
        assert offsets[record] == {step}, record
    held = [rule["expr"] for rule in by_name["flopwatch-interruptions-windows"]["rules"]
            if rule["record"].startswith(("job_id:flopwatch_held_hours:", "job_id:flopwatch_gpu_hours:"))]
    assert len(held) == 4 and all(expr.endswith(f"* {int(duration_seconds(step))} / 3600") for expr in held)


@on_both
@pytest.mark.parametrize("interval", INTERVALS)
def test_the_scrape_interval_alert_cases_hold_for_every_build(builds: dict[str, Path], interval: str,
                                                             release: str) -> None:
    """agent.yml's cases scrape every 2 x and every 1 x the built interval, so they hold for any."""
    result = subprocess.run([program("promtool", release), "test", "rules", "agent.yml"],
                            cwd=builds[interval] / "tests", capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    alert = next(rule for group in groups(builds[interval]) for rule in group["rules"]
                 if rule.get("alert") == "FlopWatchScrapeIntervalTooCoarse")
    assert alert["expr"].rstrip().endswith(f"> 1.2 * {int(duration_seconds(interval))}")
    assert f"built for a scrape every {interval}" in alert["annotations"]["description"]


@pytest.mark.parametrize("value", ["500ms", "61s", "2m", "0", "1.5s", "soon", "15"])
def test_a_scrape_interval_out_of_range_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                value: str) -> None:
    (tmp_path / "fw.yml").write_text(f"dtype: bf16\nscrape_interval: {value}\n")
    assert main(["rules", "build", "--config", str(tmp_path / "fw.yml"), "--out", str(tmp_path / "alerts")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{tmp_path / 'fw.yml'}:2: scrape_interval: expected a Prometheus duration from 1s to 1m" in err
    assert not (tmp_path / "alerts").exists()


def test_a_settings_window_too_short_for_the_scrape_is_read_wider_and_the_build_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fw.yml").write_text("scrape_interval: 1m\nnetwork:\n  flapping_window: 3m\n")
    assert main(["rules", "build", "--config", str(tmp_path / "fw.yml"), "--out", str(tmp_path / "alerts")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "network.flapping_window: 3m holds fewer than 4 samples" in warnings[0], warnings
    assert "the rules read 4m instead" in warnings[0]
    network = (tmp_path / "alerts" / "flopwatch-network.yml").read_text()
    assert "increase(flopwatch_nic_link_downed_total[4m]))) >= 2" in network
    assert "node_port:flopwatch_nic_link_downed:flapping3m" in network   # names keep the setting
    assert build.warnings(MixinConfig()) == []
    assert build.warnings(MixinConfig(scrape_interval=ScrapeInterval("60s"))) == []       # no default is too short


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells (an escaped `\\|` stays inside its cell)."""
    return [cell.strip().replace("\x00", "|") for cell in line.replace("\\|", "\x00").strip().strip("|").split("|")]


def test_the_rules_doc_table_is_the_helper() -> None:
    """docs/rules.md's table of windows and intervals per scrape interval says what the helper does."""
    lines = (Path(__file__).resolve().parents[1] / "docs" / "rules.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| helper, as a template writes it |"))
    columns = [duration_seconds(cell.replace(" ", "")) for cell in _cells(lines[start])[1:]]
    rows = 0
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        label, *shown = _cells(line)
        helpers = [scrape.Scrape(s) for s in columns]
        if label == "`scrape.tile`":
            wanted = [helper.tile for helper in helpers]
        elif span := re.fullmatch(r'`"(\w+)" \| span`', label):
            wanted = [helper.span(span.group(1)) for helper in helpers]
        elif every := re.fullmatch(r'`scrape\.every\("(\w+)"(?:, (\d))?\)`', label):
            wanted = [helper.every(every.group(1), int(every.group(2) or 1)) for helper in helpers]
        else:
            raise AssertionError(f"docs/rules.md: a row the test cannot read: {line}")
        assert shown == wanted, line
        rows += 1
    assert rows == 9
