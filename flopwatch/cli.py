"""`flopwatch` command line: one subcommand per capability, each with --help.

Exit codes scripts can trust (flopwatch/errors.py): 0 success, 1 a runtime failure (unreachable
server, failed check), 2 bad usage or configuration (including "no GPU driver" for the agent),
130 interrupted. Commands raise UsageError or RuntimeFailure; only this module prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from flopwatch import __version__
from flopwatch.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, RuntimeFailure, UsageError
from flopwatch.logs import setup_logging  # noqa: F401 - commands not yet moved to flopwatch.logs import it here


def _add_agent(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import agent

    parser = sub.add_parser(
        "agent", help="run the node agent (GPU telemetry on /metrics)",
        description="Collect GPU telemetry on a fixed clock and serve it on /metrics for Prometheus. "
        "Settings come from defaults < --config FILE < FLOPWATCH_* environment < flags.",
    )
    agent.add_arguments(parser)
    parser.set_defaults(handler=agent.run)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import demo

    parser = sub.add_parser(
        "demo", help="the main job: a simulated fleet, real Prometheus and Alertmanager, live MFU and pages",
        description="Simulate a fleet (16 nodes x 8 H100s, two jobs), serve it to a real Prometheus with "
        "FlopWatch's rules and a real Alertmanager paging a local webhook, all on free loopback ports, and "
        "show live MFU, busy GPUs, stragglers and pages; about a minute in a thermal straggler is "
        "injected. Ctrl-C or the end of --duration stops everything.",
    )
    demo.add_arguments(parser)
    parser.set_defaults(handler=demo.run)


def _add_sim(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import sim

    parser = sub.add_parser(
        "sim", help="serve a simulated GPU fleet to Prometheus, or export its history",
        description="Simulate a fleet from a scenario file (fleet, jobs, faults): every node is a scrape "
        "target on loopback with a file_sd targets file; or, with --export-history, write a span of "
        "history far faster than wall-clock for VictoriaMetrics to import.",
    )
    sim.add_arguments(parser)
    parser.set_defaults(handler=sim.run)


def _add_docs(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import docs

    parser = sub.add_parser("docs", help="generate reference docs from the code",
                            description="Generate docs/metrics.md from the metric catalogue.")
    docs.add_arguments(parser)
    parser.set_defaults(handler=docs.run)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import bench

    parser = sub.add_parser(
        "bench", help="benchmarks: `bench detect` scores the alert rules against simulated faults",
        description="Benchmarks that need the real servers. `flopwatch bench detect --scenarios PATH` runs a "
        "scenario suite through the rules in a throwaway Prometheus and scores alerts against ground truth.",
    )
    bench.add_arguments(parser)
    parser.set_defaults(handler=bench.run)


def _add_dashboards(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import dashboards

    parser = sub.add_parser(
        "dashboards", help="build the Grafana dashboards as JSON, or push them to a Grafana",
        description="`flopwatch dashboards build` writes dashboards/*.json from the code; "
        "`flopwatch dashboards push --url URL` uploads them into a Grafana folder.",
    )
    dashboards.add_arguments(parser)


def _add_report(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import report

    parser = sub.add_parser(
        "report", help="write the weekly utilization report (HTML, Markdown, CSV, PDF) from Prometheus",
        description="Where the GPU-hours and the energy went and what they bought: GPU-hours allocated, busy "
        "and idle; MFU; goodput and badput; straggler and hardware incidents; lemon nodes; energy and cost; "
        "recommendations. Reads any Prometheus holding FlopWatch series; an unreachable one exits 1.",
    )
    report.add_arguments(parser)
    parser.set_defaults(handler=report.run)


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import doctor

    parser = sub.add_parser(
        "doctor", help="say what FlopWatch can read on this node (GPUs, metric families, DCGM, NICs, host)",
        description="Start the GPU backend the agent would use, read every GPU and report in a table (or "
        "--json) the driver and NVML versions, each GPU's model and peak, which metric families are present "
        "or absent, DCGM, the NIC and host collectors, the training-step socket and the Slurm mapping "
        "directory. Exit 0: every GPU read; 1: a GPU could not be read; 2: no GPU backend or bad usage.",
    )
    doctor.add_arguments(parser)
    parser.set_defaults(handler=doctor.run)


def _add_rules(sub: argparse._SubParsersAction) -> None:
    from flopwatch.commands import rules

    parser = sub.add_parser(
        "rules", help="build the alert rules, Alertmanager files and dashboards from one settings file",
        description="`flopwatch rules build [--config FILE] --out DIR` renders FlopWatch's rule templates with "
        "your selectors, dtype, thresholds, severities and URLs (docs/configuration.md).",
    )
    rules.add_arguments(parser)


SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_agent, _add_sim, _add_demo, _add_docs, _add_bench, _add_dashboards, _add_rules, _add_report,
    _add_doctor,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flopwatch",
        description="FlopWatch: MFU, goodput, stragglers and GPU faults for training clusters.",
    )
    parser.add_argument("--version", action="version", version=f"flopwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.handler(args) or EXIT_OK)
    except UsageError as error:
        print(f"flopwatch {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeFailure as error:
        print(f"flopwatch {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"flopwatch {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `flopwatch ... | head`: the reader left; not an error worth a trace
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter exit quiet
        return EXIT_OK
