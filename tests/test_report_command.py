"""`flopwatch report` on the command line: exit codes and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flopwatch import cli
from flopwatch.stack import free_port


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flopwatch", "report", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_unreachable_prometheus_is_one_line_and_exit_1(tmp_path):
    done = run("--prometheus", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("flopwatch report: cannot reach Prometheus at http://127.0.0.1:")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--last", "a week"], "--last 'a week': expected a duration"),
    (["--price-kwh", "free"], "--price-kwh = 'free': expected a price"),
    (["--last", "7d", "--from", "2026-11-01"], "either --last or --from/--to"),
    (["--config", "/nonexistent/report.yml"], "config file /nonexistent/report.yml: cannot read it"),
    (["--rules-config", "/nonexistent/fw.yml"], "rules config /nonexistent/fw.yml: cannot read it"),
])
def test_bad_input_is_exit_2_with_what_to_do(tmp_path, capsys, args, message):
    code = cli.main(["report", "--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path), *args])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_prometheus_that_is_not_a_url(tmp_path, capsys):
    assert cli.main(["report", "--prometheus", "prometheus:9090", "--out", str(tmp_path)]) == 2
    assert "expected a URL like http://127.0.0.1:9090" in capsys.readouterr().err


def test_help():
    done = subprocess.run([sys.executable, "-m", "flopwatch", "report", "--help"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0
    for flag in ("--prometheus", "--last", "--from", "--to", "--out", "--price-kwh", "--price-gpu-hour", "--config",
                 "--rules-config"):
        assert flag in done.stdout
