"""`flopwatch demo`: the main job on one machine.

A simulated fleet (16 nodes x 8 H100s, two jobs) served to a real Prometheus with the project's
rules and a real Alertmanager that pages a local webhook, all on free loopback ports. A live
terminal view shows fleet, cluster and job MFU, busy/idle GPUs, the current straggler table and the
pages received; about a minute in, a thermal straggler is injected. Ctrl-C or the end of
--duration stops everything and leaves no process behind.

At the end the fleet stops and the demo writes `flopwatch report` over exactly the ticks it ran,
with the simulator's ground truth over the same span (truth.json). Prometheus scrapes each node
on a phase of its own, so the fleet advances once per round of scrapes, in the widest quiet
stretch between two nodes' scrapes (see Ticker and report_span): every node's samples in the
report's window are then the fleet's ticks, once each.

With --shards N the same fleet runs on the two-tier layout (flopwatch.stack.sharded): N shards of
contiguous nodes, cut so the first job spans them all, each an HA pair of Prometheus servers paging
through a two-member Alertmanager cluster, and a global tier (VictoriaMetrics and vmalert) that the
view, the report and the summary read. --json FILE writes the alerts the webhook received, one
entry per incident, in either layout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from flopwatch import resources
from flopwatch.commands.demo_shards import ClockTicker, incidents, nodes_text, shard_nodes, write_json
from flopwatch.durations import format_duration
from flopwatch.errors import RuntimeFailure, UsageError
from flopwatch.mixin.config import MixinConfig, ScrapeInterval
from flopwatch.promql import PromClient, PromError
from flopwatch.sim.fleet import Fleet, node_name
from flopwatch.sim.scenario import Scenario, ScenarioError
from flopwatch.sim.scenarios import shipped
from flopwatch.sim.serve import FleetServer
from flopwatch.sim.ticker import ScrapedFleet, Ticker, report_span
from flopwatch.stack import Alertmanager, Prometheus, ServerError
from flopwatch.stack.servers import alertmanager_config
from flopwatch.stack.sharded import ShardedStack
from flopwatch.stack.webhook import WebhookReceiver

#: PromQL the view runs; the same expressions a user can paste into Prometheus.
ALLOCATED_PEAK = ('sum by (job_id) (flopwatch_gpu_peak_dense_flops{dtype="bf16"} '
                  "* on (node, gpu) group_left (job_id) flopwatch_gpu_job_info)")
QUERIES = {
    "job_mfu": f"sum by (job_id) (rate(flopwatch_train_model_flops_total[1m])) / {ALLOCATED_PEAK}",
    "job_step": "sum by (job_id) (rate(flopwatch_train_step_seconds_sum[1m])) "
                "/ sum by (job_id) (rate(flopwatch_train_step_seconds_count[1m]))",
    "cluster_mfu": f"sum(rate(flopwatch_train_model_flops_total[1m])) / sum({ALLOCATED_PEAK})",
    "fleet_mfu": 'sum(rate(flopwatch_train_model_flops_total[1m])) / sum(flopwatch_gpu_peak_dense_flops{dtype="bf16"})',
    "gpus_busy": "count(flopwatch_gpu_utilization_ratio > 0.5) or vector(0)",
    "gpus_total": "count(flopwatch_gpu_up)",
    "gpus_allocated": "count(flopwatch_gpu_job_info) or vector(0)",
    # compute seconds per step of each rank against its job's median rank
    "stragglers": "(sum without (phase) (rate(flopwatch_train_phase_seconds_total{phase=\"compute\"}[1m])) "
                  "/ rate(flopwatch_train_steps_total[1m])) / on (job_id) group_left () quantile by (job_id) "
                  "(0.5, sum without (phase) (rate(flopwatch_train_phase_seconds_total{phase=\"compute\"}[1m])) "
                  "/ rate(flopwatch_train_steps_total[1m])) > 1.03",
    "throttled": "flopwatch_gpu_clock_event_active{reason!=\"idle\"} == 1",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=180.0, metavar="SECONDS",
                        help="stop once the simulated fleet has run this long (default 180; it starts when "
                        "Prometheus has scraped every node; 0 runs until Ctrl-C)")
    parser.add_argument("--nodes", type=int, default=None, help="simulated nodes (default: the scenario's, 16)")
    parser.add_argument("--scenario", default="demo",
                        help=f"scenario file or shipped name (default demo; shipped: {', '.join(shipped())})")
    parser.add_argument("--inject-after", type=float, default=60.0, metavar="SECONDS",
                        help="inject a thermal straggler this long after start (default 60, or a third of a "
                        "shorter --duration; negative: never)")
    parser.add_argument("--out", metavar="DIR", help="write the report here (default: a temporary directory)")
    parser.add_argument("--truth-out", metavar="FILE",
                        help="the simulator's ground truth over the report's span, as `flopwatch sim --truth-out` "
                        "writes it (default: truth.json next to the report)")
    parser.add_argument("--shards", type=int, metavar="N",
                        help="run the two-tier layout instead of one Prometheus: N (2 or more) shards of contiguous "
                        "nodes, each a Prometheus HA pair, with the first job spanning them all; a global tier "
                        "(VictoriaMetrics and vmalert) that the view and the report read; an Alertmanager cluster")
    parser.add_argument("--json", metavar="FILE",
                        help="write the alerts the webhook received as JSON: one entry per incident (alert name, "
                        "receiver, node, GPU, rank, cause) with the number of notifications that carried it")


@dataclass
class View:
    values: dict[str, list] = field(default_factory=dict)
    injected: str = ""
    error: str = ""
    waiting: bool = False   # the fleet waits for Prometheus's first scrape of every node


def poll(client: PromClient) -> View:
    view = View()
    for key, expr in QUERIES.items():
        try:
            view.values[key] = client.query(expr)
        except PromError as error:
            view.error = str(error)
    return view


def render(view: View, pages: list[dict], elapsed: float, source: str) -> Group:
    """The live view; `source` names what it reads ("Prometheus <url>", "global tier <url>")."""
    def scalar(key: str) -> float | None:
        samples = view.values.get(key) or []
        return samples[0].value if samples else None

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    head = Table.grid(padding=(0, 3))
    head.add_row(f"[b]fleet MFU[/b] {pct(scalar('fleet_mfu'))}", f"[b]cluster MFU[/b] {pct(scalar('cluster_mfu'))}",
                 f"[b]GPUs busy[/b] {scalar('gpus_busy') or 0:.0f} / {scalar('gpus_total') or 0:.0f}",
                 f"[b]allocated[/b] {scalar('gpus_allocated') or 0:.0f}", f"t={elapsed:.0f}s")
    jobs = Table(title="jobs", expand=True)
    for column in ("job", "MFU", "step time"):
        jobs.add_column(column)
    steps = {s.labels.get("job_id"): s.value for s in view.values.get("job_step", [])}
    for sample in sorted(view.values.get("job_mfu", []), key=lambda s: s.labels.get("job_id", "")):
        job = sample.labels.get("job_id", "?")
        jobs.add_row(job, pct(sample.value), f"{steps[job]:.2f}s" if job in steps else "-")
    stragglers = Table(title="stragglers (compute per step vs job median)", expand=True)
    for column in ("job", "node", "gpu", "rank", "slower by", "telemetry"):
        stragglers.add_column(column)
    throttled = {(s.labels.get("node"), s.labels.get("gpu")): s.labels.get("reason")
                 for s in view.values.get("throttled", [])}
    for sample in sorted(view.values.get("stragglers", []), key=lambda s: -s.value)[:8]:
        labels = sample.labels
        reason = throttled.get((labels.get("node"), labels.get("gpu")), "")
        stragglers.add_row(labels.get("job_id", ""), labels.get("node", ""), labels.get("gpu", ""),
                           labels.get("rank", ""), f"{100 * (sample.value - 1):.1f}%",
                           f"clock event: {reason}" if reason else "")
    paged = Table(title="pages received by the webhook", expand=True)
    for column in ("alert", "severity", "summary"):
        paged.add_column(column)
    for alert in pages[-6:]:
        labels, notes = alert.get("labels", {}), alert.get("annotations", {})
        paged.add_row(labels.get("alertname", ""), labels.get("severity", ""), notes.get("summary", ""))
    notes = [source]
    if view.waiting:
        notes.append("waiting for Prometheus's first scrape of every node")
    if view.injected:
        notes.append(f"[yellow]injected: {view.injected}[/yellow]")
    if view.error:
        notes.append(f"[red]{view.error}[/red]")
    return Group(Panel(head, title="FlopWatch demo"), jobs, stragglers, paged, "  ".join(notes))


def rule_files() -> list[Path]:
    """The shipped rule files; none at all is an error naming where they should be."""
    return resources.rule_files()


def run(args: argparse.Namespace) -> int:
    from flopwatch.commands.sim import load_scenario

    scenario = load_scenario(args.scenario)
    if args.nodes is not None:
        if args.nodes < 2:
            raise UsageError("--nodes: the demo needs at least 2 nodes")
        try:
            scenario = _resize(scenario, args.nodes)
        except ScenarioError as error:
            raise UsageError(str(error)) from None
    shards = shard_nodes(scenario, args.shards) if args.shards is not None else None
    try:  # before anything starts: a broken install says what is missing
        rules = rule_files() if shards is None else []   # shards build their rules from the templates
        resources.file("alerts", "alertmanager.yml")
    except resources.MissingResource as error:
        raise RuntimeFailure(str(error)) from None
    stop = threading.Event()
    ended_by: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        ended_by.append(signum)
        stop.set()

    watched = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # under nohup the demo outlives its terminal
        watched.append(signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in watched}
    try:
        if shards is not None:
            return _run_sharded(args, scenario, shards, stop, ended_by)
        return _run_stack(args, scenario, rules, stop, ended_by)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run_stack(args: argparse.Namespace, scenario: Scenario, rules: list[Path], stop: threading.Event,
               ended_by: list[int]) -> int:
    """Start the fleet, Alertmanager and Prometheus, show the live view until --duration or a
    signal, stop the fleet and write the report (and the simulator's truth) over exactly the
    ticks it ran, and stop everything whatever happens."""
    console = Console(stderr=True)
    fleet = Fleet(scenario, start_unix=time.time())
    server = ScrapedFleet(fleet)
    workdir = Path(tempfile.mkdtemp(prefix="flopwatch-demo-"))
    webhook = WebhookReceiver().start()
    alertmanager = Alertmanager(alertmanager_config(webhook.url))
    prometheus: Prometheus | None = None
    ticker = Ticker(server, scenario.scrape_interval, args.duration, stop)
    try:
        server.start()
        file_sd = server.write_file_sd(workdir / "targets.json")
        alertmanager.start()
        prometheus = Prometheus(
            [{"job_name": "flopwatch", "file_sd_configs": [{"files": [str(file_sd)]}]}],
            rule_files=rules, alertmanagers=[alertmanager.url],
            scrape_interval=f"{scenario.scrape_interval:g}s", evaluation_interval=f"{scenario.scrape_interval:g}s",
        ).start()
        ticker.thread.start()
        client = PromClient(prometheus.url, timeout=10)
        console.print(f"{len(fleet.nodes)} simulated nodes, Prometheus {prometheus.url}, Alertmanager "
                      f"{alertmanager.url}; Ctrl-C stops everything")
        injected = _live(args, console, client, ticker, webhook, f"Prometheus {prometheus.url}")
        if signal.SIGHUP in ended_by or signal.SIGTERM in ended_by:
            return 0  # nobody is there to read a summary: just stop everything
        start, end, caveat = report_span(server, ticker.ticks, scenario.scrape_interval)
        out = Path(args.out) if args.out else workdir / "report"
        report = _report(prometheus.url, out, start, end)
        truth = _write_truth(fleet, Path(args.truth_out) if args.truth_out else out / "truth.json",
                             (start, end), ticker.ticks, caveat)
        _summary(console, client, webhook, injected, (report, truth, end, caveat), args.json)
        return 0
    except ServerError as error:
        raise RuntimeFailure(str(error)) from None
    finally:
        stop.set()
        if ticker.thread.is_alive():
            ticker.thread.join(timeout=30)
        if prometheus is not None:
            prometheus.stop()
        alertmanager.stop()
        webhook.stop()
        server.stop()


def _run_sharded(args: argparse.Namespace, scenario: Scenario, shards: dict[str, list[int]], stop: threading.Event,
                 ended_by: list[int]) -> int:
    """_run_stack for the two-tier layout (flopwatch.stack.sharded): the shards scrape their nodes and
    page, the global tier's vmalert judges jobs, and the view, the report and the summary read the
    global tier. The fleet ticks on the clock (ClockTicker)."""
    console = Console(stderr=True)
    fleet = Fleet(scenario, start_unix=time.time())
    server = FleetServer(fleet)
    workdir = Path(tempfile.mkdtemp(prefix="flopwatch-demo-"))
    webhook = WebhookReceiver().start()
    ticker = ClockTicker(server, scenario.scrape_interval, args.duration, stop)
    stack: ShardedStack | None = None
    try:
        server.start()
        targets = server.targets()
        settings = MixinConfig(scrape_interval=ScrapeInterval(format_duration(scenario.scrape_interval)))
        stack = ShardedStack(settings, {name: [targets[node] for node in nodes] for name, nodes in shards.items()},
                             receiver_url=webhook.url, workdir=workdir / "stack").start()
        ticker.thread.start()
        client = PromClient(stack.global_url, timeout=10)
        console.print(f"{len(fleet.nodes)} simulated nodes in {len(shards)} shards "
                      f"({', '.join(f'{name}: {nodes_text(nodes)}' for name, nodes in shards.items())}), each a "
                      f"Prometheus pair; global tier {stack.global_url}; Alertmanagers "
                      f"{', '.join(member.url for member in stack.alertmanagers)}; servers' files in "
                      f"{stack.workdir}; Ctrl-C stops everything", soft_wrap=True)
        injected = _live(args, console, client, ticker, webhook, f"global tier {stack.global_url}")
        if signal.SIGHUP in ended_by or signal.SIGTERM in ended_by:
            return 0
        start, end = ticker.span()
        _caught_up(stack, client, end)
        out = Path(args.out) if args.out else workdir / "report"
        report = _report(stack.global_url, out, start, end)
        truth = _write_truth(fleet, Path(args.truth_out) if args.truth_out else out / "truth.json",
                             (start, end), ticker.ticks, ClockTicker.CAVEAT)
        _summary(console, client, webhook, injected, (report, truth, end, ClockTicker.CAVEAT), args.json)
        return 0
    except ServerError as error:
        raise RuntimeFailure(str(error)) from None
    finally:
        stop.set()
        if ticker.thread.is_alive():
            ticker.thread.join(timeout=30)
        if stack is not None:
            stack.stop()
            if os.environ.get("FLOPWATCH_KEEP_STACK_DIRS") != "1":   # the servers' data, not the report
                shutil.rmtree(stack.workdir, ignore_errors=True)
        webhook.stop()
        server.stop()


def _caught_up(stack: ShardedStack, client: PromClient, end: float, timeout: float = 30.0) -> None:
    """Wait (up to `timeout`) until the shards' remote write has brought the global tier up to `end`:
    the report must not read a window whose last seconds are still on their way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.global_store.flush()
        with contextlib.suppress(PromError):
            if (client.scalar("min(timestamp(flopwatch_train_model_flops_total))", default=0.0) or 0.0) >= end:
                return
        time.sleep(1.0)


def _live(args: argparse.Namespace, console: Console, client: PromClient, ticker: Ticker | ClockTicker,
          webhook: WebhookReceiver, source: str) -> str:
    """The live view while the fleet runs (--duration of simulated time once Prometheus has
    scraped every node) and until `stop`; returns what was injected."""
    inject_after = args.inject_after
    if args.duration > 0 and inject_after > args.duration / 3:
        inject_after = args.duration / 3
    started = time.monotonic()
    injected, shown = "", -math.inf
    with Live(console=console, refresh_per_second=2, transient=False) as live:
        while not ticker.stop.is_set() and ticker.thread.is_alive():
            elapsed = time.monotonic() - started
            if not injected and inject_after >= 0 and elapsed >= inject_after:
                injected = _inject(ticker.server, ticker.server.fleet)
            if elapsed - shown >= 2.0:
                view = poll(client)
                view.injected, view.waiting = injected, ticker.ticks == 0
                live.update(render(view, webhook.firing(), elapsed, source))
                shown = elapsed
            ticker.stop.wait(0.25)
    return injected


def _inject(server: FleetServer, fleet: Fleet) -> str:
    """A thermal straggler on the first job's fourth node (or its last), GPU 5."""
    spec = fleet.scenario.jobs[0]
    node = spec.nodes[min(3, len(spec.nodes) - 1)]
    gpu = min(5, fleet.scenario.fleet.gpus_per_node - 1)
    with server.lock:
        fleet.inject("thermal_throttle", node, gpu=gpu, duration=3600, slowdown=0.08)
    return f"thermal_throttle on {node_name(node)} GPU {gpu} (job {spec.id}), 8% slower"


def _report(prometheus_url: str, out: Path, start: float, end: float) -> str:
    """`flopwatch report` over the demo's span while the demo's Prometheus still runs: the
    report path, or why there is none."""
    command = [sys.executable, "-m", "flopwatch", "report", "--prometheus", prometheus_url,
               "--from", f"{int(start)}", "--to", f"{int(end)}", "--out", str(out), "--no-pdf", "--quiet"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return "not written (flopwatch report took longer than 2 minutes)"
    if result.returncode != 0:
        return f"not written ({(result.stderr.strip().splitlines() or ['unknown error'])[-1]})"
    return str(out / "report.html")


def _write_truth(fleet: Fleet, path: Path, span: tuple[float, float], ticks: int, caveat: str) -> str:
    """The simulator's ground truth (the format `flopwatch sim --truth-out` writes) with the span
    it covers: the fleet stopped at the report's end and started at its beginning, so the truth
    since the start is the truth over the report's window."""
    truth = fleet.truth.as_dict()
    truth["span"] = {"from": span[0], "to": span[1], "ticks": ticks, "simulated_seconds": fleet.t,
                     "gpus": sum(len(node.gpus) for node in fleet.nodes), "aligned": not caveat,
                     "caveat": caveat}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(truth, indent=1))
    except OSError as error:
        return f"not written ({error.strerror or error})"
    return str(path)


def _summary(console: Console, client: PromClient, webhook: WebhookReceiver, injected: str,
             written: tuple[str, str, float, str], json_out: str | None = None) -> None:
    report, truth, end, caveat = written
    try:
        mfu = {s.labels.get("job_id"): s.value for s in client.query(QUERIES["job_mfu"], at=end)}
    except PromError:
        mfu = {}
    console.print("\n[b]demo summary[/b]")
    for job, value in sorted(mfu.items()):
        console.print(f"  job {job}: MFU {100 * value:.1f}%")
    if injected:
        console.print(f"  injected {injected}")
    pages = webhook.firing()
    console.print(f"  pages received: {len(pages)}")
    for alert in pages[-5:]:
        console.print(f"    {alert['labels'].get('alertname')}: {alert.get('annotations', {}).get('summary', '')}")
    console.print(f"  report: {report}")
    console.print(f"  the simulator's truth over the same span: {truth}")
    if caveat:
        console.print(f"  ({caveat})")
    if json_out:
        console.print(f"  alerts received, by incident: {write_json(Path(json_out), incidents(webhook, injected))}")
    console.print("everything stopped.")


def _resize(scenario: Scenario, nodes: int) -> Scenario:
    """The demo fleet with `nodes` nodes: jobs keep their shape, clipped to the fleet."""
    jobs = []
    for job in scenario.jobs:
        kept = [n for n in job.nodes if n < nodes]
        if kept:
            jobs.append(replace(job, nodes=kept))
    if not jobs:
        raise ScenarioError(f"--nodes {nodes}: no job fits on so few nodes")
    return replace(scenario, fleet=replace(scenario.fleet, nodes=nodes), jobs=jobs,
                   faults=[f for f in scenario.faults if f.node < nodes])
