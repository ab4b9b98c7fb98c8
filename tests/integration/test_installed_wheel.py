"""FlopWatch as a new user gets it: a wheel built from this tree, installed into a fresh virtual
environment outside the source tree, run from a directory that is not the checkout.

The wheel is built offline from a copy of the tree's files (tracked and new, not ignored ones),
with .venv's setuptools. The fresh environment reaches the dependencies already installed in .venv
through a .pth line naming .venv's site-packages directory: a plain path entry, so .venv's own
.pth files (among them the editable install's finder, which would point back at the checkout) are
never run. Every command then must find the rules, the Alertmanager config, the dashboards and the
scenario suite inside the installed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from flopwatch import resources

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: What the wheel is built from: the packaging files, the package and the data folders.
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "flopwatch", *resources.PACKAGED]


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    answer = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert answer.returncode == 0, f"{' '.join(command)} exited {answer.returncode}:\n{answer.stderr[-3000:]}"
    return answer


def copy_tree(into: Path) -> None:
    """The files of SOURCES that git tracks or would track (nothing ignored: no caches, no build/)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCES],
                            cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin directory, environment, a working directory outside the checkout, site-packages)."""
    base = tmp_path_factory.mktemp("wheel")
    source, dist, venv, work = base / "src", base / "dist", base / "venv", base / "work"
    work.mkdir()
    copy_tree(source)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w",
         str(dist), str(source)], base, env, 300)
    wheels = list(dist.glob("flopwatch-*.whl"))
    assert len(wheels) == 1, wheels
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, env, 120)
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work, env,
                    60).stdout.strip())
    (site / "flopwatch-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(wheels[0])], base, env, 300)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv / "bin", env, work, site


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    bin_dir, env, work, site = installed
    answer = run([str(bin_dir / "python"), "-c", "import flopwatch, flopwatch.resources as r; "
                  "print(flopwatch.__file__); print(r.source_root()); print(r.folder('alerts'))"], work, env, 60)
    module, root, alerts = answer.stdout.split("\n")[:3]
    assert Path(module).is_relative_to(site)
    assert root == "None"
    assert Path(alerts) == site / "flopwatch" / "_data" / "alerts"


def test_packaged_data_is_identical_to_the_repository(installed):
    """The wheel's copies are the repository's files, byte for byte (no drift)."""
    _, _, _, site = installed
    data = site / "flopwatch" / "_data"
    for folder, patterns in resources.PACKAGED.items():
        expected = {p.relative_to(ROOT / folder) for pattern in patterns for p in (ROOT / folder).glob(pattern)}
        packaged = {p.relative_to(data / folder) for p in (data / folder).rglob("*") if p.is_file()}
        assert packaged == expected, folder
        for name in expected:
            assert (data / folder / name).read_bytes() == (ROOT / folder / name).read_bytes(), f"{folder}/{name}"


def test_dashboards_build_writes_the_committed_json(installed):
    bin_dir, env, work, _ = installed
    run([str(bin_dir / "flopwatch"), "dashboards", "build", "--out", "built"], work, env, 120)
    committed = sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    assert sorted(p.name for p in (work / "built").glob("*.json")) == committed
    for name in committed:
        assert (work / "built" / name).read_bytes() == (ROOT / "dashboards" / name).read_bytes(), name


def test_rules_build_from_the_wheel_writes_the_committed_alerts(installed):
    """The templates and defaults travel in the wheel: the installed `flopwatch rules build` writes the
    repository's alerts/ (rule files, tests, Alertmanager files) and dashboards/, byte for byte."""
    bin_dir, env, work, _ = installed
    run([str(bin_dir / "flopwatch"), "rules", "build", "--out", "mixin/alerts"], work, env, 120)
    built = sorted(str(p.relative_to(work / "mixin" / "alerts")) for p in (work / "mixin" / "alerts").rglob("*")
                   if p.is_file())
    assert len(built) >= 20
    for name in built:
        assert (work / "mixin" / "alerts" / name).read_bytes() == (ROOT / "alerts" / name).read_bytes(), name
    assert sorted(p.name for p in (work / "mixin" / "dashboards").glob("*.json")) == \
        sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))


def test_bench_detect_quick_runs_on_the_packaged_rules_and_suite(installed):
    bin_dir, env, work, site = installed
    run([str(bin_dir / "flopwatch"), "bench", "detect", "--quick", "--json", "detect.json"], work, env, 300)
    report = json.loads((work / "detect.json").read_text())
    data = site / "flopwatch" / "_data"
    assert report["rule_files"], "no rule files ran"
    assert all(Path(f).is_relative_to(data / "alerts") for f in report["rule_files"])
    assert report["scenarios"], "no scenario ran"
    assert report["summary"]["recall"] is not None


def test_demo_pages_the_straggler_from_the_installed_package(installed):
    bin_dir, env, work, _ = installed
    answer = run([str(bin_dir / "flopwatch"), "demo", "--duration", "60"], work, env, 300)
    summary = " ".join(answer.stderr[answer.stderr.index("demo summary"):].split())
    pages = [line for line in summary.split("FlopWatch")[1:] if line.startswith("Straggler:")]
    assert pages, f"no straggler page in the summary: {summary}"
    assert "node0003" in pages[0] and "GPU 5" in pages[0], pages[0]
    assert "report: not written" not in summary
