"""The detection benchmark: a suite of scenarios through the real rules, scored against truth.

    suite = load_suite(resources.folder("scenarios"))
    report = run_suite(suite, resources.folder("alerts"), progress=...)

Each scenario runs in its own throwaway Prometheus (engine.py); scoring.py turns the alert
episodes, the MFU the rules recorded and the simulator's truth into the detection figures (docs/detection.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flopwatch import yamlfile
from flopwatch.detect import rules as rule_files
from flopwatch.detect.engine import OBSERVED, PrometheusEngine, RunResult
from flopwatch.detect.pages import AlertmanagerConfig, AlertmanagerConfigError
from flopwatch.detect.scoring import ScenarioScore, score_scenario
from flopwatch.detect.summary import summarize
from flopwatch.sim.scenario import Scenario, ScenarioError, load

QUICK_MAX_GPUS = 64
QUICK_DURATION_S = 20 * 60.0


class SuiteError(ValueError):
    """The suite cannot run as asked (no scenarios, unreadable file); one line for the user."""


def scenario_files(path: str | Path) -> list[Path]:
    try:
        return yamlfile.files(path, "scenario files")
    except yamlfile.YamlFileError as error:
        raise SuiteError(str(error)) from None


def load_suite(path: str | Path, only: list[str] | None = None) -> list[Scenario]:
    scenarios = []
    for file in scenario_files(path):
        try:
            scenario = load(file)
        except ScenarioError as error:
            raise SuiteError(str(error)) from None
        if only and scenario.name not in only and file.stem not in only:
            continue
        scenarios.append(scenario)
    if not scenarios:
        raise SuiteError(f"{path}: no scenario matches {', '.join(only or [])}")
    return scenarios


def quick(scenario: Scenario) -> Scenario | None:
    """The scenario cut to QUICK_DURATION_S, or None when its fleet is larger than QUICK_MAX_GPUS."""
    if scenario.fleet.nodes * scenario.fleet.gpus_per_node > QUICK_MAX_GPUS:
        return None
    end = min(scenario.duration, QUICK_DURATION_S)
    faults = [dataclasses.replace(f, end=min(f.end, end)) for f in scenario.faults if f.start < end]
    jobs = [j for j in scenario.jobs if j.start < end]
    return dataclasses.replace(scenario, duration=end, faults=faults, jobs=jobs)


def gpu_ticks(scenario: Scenario) -> float:
    """Work of a scenario, for progress: GPUs x ticks."""
    return scenario.fleet.nodes * scenario.fleet.gpus_per_node * scenario.duration / scenario.scrape_interval


@dataclass
class SuiteReport:
    scores: list[ScenarioScore]
    summary: dict[str, Any]
    rule_files: list[str]
    seconds: float
    rules_sha256: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "rule_files": self.rule_files, "rules_sha256": self.rules_sha256,
                "seconds": self.seconds, "scenarios": [score.as_dict() for score in self.scores]}


def snapshot_rules(rules_path: str | Path, into: Path) -> tuple[Path, str]:
    """Copy the rule files into `into`, so a whole suite runs one version of them even while
    someone edits alerts/; returns the copy and a digest of the contents for the report."""
    digest = hashlib.sha256()
    for file in rule_files.rule_files(rules_path):
        data = file.read_bytes()
        digest.update(file.name.encode() + b"\0" + data)
        (into / file.name).write_bytes(data)
    return into, digest.hexdigest()


def alertmanager_config(path: str | Path | None, rules_path: str | Path) -> AlertmanagerConfig | None:
    """The Alertmanager config pages are counted through: `path`, else alertmanager.yml beside the
    rules (a directory's), else none (no pages counted); a wrong file is a SuiteError."""
    if path is None:
        beside = Path(rules_path) / "alertmanager.yml"
        if not beside.is_file():
            return None
        path = beside
    try:
        return AlertmanagerConfig.load(path)
    except AlertmanagerConfigError as error:
        raise SuiteError(str(error)) from None


def records_only(rules: rule_files.RuleSet) -> rule_files.RuleSet:
    """The recording rules alone: the engine then evaluates only those the scored records read
    (their dependency closure), no alert and nothing only an alert reads."""
    return rule_files.RuleSet(rules.recording, rules.files)


def run_scenario(scenario: Scenario, rules_path: str | Path, evaluation_interval: float | None = None,
                 progress: Callable[[float, str], None] | None = None, exact: bool = False,
                 alertmanager: AlertmanagerConfig | None = None,
                 no_alerts: bool = False) -> tuple[ScenarioScore, RunResult]:
    rules = rule_files.load(rules_path, evaluation_interval or scenario.scrape_interval)
    result = PrometheusEngine(records_only(rules) if no_alerts else rules, exact=exact).run(scenario, progress)
    score = score_scenario(scenario, result.truth, result.episodes, result.start_unix,
                           result.observed[OBSERVED[0]], result.stats, recorded=result.observed,
                           alertmanager=alertmanager)
    return score, result


def run_suite(scenarios: list[Scenario], rules_path: str | Path, *, evaluation_interval: float | None = None,
              progress: Callable[[float, str], None] | None = None, exact: bool = False,
              alertmanager: str | Path | None = None, no_alerts: bool = False) -> SuiteReport:
    """Every scenario in turn; `progress(fraction of the suite, scenario name)`. Pages are counted
    through `alertmanager` (a path; default alertmanager.yml in the rules directory, if any).
    `no_alerts`: evaluate only the records the scores read (detection then reads nothing found)."""
    started = time.perf_counter()
    files = [str(p) for p in rule_files.rule_files(rules_path)]
    config = alertmanager_config(alertmanager, rules_path)
    with tempfile.TemporaryDirectory(prefix="flopwatch-bench-rules-") as tmp:
        snapshot, digest = snapshot_rules(rules_path, Path(tmp))
        scores = _run_all(scenarios, snapshot, evaluation_interval, progress, exact, config, no_alerts)
    return SuiteReport(scores, summarize(scores), files, time.perf_counter() - started, digest)


def _run_all(scenarios: list[Scenario], rules_path: Path, evaluation_interval: float | None,
             progress: Callable[[float, str], None] | None, exact: bool,
             alertmanager: AlertmanagerConfig | None = None, no_alerts: bool = False) -> list[ScenarioScore]:
    total = sum(gpu_ticks(s) for s in scenarios) or 1.0
    done = 0.0
    scores = []
    quiet = logging.getLogger("flopwatch.exporters")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # lost GPUs of exact nodes are faults we inject, not news
    try:
        for scenario in scenarios:
            weight = gpu_ticks(scenario)

            def report(fraction: float, name: str, base: float = done, weight: float = weight) -> None:
                if progress is not None:
                    progress((base + fraction * weight) / total, name)

            score, _ = run_scenario(scenario, rules_path, evaluation_interval, report, exact, alertmanager,
                                    no_alerts)
            scores.append(score)
            done += weight
    finally:
        quiet.setLevel(level)
    return scores
