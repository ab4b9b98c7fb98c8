"""`flopwatch` command line: one subcommand per capability, each with --help.

Exit codes scripts can trust (flopwatch/errors.py): 0 success, 1 a runtime failure (unreachable
server, failed check), 2 bad usage or configuration (including "no GPU driver" for the agent),
130 interrupted. Commands raise UsageError or RuntimeFailure; only this module prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from flopwatch import __version__
from flopwatch.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, RuntimeFailure, UsageError


@dataclass(frozen=True)
class Subcommand:
    """One `flopwatch NAME`: its module in flopwatch/commands/ (same name) gives add_arguments()
    and, unless its actions set their own handlers, run()."""

    name: str
    help: str
    description: str

    def register(self, sub: argparse._SubParsersAction) -> None:
        module = importlib.import_module(f"flopwatch.commands.{self.name}")
        parser = sub.add_parser(self.name, help=self.help, description=self.description)
        module.add_arguments(parser)
        if hasattr(module, "run"):
            parser.set_defaults(handler=module.run)


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        "agent",
        "run the node agent (GPU telemetry on /metrics)",
        "Collect GPU telemetry on a fixed clock and serve it on /metrics for Prometheus. "
        "Settings come from defaults < --config FILE < FLOPWATCH_* environment < flags.",
    ),
    Subcommand(
        "sim",
        "serve a simulated GPU fleet to Prometheus, or export its history",
        "Simulate a fleet from a scenario file (fleet, jobs, faults): every node is a scrape "
        "target on loopback with a file_sd targets file; or, with --export-history, write a span of "
        "history far faster than wall-clock for VictoriaMetrics to import.",
    ),
    Subcommand(
        "demo",
        "the main job: a simulated fleet, real Prometheus and Alertmanager, live MFU and pages",
        "Simulate a fleet (16 nodes x 8 H100s, two jobs), serve it to a real Prometheus with "
        "FlopWatch's rules and a real Alertmanager paging a local webhook, all on free loopback ports, and "
        "show live MFU, busy GPUs, stragglers and pages; about a minute in a thermal straggler is "
        "injected. Ctrl-C or the end of --duration stops everything.",
    ),
    Subcommand(
        "docs",
        "generate reference docs from the code",
        "Generate docs/metrics.md from the metric catalogue.",
    ),
    Subcommand(
        "bench",
        "benchmarks: `bench detect` scores the alert rules against simulated faults",
        "Benchmarks that need the real servers. `flopwatch bench detect --scenarios PATH` runs a "
        "scenario suite through the rules in a throwaway Prometheus and scores alerts against ground truth.",
    ),
    Subcommand(
        "dashboards",
        "build the Grafana dashboards as JSON, or push them to a Grafana",
        "`flopwatch dashboards build` writes dashboards/*.json from the code; "
        "`flopwatch dashboards push --url URL` uploads them into a Grafana folder.",
    ),
    Subcommand(
        "rules",
        "build the alert rules, Alertmanager files and dashboards from one settings file",
        "`flopwatch rules build [--config FILE] --out DIR` renders FlopWatch's rule templates with "
        "your selectors, dtype, thresholds, severities and URLs (docs/configuration.md).",
    ),
    Subcommand(
        "report",
        "write the weekly utilization report (HTML, Markdown, CSV, PDF) from Prometheus",
        "Where the GPU-hours and the energy went and what they bought: GPU-hours allocated, busy "
        "and idle; MFU; goodput and badput; straggler and hardware incidents; lemon nodes; energy and cost; "
        "recommendations. Reads any Prometheus holding FlopWatch series; an unreachable one exits 1.",
    ),
    Subcommand(
        "doctor",
        "say what FlopWatch can read on this node (GPUs, metric families, DCGM, NICs, host)",
        "Start the GPU backend the agent would use, read every GPU and report in a table (or "
        "--json) the driver and NVML versions, each GPU's model and peak, which metric families are present "
        "or absent, DCGM, the NIC and host collectors, the training-step socket and the Slurm mapping "
        "directory. Exit 0: every GPU read; 1: a GPU could not be read; 2: no GPU backend or bad usage.",
    ),
    Subcommand(
        "remediate",
        "drain nodes FlopWatch's alerts name in Slurm or Kubernetes, hold them, return them (dry-run by default)",
        "Take Alertmanager's webhooks and reconcile against its API; by the policy in the settings file's "
        "remediation: section, drain a node (Slurm State=DRAIN with a flopwatch: reason, or a Kubernetes cordon "
        "and taint) and return it once its alerts cleared, a hold-down passed and a health check passed. A circuit "
        "breaker, switch escalation and lemon holds keep it safe; `undo` returns what it drained "
        "(docs/remediation.md).",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flopwatch",
        description="FlopWatch: MFU, goodput, stragglers and GPU faults for training clusters.",
    )
    parser.add_argument("--version", action="version", version=f"flopwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.register(sub)
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
