"""`flopwatch report`: the weekly utilization report from a Prometheus holding FlopWatch series."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flopwatch.commands.rules import CONFIG_ENV as RULES_CONFIG_ENV
from flopwatch.errors import RuntimeFailure, UsageError
from flopwatch.report import ReportSettings, SettingsError, Unreachable, WindowError, build, resolve, write
from flopwatch.report import settings as report_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", required=True, metavar="URL",
                        help="the Prometheus (or VictoriaMetrics) query API, e.g. http://prometheus:9090")
    parser.add_argument("--last", metavar="DURATION", help="report on the last DURATION (default 7d), e.g. 24h, 7d")
    parser.add_argument("--from", dest="start", metavar="TIME",
                        help="start of the window: ISO 8601 (UTC unless an offset is given) or unix seconds")
    parser.add_argument("--to", dest="end", metavar="TIME", help="end of the window (default now)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for report.html, report.md, report.pdf and one CSV file per table")
    parser.add_argument("--price-kwh", type=str, metavar="X", help="energy price per kWh, for costs")
    parser.add_argument("--price-gpu-hour", type=str, metavar="Y", help="price of one GPU-hour, for costs")
    parser.add_argument("--config", metavar="FILE",
                        help="report settings (YAML): prices, currency, dtype, cluster_label, teams, thresholds")
    parser.add_argument("--rules-config", metavar="FILE", default=os.environ.get(RULES_CONFIG_ENV) or None,
                        help="the rules' settings (`flopwatch rules build --config`, else $FLOPWATCH_RULES_CONFIG): "
                        "the report groups by its labels.cluster and divides by its dtype unless --config sets "
                        "cluster_label or dtype")
    parser.add_argument("--no-pdf", action="store_true", help="skip report.pdf (it needs Chromium)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def shared_rule_settings(path: str | None) -> dict[str, str]:
    """The rules' settings the report shares: the cluster label and the peak dtype."""
    from flopwatch.config import ConfigError
    from flopwatch.mixin import config as mixin_config

    try:
        rules = mixin_config.load(path)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    return {"cluster_label": rules.labels.cluster, "dtype": rules.dtype}


def load_settings(args: argparse.Namespace) -> ReportSettings:
    shared = shared_rule_settings(args.rules_config)
    try:
        return report_settings.load(args.config, shared, f"rules config {args.rules_config}").with_overrides(
            price_kwh=args.price_kwh, price_gpu_hour=args.price_gpu_hour)
    except SettingsError as error:
        raise UsageError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", args.prometheus.strip()):
        raise UsageError(f"--prometheus {args.prometheus!r}: expected a URL like http://127.0.0.1:9090")
    try:
        window = resolve(args.last, args.start, args.end)
    except WindowError as error:
        raise UsageError(str(error)) from None
    console = Console(stderr=True)
    show = not args.quiet and console.is_terminal
    with Progress(TextColumn("querying Prometheus"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True, disable=not show) as progress:
        task = progress.add_task("", total=None)

        def advance(done: int, total: int, title: str) -> None:
            progress.update(task, completed=done, total=total, description=title)

        try:
            report = build(args.prometheus.strip(), window, settings, progress=advance)
        except Unreachable as error:
            raise RuntimeFailure(str(error)) from None
    out = Path(args.out)
    try:
        written = write(report, out, pdf=not args.no_pdf)
    except OSError as error:
        raise RuntimeFailure(f"cannot write the report to {out}: {error.strerror or error}") from None
    names = [p.name for p in written.files]
    csvs = sum(1 for n in names if n.endswith(".csv"))
    main = ", ".join(n for n in names if not n.endswith(".csv"))
    print(f"report written to {out}: {main} and {csvs} CSV file(s)")
    if not report.has_data:
        print(f"flopwatch report: {report.notes[0]}", file=sys.stderr)
    if written.pdf_error:
        print(f"flopwatch report: report.pdf skipped: {written.pdf_error}", file=sys.stderr)
    return 0
