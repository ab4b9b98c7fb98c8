"""Which build of each server runs: Debian's packages, or the current upstream releases built from
their Go modules.

Two releases, one switch: `FLOPWATCH_SERVERS=debian` (the default: bookworm's Prometheus 2.42,
Alertmanager 0.25, VictoriaMetrics 1.79, quick to install, what `make demo` runs) or
`FLOPWATCH_SERVERS=current` (Prometheus 3.x, Alertmanager and VictoriaMetrics as pinned in
`scripts/servers/<server>/go.mod`, built by `scripts/build-servers.sh` into a cache outside the
repository). Every server and tool FlopWatch starts is found here, so the compatibility tests run
the same code on both by changing the switch (`use()`), and a program that is missing names what
installs or builds it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flopwatch.resources import source_root
from flopwatch.stack.process import MissingBinary

RELEASES = ("debian", "current")
ENVIRONMENT = "FLOPWATCH_SERVERS"
CACHE_ENVIRONMENT = "FLOPWATCH_SERVER_CACHE"


class UnknownRelease(ValueError):
    """FLOPWATCH_SERVERS names no release."""


@dataclass(frozen=True)
class Program:
    """One executable: its name in Debian's package, and the upstream server whose module builds it."""

    debian_binary: str
    debian_package: str
    server: str            # scripts/servers/<server>/
    module: str            # the upstream Go module go.mod pins
    binary: str            # the binary's name in the build


_PROMETHEUS = "github.com/prometheus/prometheus"
_ALERTMANAGER = "github.com/prometheus/alertmanager"
_VICTORIA = "github.com/VictoriaMetrics/VictoriaMetrics"

PROGRAMS = {
    "prometheus": Program("prometheus", "prometheus", "prometheus", _PROMETHEUS, "prometheus"),
    "promtool": Program("promtool", "prometheus", "prometheus", _PROMETHEUS, "promtool"),
    "alertmanager": Program("prometheus-alertmanager", "prometheus-alertmanager", "alertmanager", _ALERTMANAGER,
                            "alertmanager"),
    "amtool": Program("amtool", "prometheus-alertmanager", "alertmanager", _ALERTMANAGER, "amtool"),
    "victoria-metrics": Program("victoria-metrics", "victoria-metrics", "victoriametrics", _VICTORIA,
                                "victoria-metrics"),
    "vmalert": Program("vmalert", "victoria-metrics", "victoriametrics", _VICTORIA, "vmalert"),
    "vmagent": Program("vmagent", "victoria-metrics", "victoriametrics", _VICTORIA, "vmagent"),
}


def current() -> str:
    """The release this process starts servers from (FLOPWATCH_SERVERS, default debian)."""
    release = os.environ.get(ENVIRONMENT, "debian").strip() or "debian"
    if release not in RELEASES:
        raise UnknownRelease(f"{ENVIRONMENT}={release!r} is not a release: use one of {', '.join(RELEASES)}")
    return release


@contextlib.contextmanager
def use(release: str) -> Iterator[str]:
    """Start servers from `release` inside the block (the environment too, so child processes agree)."""
    if release not in RELEASES:
        raise UnknownRelease(f"{release!r} is not a release: use one of {', '.join(RELEASES)}")
    before = os.environ.get(ENVIRONMENT)
    os.environ[ENVIRONMENT] = release
    try:
        yield release
    finally:
        if before is None:
            os.environ.pop(ENVIRONMENT, None)
        else:
            os.environ[ENVIRONMENT] = before


def cache_root() -> Path:
    """Where scripts/build-servers.sh keeps its builds (the same default as the script's)."""
    if os.environ.get(CACHE_ENVIRONMENT):
        return Path(os.environ[CACHE_ENVIRONMENT])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flopwatch" / "servers"


def _servers_folder() -> Path | None:
    root = source_root()
    return root / "scripts" / "servers" if root is not None else None


def pinned_version(server: str, module: str) -> str:
    """The version scripts/servers/<server>/go.mod pins, in the server's own numbering
    (Prometheus 3.x is its module's v0.3xx.y)."""
    folder = _servers_folder()
    if folder is None:
        raise MissingBinary(f"the current {server} release is pinned in a source checkout's scripts/servers/: "
                            "run from a checkout (make test), or use FLOPWATCH_SERVERS=debian")
    text = (folder / server / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+v(\S+)", text, re.MULTILINE)
    if match is None:
        raise MissingBinary(f"{folder / server / 'go.mod'} does not require {module}")
    version = match.group(1)
    if module == _PROMETHEUS and version.startswith("0."):
        minor, patch = version.split(".")[1:3]
        version = f"{int(minor) // 100}.{int(minor) % 100}.{patch}"
    return version


def version(program: str, release: str | None = None) -> str:
    """`program`'s version in `release`: the pin for current, the Debian package's otherwise."""
    spec = PROGRAMS[program]
    if (release or current()) == "current":
        return pinned_version(spec.server, spec.module)
    return "debian"


def binary(program: str, release: str | None = None) -> str:
    """The path of `program` (a key of PROGRAMS) in `release` (default: the current switch)."""
    spec = PROGRAMS[program]
    release = release or current()
    if release == "debian":
        path = shutil.which(spec.debian_binary)
        if path is None:
            raise MissingBinary(
                f"{spec.debian_binary} not found: install the Debian package '{spec.debian_package}' "
                f"(apt-get install {spec.debian_package}, or run `make test`/`make demo`, which install it)")
        return path
    built = cache_root() / f"{spec.server}-{pinned_version(spec.server, spec.module)}" / spec.binary
    if not os.access(built, os.X_OK):
        raise MissingBinary(f"{spec.binary} {pinned_version(spec.server, spec.module)} is not built at {built}: "
                            "run scripts/build-servers.sh (make test runs it)")
    return str(built)
