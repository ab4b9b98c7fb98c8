"""One module per `flopwatch` subcommand (registered in flopwatch/cli.py's SUBCOMMANDS table)."""

from __future__ import annotations

import argparse
import sys

from flopwatch.errors import EXIT_USAGE


def actions(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """The sub-actions of a command (`flopwatch dashboards build|push`): without one, the command
    prints its help to stderr and exits 2."""

    def usage(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    parser.set_defaults(handler=usage)
    return parser.add_subparsers(dest="action", metavar="ACTION")
