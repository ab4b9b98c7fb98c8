"""Logging for the commands: to stderr (stdout stays for output), one format, a named level."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(
        stream=sys.stderr, level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True,
    )
