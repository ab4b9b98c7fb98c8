"""`flopwatch rules build`: the rule files, their promtool tests, the Alertmanager config and
templates and the dashboards, from the mixin's templates and a settings file."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from flopwatch.commands import actions as sub_actions
from flopwatch.errors import RuntimeFailure, UsageError
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
        "alerts/ and dashboards/.")
    build.add_argument("--config", metavar="FILE", default=os.environ.get(CONFIG_ENV) or None,
                       help=f"YAML settings overriding the defaults (else ${CONFIG_ENV}, else the defaults)")
    build.add_argument("--out", required=True, metavar="DIR", help="the rules folder to write, e.g. alerts")
    build.add_argument("--dashboards", metavar="DIR",
                       help="where the dashboards go (default: dashboards/ beside --out)")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 if the files there differ from what the build writes")
    build.add_argument("--log-level", default="info", help="debug, info, warning or error")
    build.set_defaults(handler=run_build)

    defaults = actions.add_parser(
        "defaults", help="print every setting with its default (a starting point for --config)",
        description="Write flopwatch/mixin/defaults.yml, every setting with its default and a comment, to "
        "stdout: `flopwatch rules defaults > my-flopwatch.yml`, then keep the keys you change.")
    defaults.set_defaults(handler=run_defaults)


def run_build(args: argparse.Namespace) -> int:
    from flopwatch.config import ConfigError
    from flopwatch.mixin import build, config

    setup_logging(args.log_level)
    rules_dir = Path(args.out)
    dashboards_dir = Path(args.dashboards) if args.dashboards else rules_dir.resolve().parent / "dashboards"
    try:
        settings = config.load(args.config)
        for warning in build.warnings(settings):
            log.warning("%s: %s", args.config or "the defaults", warning)
        if args.check:
            stale = build.stale(settings, rules_dir, dashboards_dir)
            if stale:
                raise RuntimeFailure(f"{len(stale)} files differ from the build ({', '.join(map(str, stale[:5]))}"
                                     f"{', ...' if len(stale) > 5 else ''}): run `flopwatch rules build --out "
                                     f"{args.out}` and commit the result")
            log.info("%s and %s match the build", rules_dir, dashboards_dir)
            return 0
        written = build.write(settings, rules_dir, dashboards_dir)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    except ValueError as error:  # a template that does not render names its file and line
        raise RuntimeFailure(str(error)) from None
    except OSError as error:
        raise RuntimeFailure(f"cannot write {error.filename}: {error.strerror}") from None
    log.info("wrote %d files to %s and %s", len(written), rules_dir, dashboards_dir)
    return 0


def run_defaults(args: argparse.Namespace) -> int:
    from flopwatch.mixin.build import DEFAULTS

    sys.stdout.write(DEFAULTS.read_text(encoding="utf-8"))
    return 0
