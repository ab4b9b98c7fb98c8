"""Build step that puts the repository's rules, Alertmanager config and templates and dashboards
into the wheel as package data of flopwatch._data (flopwatch/resources.py reads them), so the
repository's alerts/ and dashboards/ stay the one copy of truth.
Everything else is in pyproject.toml."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def packaged() -> dict[str, tuple[str, ...]]:
    """flopwatch.resources.PACKAGED, read from the module file (importing flopwatch needs its
    dependencies, which a build environment lacks)."""
    spec = importlib.util.spec_from_file_location("_flopwatch_resources", ROOT / "flopwatch" / "resources.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PACKAGED


class BuildWithData(build_py):
    """build_py, then copy the data folders into build_lib/flopwatch/_data/."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "flopwatch" / "_data"
        for folder, patterns in packaged().items():
            source = ROOT / folder
            if not source.is_dir():
                raise SystemExit(f"setup.py: {folder}/ is missing: cannot build a wheel without it")
            for pattern in patterns:
                for path in sorted(source.glob(pattern)):
                    destination = target / folder / path.relative_to(source)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, destination)


setup(cmdclass={"build_py": BuildWithData})
