"""Scenario files shipped with FlopWatch; `flopwatch sim --scenario NAME` finds them by name."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def shipped() -> dict[str, Path]:
    return {path.stem: path for path in sorted(HERE.glob("*.yml"))}


def resolve(name_or_path: str) -> Path:
    """A path as given when it exists, else a shipped scenario of that name."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yml", ".yaml") or "/" in name_or_path:
        return path
    return shipped().get(name_or_path, path)
