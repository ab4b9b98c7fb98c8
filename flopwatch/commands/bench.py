"""`flopwatch bench detect`: the detection benchmark from the command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from flopwatch import resources
from flopwatch.detect import compare, detect
from flopwatch.detect.engine import EngineError
from flopwatch.detect.rules import RuleFileError
from flopwatch.durations import DurationError, parse_duration
from flopwatch.errors import RuntimeFailure, UsageError
from flopwatch.logs import setup_logging
from flopwatch.stack import ServerError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    det = sub.add_parser(
        "detect", help="score the alert rules against simulated faults and healthy noise",
        description="Run every scenario through the rules in a throwaway Prometheus (faster than "
        "wall-clock) and score the alerts against the simulator's ground truth: detection latency, "
        "precision, recall, cause accuracy, false alerts per 1,000 GPU-days and MFU error.",
    )
    det.add_argument("--scenarios", metavar="PATH",
                     help="a scenario file or a directory of them "
                          "(default: the shipped suite, flopwatch/detect/scenarios)")
    det.add_argument("--rules", metavar="PATH",
                     help="a rule file or a directory of them (default: the shipped rules, alerts/)")
    det.add_argument("--alertmanager", metavar="FILE",
                     help="count pages through this Alertmanager config's routes and inhibitions "
                     "(default: alertmanager.yml in the rules directory; none there: no pages counted)")
    det.add_argument("--json", metavar="OUT", help="write every figure, per fault and per alert, here")
    det.add_argument("--quick", action="store_true",
                     help=f"only scenarios of at most {detect.QUICK_MAX_GPUS} GPUs, cut to "
                     f"{detect.QUICK_DURATION_S / 60:.0f} minutes (a smoke run)")
    det.add_argument("--only", action="append", metavar="NAME",
                     help="run only this scenario (name or file stem); repeatable")
    det.add_argument("--evaluation-interval", metavar="DURATION",
                     help="for rule groups without an interval (default: each scenario's scrape interval)")
    det.add_argument("--exact", action="store_true",
                     help="read every node through its real agent exposition (slow; the fast reader is "
                     "tested to give the same samples)")
    det.add_argument("--exporter", default="agent", metavar="NAMES",
                     help="what serves the simulated GPUs: agent (FlopWatch's, the default), dcgm (dcgm-exporter "
                     "with FlopWatch's counters file) or dcgm-default (its default counters), beside an agent for "
                     "steps, NICs and host; a comma list (agent,dcgm) runs the suite under each and compares them")
    det.add_argument("--no-alerts", action="store_true",
                     help="evaluate only the recording rules the scores read (goodput, badput, ETTR, MFU, "
                     "interruptions, MTBF, checkpoint advice), no alert: for long runs scored on those "
                     "(detection then finds nothing)")
    det.add_argument("--log-level", default="warning", help="debug, info, warning or error")
    parser.set_defaults(bench=None)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # unwinds through the servers' context managers, which stop them


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    if args.bench != "detect":
        raise UsageError("name a benchmark: flopwatch bench detect (see --help)")
    setup_logging(args.log_level)
    interval = None
    if args.evaluation_interval:
        try:
            interval = parse_duration(args.evaluation_interval, "--evaluation-interval")
        except DurationError as error:
            raise UsageError(str(error)) from None
        if interval <= 0:
            raise UsageError("--evaluation-interval: must be longer than 0s")
    try:
        args.scenarios = args.scenarios or resources.folder("scenarios")
        args.rules = args.rules or resources.folder("alerts")
    except resources.MissingResource as error:
        raise RuntimeFailure(str(error)) from None
    try:
        scenarios = detect.load_suite(args.scenarios, args.only)
        detect.rule_files.rule_files(args.rules)
    except (detect.SuiteError, RuleFileError) as error:
        raise UsageError(str(error)) from None
    if args.quick:
        scenarios = [s for s in map(detect.quick, scenarios) if s is not None]
        if not scenarios:
            raise UsageError(f"--quick: no scenario has at most {detect.QUICK_MAX_GPUS} GPUs")
    try:
        exporters = compare.parse_exporters(args.exporter)
    except compare.ExporterError as error:
        raise UsageError(str(error)) from None
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TimeRemainingColumn())
    try:
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("detection benchmark", total=1.0)
            reports = {}
            for i, exporter in enumerate(exporters):
                reports[exporter] = detect.run_suite(
                    compare.with_exporter(scenarios, exporter), args.rules, evaluation_interval=interval,
                    exact=args.exact, alertmanager=args.alertmanager, no_alerts=args.no_alerts,
                    progress=lambda fraction, name, i=i: bar.update(
                        task, completed=(i + fraction) / len(exporters), description=name))
    except (RuleFileError, detect.SuiteError) as error:
        raise UsageError(str(error)) from None
    except (EngineError, ServerError) as error:
        raise RuntimeFailure(str(error)) from None
    if args.json:
        data = next(iter(reports.values())).as_dict() if len(reports) == 1 else {
            exporter: report.as_dict() for exporter, report in reports.items()}
        try:
            Path(args.json).write_text(json.dumps(data, indent=1))
        except OSError as error:
            raise RuntimeFailure(f"cannot write {args.json}: {error.strerror}") from None
    out = Console(file=sys.stdout)
    for exporter, report in reports.items():
        if len(reports) > 1:
            out.rule(f"exporter: {exporter}")
        print_report(report, out)
    if len(reports) > 1:
        out.rule("agent and dcgm-exporter side by side")
        compare.print_comparison(reports, out)
    return 0


def _num(value: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def print_report(report: detect.SuiteReport, console: Console) -> None:
    scenarios = Table(title="Scenarios", title_justify="left")
    for name in ("scenario", "GPUs", "hours", "healthy GPU-h", "faults", "detected", "episodes", "false",
                 "max pages/fault", "MFU err (pp)", "run (s)"):
        scenarios.add_column(name, justify="left" if name == "scenario" else "right")
    for s in report.scores:
        worst = max((m.error_pp for m in s.mfu), default=None)
        scenarios.add_row(
            s.scenario, str(s.gpus), f"{s.duration / 3600:.2f}", f"{s.healthy_gpu_hours:,.0f}", str(len(s.faults)),
            str(sum(f.detected for f in s.faults)), str(len(s.episodes)), str(sum(not e.true for e in s.episodes)),
            _num(s.max_pages_per_fault, "{}"), _num(worst, "{:.2f}"),
            f"{sum(s.stats.get(k, 0) for k in ('sim_s', 'write_s', 'eval_s')):.0f}")
    console.print(scenarios)
    kinds = Table(title="By fault kind", title_justify="left")
    for name in ("kind", "faults", "detected", "cause right", "median latency (s)", "max latency (s)", "max pages"):
        kinds.add_column(name, justify="left" if name == "kind" else "right")
    for kind, row in sorted(report.summary["by_kind"].items()):
        kinds.add_row(kind, str(row["faults"]), str(row["detected"]), str(row["cause_right"]),
                      _num(row["median_latency_s"], "{:.0f}"), _num(row["max_latency_s"], "{:.0f}"),
                      _num(row.get("max_pages"), "{}"))
    console.print(kinds)
    s = report.summary
    console.print(
        f"precision {_num(s['precision'])}  recall {_num(s['recall'])}  cause {_num(s['cause_accuracy'])}  "
        f"latency median {_num(s['latency_median_s'], '{:.0f}')} s, p90 {_num(s['latency_p90_s'], '{:.0f}')} s  "
        f"false alerts {s['false_episodes']} ({_num(s['false_alerts_per_1000_gpu_days'], '{:.2f}')} per 1,000 "
        f"GPU-days)  healthy GPU-hours {s['healthy_gpu_hours']:,.0f}  max pages per fault "
        f"{_num(s.get('max_pages_per_fault'), '{}')}  false pages {_num(s.get('false_pages'), '{}')}  "
        f"run {report.seconds:.0f} s")
    targets = Table(title="Targets", title_justify="left")
    for name in ("target", "measured", "met"):
        targets.add_column(name)
    for target in s["targets"]:
        met = {True: "yes", False: "NO", None: "n/a"}[target["met"]]
        targets.add_row(target["what"], target["measured"], met)
    console.print(targets)
