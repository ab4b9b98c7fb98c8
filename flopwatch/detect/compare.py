"""One suite under several exporters (`flopwatch bench detect --exporter agent,dcgm`): the same
scenarios with the fleet's GPUs behind FlopWatch's agent or dcgm-exporter, scored side by side."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from rich.table import Table

from flopwatch.detect.detect import SuiteReport
from flopwatch.sim.scenario import EXPORTERS, Scenario


class ExporterError(ValueError):
    """--exporter names an exporter the simulator does not have; one line for the user."""


def parse_exporters(text: str) -> list[str]:
    """'agent,dcgm' -> ['agent', 'dcgm'] (each once, in order)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown or not names:
        raise ExporterError(f"--exporter: expected one or more of {', '.join(EXPORTERS)} (comma-separated), "
                            f"got {text!r}")
    return list(dict.fromkeys(names))


def with_exporter(scenarios: list[Scenario], exporter: str) -> list[Scenario]:
    """The scenarios with every node's GPUs behind `exporter` (the file's `fleet.exporter` overridden)."""
    return [dataclasses.replace(s, fleet=dataclasses.replace(s.fleet, exporter=exporter)) for s in scenarios]


def _num(value: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def print_comparison(reports: dict[str, SuiteReport], console: Console) -> None:
    """Precision, recall and cause accuracy per exporter, then faults detected (cause right) per kind."""
    overall = Table(title="By exporter", title_justify="left")
    for name in ("exporter", "precision", "recall", "cause accuracy", "latency median (s)", "false alerts",
                 "healthy GPU-h"):
        overall.add_column(name, justify="left" if name == "exporter" else "right")
    for exporter, report in reports.items():
        s = report.summary
        overall.add_row(exporter, _num(s["precision"]), _num(s["recall"]), _num(s["cause_accuracy"]),
                        _num(s["latency_median_s"], "{:.0f}"), str(s["false_episodes"]),
                        f"{s['healthy_gpu_hours']:,.0f}")
    console.print(overall)
    kinds = Table(title="Faults detected (cause right) by kind and exporter", title_justify="left")
    kinds.add_column("kind")
    for exporter in reports:
        kinds.add_column(exporter, justify="right")
    every = sorted({kind for report in reports.values() for kind in report.summary["by_kind"]})
    for kind in every:
        cells = []
        for report in reports.values():
            row = report.summary["by_kind"].get(kind)
            cells.append("-" if row is None else f"{row['detected']}/{row['faults']} ({row['cause_right']})")
        kinds.add_row(kind, *cells)
    console.print(kinds)
