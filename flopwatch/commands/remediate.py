"""`flopwatch remediate`: drain nodes that FlopWatch's alerts name, hold them, and return them
(docs/remediation.md). `run` is the service (dry-run unless --execute or `dry_run: false`);
`plan` decides once and prints the plan; `undo` returns nodes FlopWatch drained; `status` lists them."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from flopwatch.commands import actions as sub_actions
from flopwatch.errors import RuntimeFailure, UsageError
from flopwatch.logs import setup_logging

log = logging.getLogger("flopwatch.remediate")
CONFIG_ENV = "FLOPWATCH_RULES_CONFIG"
#: flag dest -> settings key.
FLAGS = {"listen": "listen", "alertmanager": "alertmanager", "state_dir": "state_dir", "topology": "topology",
         "web_config": "web_config", "dry_run": "dry_run"}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", default=os.environ.get(CONFIG_ENV) or None,
                        help=f"FlopWatch's settings file; its remediation: section applies (else ${CONFIG_ENV})")
    parser.add_argument("--alertmanager", metavar="URL", help="Alertmanager's URL (alerts read, pages sent)")
    parser.add_argument("--state-dir", dest="state_dir", metavar="DIR", help="where the journal and plan live")
    parser.add_argument("--topology", metavar="FILE", help="Slurm's topology.conf, for switch escalation "
                        "(default: the running slurmctld's, from scontrol show topology)")
    parser.add_argument("--log-level", dest="log_level", default="info", help="debug, info, warning or error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = sub_actions(parser)
    run = actions.add_parser(
        "run", help="the service: webhook, reconcile, act (dry-run by default)",
        description="Take Alertmanager's webhooks on --listen (POST /alerts), read Alertmanager's API on start "
        "and every reconcile_interval, and drain, hold and return nodes by the policy in the settings file. "
        "Dry-run unless --execute: the plan goes to <state_dir>/plan.json and the log, nothing is run.")
    _common(run)
    run.add_argument("--listen", metavar="HOST:PORT", help="webhook and /metrics address (default 127.0.0.1:9848)")
    run.add_argument("--web-config", dest="web_config", metavar="FILE",
                     help="TLS, basic auth and bearer tokens for the webhook, in the agent's web config format")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--execute", dest="dry_run", action="store_const", const=False,
                      help="carry out the plan (drain and return nodes)")
    mode.add_argument("--dry-run", dest="dry_run", action="store_const", const=True,
                      help="write the plan and run nothing (the default)")
    run.set_defaults(handler=run_service)
    plan = actions.add_parser("plan", help="decide once from Alertmanager's alerts and print the plan (runs nothing)")
    _common(plan)
    plan.set_defaults(handler=run_plan, dry_run=True)
    undo = actions.add_parser("undo", help="return nodes FlopWatch drained (one command undoes its actions)",
                              description="Resume each named node (or --all) whose drain reason says FlopWatch "
                              "drained it, and hold it from FlopWatch until an alert newer than the undo.")
    _common(undo)
    undo.add_argument("nodes", nargs="*", metavar="NODE")
    undo.add_argument("--all", action="store_true", help="every node FlopWatch drained")
    undo.set_defaults(handler=run_undo, dry_run=False)
    status = actions.add_parser("status", help="the nodes FlopWatch holds drained, as the scheduler shows them")
    _common(status)
    status.set_defaults(handler=run_status, dry_run=True)


def _settings(args: argparse.Namespace) -> Any:
    from flopwatch.config import ConfigError
    from flopwatch.remediate import settings

    overrides = {key: getattr(args, flag, None) for flag, key in FLAGS.items()}
    try:
        return settings.load(args.config, os.environ, overrides)
    except ConfigError as error:
        raise UsageError(str(error)) from None


def _parts(args: argparse.Namespace, *, fabric_needed: bool = False) -> tuple[Any, Any, Any, Any]:
    """(settings, scheduler, journal, fabric) from the flags, file and environment; the fabric is
    read only where decisions need it (`run`, `plan`), so `undo` works with slurmctld half up."""
    from flopwatch.remediate.journal import Journal
    from flopwatch.remediate.kubernetes import Kubernetes
    from flopwatch.remediate.service import state_path
    from flopwatch.remediate.slurm import Slurm

    setup_logging(args.log_level)
    settings = _settings(args)
    if settings["scheduler"] == "slurm":
        scheduler = Slurm(settings["command_timeout"], settings["slurm.bin_dir"])
    else:
        scheduler = Kubernetes.in_cluster(settings["command_timeout"], settings["kubernetes.taint_key"])
    fabric = _fabric(settings, scheduler) if fabric_needed else None
    try:
        journal = Journal(state_path(settings))
    except OSError as error:
        raise UsageError(f"state_dir {settings['state_dir']}: {error.strerror}") from None
    return settings, scheduler, journal, fabric


def _fabric(settings: Any, scheduler: Any) -> Any:
    """The fabric for switch escalation: the `topology` file when one is set, else what slurmctld
    holds (`scontrol show topology`), else none (escalation off, logged)."""
    from flopwatch.remediate.scheduler import SchedulerError
    from flopwatch.topology.model import TopologyError
    from flopwatch.topology.slurm import read_topology_conf

    if settings["topology"]:
        try:
            return read_topology_conf(settings["topology"])
        except TopologyError as error:
            raise UsageError(str(error)) from None
    if settings["scheduler"] != "slurm":
        return None
    try:
        fabric = scheduler.topology()
    except SchedulerError as error:
        raise RuntimeFailure(f"cannot read the topology from Slurm (set topology: to a topology.conf to "
                             f"skip this): {error}") from None
    except TopologyError as error:
        raise RuntimeFailure(f"Slurm's topology is not in a format FlopWatch reads: {error}") from None
    if fabric is None:
        log.info("remediate: Slurm has no topology plugin and no topology file is set: no switch escalation")
    else:
        log.info("remediate: topology from slurmctld: %d switches, %d nodes", len(fabric.switches),
                 len(fabric.node_switches))
    return fabric


def run_service(args: argparse.Namespace) -> int:
    from flopwatch.config import parse_listen
    from flopwatch.exporters.webconfig import WebAccess, WebConfigError
    from flopwatch.remediate.service import Remediator
    from flopwatch.remediate.web import serve

    settings, scheduler, journal, fabric = _parts(args, fabric_needed=True)
    try:
        access = WebAccess(settings["web_config"]) if settings["web_config"] else None
    except WebConfigError as error:
        raise UsageError(str(error)) from None
    remediator = Remediator(settings, scheduler, journal, fabric=fabric)
    host, port = parse_listen(settings["listen"])
    try:
        server = serve(remediator, host, port, access)
    except OSError as error:
        raise RuntimeFailure(f"cannot listen on {settings['listen']}: {error.strerror}") from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: (stop.set(), remediator.wake.set()))
    log.info("remediate: %s on %s:%d, scheduler %s, Alertmanager %s", "dry-run" if remediator.dry_run else
             "EXECUTING", host, server.port, scheduler.name, settings["alertmanager"] or "(none: webhooks only)")
    try:
        remediator.run(stop)
    finally:
        server.stop()
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from flopwatch.remediate.service import Remediator

    settings, scheduler, journal, fabric = _parts(args, fabric_needed=True)
    remediator = Remediator(settings, scheduler, journal, fabric=fabric)
    remediator.reconcile()
    plan = remediator.step()
    json.dump(plan.as_dict(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def run_undo(args: argparse.Namespace) -> int:
    from flopwatch.remediate.scheduler import SchedulerError

    if not args.nodes and not args.all:
        raise UsageError("name the nodes to return, or --all")
    _, scheduler, journal, _ = _parts(args)
    try:
        nodes = scheduler.nodes()
    except SchedulerError as error:
        raise RuntimeFailure(f"cannot read the scheduler: {error}") from None
    wanted = sorted(n for n, s in nodes.items() if s.ours) if args.all else args.nodes
    failed = 0
    for node in wanted:
        state = nodes.get(node)
        if state is None or not state.ours:
            was = "unknown node" if state is None else state.reason or "not drained"
            print(f"{node}: not drained by FlopWatch ({was}): left alone")
            failed += 1
            continue
        journal.append(_now(), "intent", node, action="resume", reason=state.reason)
        journal.append(_now(), "undo", node)          # first: a running service must not drain it again
        try:
            scheduler.resume(node)
        except SchedulerError as error:
            journal.append(_now(), "dropped", node, action="resume")
            print(f"{node}: {error}")
            failed += 1
            continue
        journal.append(_now(), "resume", node, reason=state.reason)
        print(f"{node}: returned ({scheduler.describe('resume', node)}); was: {state.reason}")
    if failed:
        raise RuntimeFailure(f"{failed} of {len(wanted)} node(s) not returned")
    return 0


def run_status(args: argparse.Namespace) -> int:
    from flopwatch.remediate.scheduler import SchedulerError

    _, scheduler, _, _ = _parts(args)
    try:
        nodes = scheduler.nodes()
    except SchedulerError as error:
        raise RuntimeFailure(f"cannot read the scheduler: {error}") from None
    ours = {n: s.reason for n, s in sorted(nodes.items()) if s.ours}
    for node, reason in ours.items():
        print(f"{node}\t{reason}")
    if not ours:
        print("no node is drained by FlopWatch")
    return 0


def _now() -> float:
    import time

    return time.time()
