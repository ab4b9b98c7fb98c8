"""Which server build runs (flopwatch.stack.releases) and the script that builds the current ones
(scripts/build-servers.sh). The binaries are the real ones: Debian's packages and the builds that
`make test` leaves in the cache; the build-failure case puts a `go` that fails in front of the real
one, the narrowest seam at which a build can be made to fail on purpose."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import program

from flopwatch.stack import Alertmanager, MissingBinary, Prometheus, releases

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "build-servers.sh"


def test_the_pins_are_read_from_each_servers_go_mod() -> None:
    gomod = (ROOT / "scripts/servers/prometheus/go.mod").read_text()
    assert "github.com/prometheus/prometheus v0.316.0" in gomod
    assert releases.version("prometheus", "current") == "3.16.0"          # 3.x is the module's v0.3xx.y
    assert releases.version("promtool", "current") == "3.16.0"
    assert releases.version("alertmanager", "current") == "0.31.1"
    assert releases.version("vmalert", "current") == "1.151.0"


@pytest.mark.parametrize("name", sorted(releases.PROGRAMS))
def test_every_program_exists_in_both_releases(name: str) -> None:
    debian, current = program(name, "debian"), program(name, "current")
    assert Path(debian).name == releases.PROGRAMS[name].debian_binary
    assert Path(current).parent.name.endswith(releases.version(name, "current"))
    assert debian != current


@pytest.mark.parametrize(("name", "flag", "expected"), [
    ("prometheus", "--version", "version 3.16.0"),
    ("alertmanager", "--version", "version 0.31.1"),
    ("victoria-metrics", "-version", "victoria-metrics-v1.151.0"),
])
def test_the_current_builds_say_their_pinned_version(name: str, flag: str, expected: str) -> None:
    done = subprocess.run([program(name, "current"), flag], capture_output=True, text=True, timeout=30, check=False)
    assert expected in done.stdout + done.stderr


def test_the_switch_picks_the_build_and_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(releases.ENVIRONMENT, raising=False)
    assert releases.current() == "debian"
    with releases.use("current"):
        assert os.environ[releases.ENVIRONMENT] == "current"
        prometheus, alertmanager = Prometheus(), Alertmanager("route: {receiver: x}\nreceivers: [{name: x}]\n")
    try:
        assert prometheus.command() == [program("prometheus", "current")] and prometheus.upstream
        assert alertmanager.command() == [program("alertmanager", "current")]
    finally:
        prometheus.stop()
        alertmanager.stop()
    assert releases.ENVIRONMENT not in os.environ
    assert not Prometheus().upstream


def test_an_unknown_release_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(releases.ENVIRONMENT, "bleeding")
    with pytest.raises(releases.UnknownRelease,
                       match=r"FLOPWATCH_SERVERS=.bleeding. is not a release: use one of debian, current"):
        releases.current()


def test_a_missing_build_names_the_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(releases.CACHE_ENVIRONMENT, str(tmp_path))
    with pytest.raises(MissingBinary, match=r"promtool 3\.16\.0 is not built at .*run scripts/build-servers.sh"):
        releases.binary("promtool", "current")


def test_a_second_run_builds_nothing() -> None:
    """`make test` has built everything into the default cache: running the script again builds
    no server and leaves every binary as it was."""
    before = {path: path.stat().st_mtime_ns for path in releases.cache_root().glob("*/*") if path.is_file()}
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "building" not in done.stderr
    after = {path: path.stat().st_mtime_ns for path in releases.cache_root().glob("*/*") if path.is_file()}
    assert after == before and len(before) >= len(releases.PROGRAMS)


def test_a_failed_build_names_the_server_and_its_last_lines(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "go").write_text("#!/bin/sh\n[ \"$1\" = build ] || exec /usr/local/go/bin/go \"$@\"\n"
                             "echo 'compile: something upstream broke' >&2\nexit 1\n")
    (fake / "go").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", releases.CACHE_ENVIRONMENT: str(tmp_path / "cache")}
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 1
    assert "building prometheus 3.16.0 failed; the last lines of its build:" in done.stderr
    assert "compile: something upstream broke" in done.stderr
    assert not list((tmp_path / "cache").glob("prometheus-*"))   # nothing half-built is kept as built
