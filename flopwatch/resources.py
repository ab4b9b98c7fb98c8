"""The files FlopWatch's commands read: alert rules, the Alertmanager config and templates, the
Grafana dashboards and the detection benchmark's scenario suite.

One copy of truth: the repository's `alerts/` and `dashboards/`, and the package's own
`flopwatch/detect/scenarios/`. In a source checkout (an editable install, `make demo`) they are
read where they are, so an edit shows at once; a wheel carries the top-level folders as the
package data of `flopwatch._data` (setup.py copies them in at build time) and the scenarios as
ordinary package data, and `importlib.resources` finds them there. A folder missing from both is
an error naming it, never a quiet empty list.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: Resource name -> where it lives in the repository (and under flopwatch/_data/ in a wheel).
FOLDERS = {
    "alerts": "alerts",
    "alert-templates": "alerts/templates",
    "dashboards": "dashboards",
    "scenarios": "flopwatch/detect/scenarios",
}
#: Which files of each repository folder a wheel carries (globs relative to the folder).
PACKAGED = {
    "alerts": ("*.yml", "templates/*.tmpl"),
    "dashboards": ("*.json",),
}


class MissingResource(RuntimeError):
    """A file FlopWatch ships is not where it should be: a broken install or checkout."""


def source_root() -> Path | None:
    """The repository root when flopwatch is imported from a source checkout, else None."""
    root = Path(__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and (root / "alerts").is_dir() and 'name = "flopwatch"' in pyproject.read_text():
        return root
    return None


def folder(name: str) -> Path:
    """The folder of resource `name` (a key of FOLDERS): the checkout's, else the wheel's copy."""
    relative = FOLDERS[name]
    root = source_root()
    if root is not None:
        path = root / relative
    else:
        parts = relative.split("/")
        inside = parts[1:] if parts[0] == "flopwatch" else ["_data", *parts]
        path = Path(str(resources.files("flopwatch").joinpath(*inside)))
    if not path.is_dir():
        raise MissingResource(f"{relative}/ not found at {path}: FlopWatch's {name} are missing from this "
                              "install (reinstall the package, or run from a full checkout)")
    return path


def file(name: str, filename: str) -> Path:
    """One file of resource folder `name`, e.g. file("alerts", "alertmanager.yml")."""
    path = folder(name) / filename
    if not path.is_file():
        raise MissingResource(f"{FOLDERS[name]}/{filename} not found at {path}: FlopWatch's {name} are "
                              "incomplete in this install (reinstall the package, or run from a full checkout)")
    return path


def rule_files() -> list[Path]:
    """Every rule file FlopWatch ships (alerts/*.yml but the Alertmanager config), sorted."""
    files = sorted(p for p in folder("alerts").glob("*.yml") if p.name != "alertmanager.yml")
    if not files:
        raise MissingResource(f"no rule files (*.yml) in {folder('alerts')}: FlopWatch's alert rules are missing")
    return files
