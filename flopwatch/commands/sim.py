"""`flopwatch sim`: serve a simulated fleet to Prometheus, or export its history fast."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading
import time

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from flopwatch import config as cfg
from flopwatch.durations import DurationError, parse_duration
from flopwatch.errors import RuntimeFailure, UsageError
from flopwatch.logs import setup_logging
from flopwatch.sim import history
from flopwatch.sim.dcgm_exposition import DcgmExporterError
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import EXPORTERS, Scenario, ScenarioError, load
from flopwatch.sim.scenarios import resolve, shipped
from flopwatch.sim.serve import FleetServer

log = logging.getLogger("flopwatch.sim")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", required=True, metavar="FILE",
                        help=f"scenario YAML file, or a shipped one by name ({', '.join(shipped())})")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where to serve /node/<i>/metrics (default 127.0.0.1 on a free port)")
    parser.add_argument("--file-sd", metavar="FILE",
                        help="write Prometheus file_sd targets here (one target per node)")
    parser.add_argument("--truth-out", metavar="FILE", help="write the ground truth (JSON) here at the end")
    parser.add_argument("--duration", metavar="DURATION",
                        help="run this long (e.g. 90s, 20m; default the scenario's duration)")
    parser.add_argument("--exporter", choices=EXPORTERS, default=None,
                        help="what serves the GPUs: agent (FlopWatch's), dcgm (dcgm-exporter with FlopWatch's "
                        "counters file, at /node/<i>/dcgm/metrics, beside an agent for steps, NICs and host) or "
                        "dcgm-default (its default counters); default the scenario's fleet.exporter")
    parser.add_argument("--nvlink-per-link", action="store_true",
                        help="per-link NVLink series (default: summed per GPU, which scales further)")
    parser.add_argument("--export-history", metavar="DIR",
                        help="instead of serving, write --span of history to DIR as fast as possible")
    parser.add_argument("--span", default=None, metavar="DURATION",
                        help="history span to export (default the scenario's duration), e.g. 7d")
    parser.add_argument("--step", default=None, metavar="DURATION",
                        help="sample spacing of exported history (default the scrape interval)")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")


def load_scenario(name: str) -> Scenario:
    try:
        return load(resolve(name))
    except ScenarioError as error:
        raise UsageError(str(error)) from None


def _duration(value: str | None, default: float, flag: str) -> float:
    if value is None:
        return default
    try:
        seconds = parse_duration(value, flag)
    except DurationError as error:
        raise UsageError(str(error)) from None
    if seconds <= 0:
        raise UsageError(f"{flag}: must be longer than 0s")
    return seconds


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    scenario = load_scenario(args.scenario)
    start = time.time()
    if args.export_history:
        return export(args, scenario)
    try:
        host, port = cfg.parse_listen(args.listen)
    except ValueError:
        raise UsageError(f"--listen {args.listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9900") from None
    duration = _duration(args.duration, scenario.duration, "--duration")
    if args.exporter:
        scenario = dataclasses.replace(scenario, fleet=dataclasses.replace(scenario.fleet, exporter=args.exporter))
    fleet = Fleet(scenario, start_unix=start)
    try:
        server = FleetServer(fleet, host, port, args.nvlink_per_link)
    except DcgmExporterError as error:
        raise UsageError(str(error)) from None
    try:
        host, port = server.start()
    except OSError as error:
        raise RuntimeFailure(f"cannot listen on {host}:{port}: {error.strerror}") from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.file_sd:
        server.write_file_sd(args.file_sd)
    log.info("serving %d simulated nodes (%d GPUs) at http://%s:%d/node/<i>/metrics%s", len(fleet.nodes),
             len(fleet.nodes) * scenario.fleet.gpus_per_node, host, port,
             f"; targets in {args.file_sd}" if args.file_sd else "")
    try:
        server.run(duration, stop)
    finally:
        server.stop()
        if args.truth_out:
            fleet.truth.write(args.truth_out)
            log.info("ground truth written to %s", args.truth_out)
    return 0


def export(args: argparse.Namespace, scenario: Scenario) -> int:
    span = _duration(args.span, scenario.duration, "--span")
    step = _duration(args.step, scenario.scrape_interval, "--step")
    # history ends now, so "the last 7 days" queries find it
    fleet = Fleet(scenario, start_unix=float(int(time.time() - span)))
    with Progress(TextColumn("exporting history"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeRemainingColumn(), transient=True) as progress:
        task = progress.add_task("export", total=span)
        try:
            stats = history.export(fleet, args.export_history, span, step,
                                   nvlink_per_link=args.nvlink_per_link,
                                   progress=lambda t: progress.update(task, completed=t))
        except OSError as error:
            raise RuntimeFailure(f"cannot write history to {args.export_history}: {error.strerror}") from None
    if args.truth_out:
        fleet.truth.write(args.truth_out)
    log.info("exported %d samples over %d ticks in %.1fs (%.0f samples/s) to %s", stats.samples, stats.ticks,
             stats.seconds, stats.samples_per_second, args.export_history)
    return 0
