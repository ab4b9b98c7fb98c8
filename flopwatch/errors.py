"""The errors commands raise and the exit codes the CLI turns them into.

Exit codes scripts can trust: 0 success, 1 a runtime failure (unreachable server, failed
check), 2 bad usage or configuration (including "no GPU driver" for the agent), 130 interrupted.
Commands (flopwatch/commands/) and the library raise these; only flopwatch/cli.py prints them.
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit 2."""


class RuntimeFailure(Exception):
    """An expected runtime failure (server unreachable, check failed): one line, exit 1."""
