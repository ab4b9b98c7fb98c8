"""`flopwatch rules build`: the rule files, their promtool tests, the Alertmanager config and
templates and the dashboards, from the mixin's templates and a settings file; with a `topology:`
section also each tier's rule set and the servers' configs. `flopwatch rules topology` checks that
section and probes the URLs it names."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from flopwatch.commands import actions as sub_actions
from flopwatch.errors import EXIT_USAGE, RuntimeFailure, UsageError
from flopwatch.logs import setup_logging

log = logging.getLogger("flopwatch.rules")
#: The settings file when --config is not given.
CONFIG_ENV = "FLOPWATCH_RULES_CONFIG"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = sub_actions(parser)
    build = actions.add_parser(
        "build", help="write rules, Alertmanager files and dashboards from the templates and --config",
        description="Render flopwatch/mixin/templates with the settings of --config (any subset of "
        "flopwatch/mixin/defaults.yml; docs/configuration.md lists them) into --out (rule files, tests/, "
        "alertmanager.yml, templates/) and --dashboards. With the defaults the output is the shipped "
        "alerts/ and dashboards/. A topology: section in --config adds --out/shard/ and --out/global/ (the "
        "rule set of each tier) and --out/topology/ (each shard replica's prometheus.yml, vmalert.args, "
        "alertmanager-<n>.args); docs/configuration.md, \"Topology\".")
    build.add_argument("--config", metavar="FILE", default=os.environ.get(CONFIG_ENV) or None,
                       help=f"YAML settings overriding the defaults (else ${CONFIG_ENV}, else the defaults)")
    build.add_argument("--out", required=True, metavar="DIR", help="the rules folder to write, e.g. alerts")
    build.add_argument("--dashboards", metavar="DIR",
                       help="where the dashboards go (default: dashboards/ beside --out)")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 if the files there (the topology's included) differ from what "
                       "the build writes")
    build.add_argument("--log-level", default="info", help="debug, info, warning or error")
    build.set_defaults(handler=run_build)

    topology = actions.add_parser(
        "topology", help="check the topology: section of --config and probe the URLs it names",
        description="Read the topology: section of --config (shards, global tier, Alertmanagers; "
        "docs/configuration.md, \"Topology\") and probe its URLs: the global write URL takes an empty "
        "remote-write request, the read URL answers a query, each Alertmanager is ready. Prints one line per "
        "problem and exits 2, or a summary and exits 0.")
    topology.add_argument("--config", metavar="FILE", default=os.environ.get(CONFIG_ENV) or None,
                          help=f"the settings file with the topology: section (else ${CONFIG_ENV})")
    topology.add_argument("--shard", metavar="NAME",
                          help="check one shard: what its Prometheus servers reach (the write URL and the "
                          "Alertmanagers); an unknown name exits 2 naming the shards there are")
    topology.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS",
                          help="how long to wait for each URL (default 2)")
    topology.set_defaults(handler=run_topology)

    defaults = actions.add_parser(
        "defaults", help="print every setting with its default (a starting point for --config)",
        description="Write flopwatch/mixin/defaults.yml, every setting with its default and a comment, to "
        "stdout: `flopwatch rules defaults > my-flopwatch.yml`, then keep the keys you change.")
    defaults.set_defaults(handler=run_defaults)


def run_build(args: argparse.Namespace) -> int:
    from flopwatch.config import ConfigError
    from flopwatch.mixin import build, config, tiers

    setup_logging(args.log_level)
    rules_dir = Path(args.out)
    dashboards_dir = Path(args.dashboards) if args.dashboards else rules_dir.resolve().parent / "dashboards"
    try:
        settings = config.load(args.config)
        for warning in build.warnings(settings):
            log.warning("%s: %s", args.config or "the defaults", warning)
        files = build.outputs(settings, rules_dir, dashboards_dir)
        if settings.topology is not None:
            files |= tiers.outputs(settings, rules_dir)
        if args.check:
            stale = build.stale_files(files)
            if stale:
                raise RuntimeFailure(f"{len(stale)} files differ from the build ({', '.join(map(str, stale[:5]))}"
                                     f"{', ...' if len(stale) > 5 else ''}): run `flopwatch rules build"
                                     f"{f' --config {args.config}' if args.config else ''} --out {args.out}` and "
                                     "commit the result")
            log.info("%s and %s match the build", rules_dir, dashboards_dir)
            return 0
        written = build.write_files(files)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    except ValueError as error:  # a template that does not render names its file and line
        raise RuntimeFailure(str(error)) from None
    except OSError as error:
        raise RuntimeFailure(f"cannot write {error.filename}: {error.strerror}") from None
    log.info("wrote %d files to %s and %s", len(written), rules_dir, dashboards_dir)
    return 0


def run_topology(args: argparse.Namespace) -> int:
    from flopwatch.config import ConfigError
    from flopwatch.mixin import config, topology

    if not 0 < args.timeout < float("inf"):
        raise UsageError(f"--timeout must be a number of seconds more than 0, got {args.timeout:g}")
    if not args.config:
        raise UsageError(f"no settings file: give --config FILE (or ${CONFIG_ENV}) with a topology: section")
    try:
        layout = config.load(args.config).topology
    except ConfigError as error:
        raise UsageError(str(error)) from None
    if layout is None:
        raise UsageError(f"{args.config} has no topology: section (docs/configuration.md, \"Topology\")")
    try:
        problems = topology.check(layout, timeout=args.timeout, shard=args.shard)
    except ValueError as error:       # an unknown --shard
        raise UsageError(str(error)) from None
    for problem in problems:
        print(f"flopwatch rules: {problem}", file=sys.stderr)
    if problems:
        return EXIT_USAGE
    shards = [s for s in layout.shards if args.shard in (None, s.name)]
    print(f"{len(shards)} shard(s): " + "; ".join(f"{s.name} (replicas {', '.join(s.replicas)}"
                                                   f"{f', {s.gpus} GPUs' if s.gpus else ''})" for s in shards))
    print(f"global tier: write {layout.global_tier.write_url}"
          + ("" if args.shard else f", read {layout.global_tier.read_url}"))
    print(f"{len(layout.alertmanagers)} Alertmanager(s): {', '.join(m.url for m in layout.alertmanagers)}")
    print("all reachable")
    return 0


def run_defaults(args: argparse.Namespace) -> int:
    from flopwatch.mixin.build import DEFAULTS

    sys.stdout.write(DEFAULTS.read_text(encoding="utf-8"))
    return 0
