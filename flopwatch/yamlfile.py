"""One way to read the YAML files users hand FlopWatch (agent config, report settings, scenarios,
web config, rule files, alertmanager.yml, the rules' settings, the rails file): small UTF-8 text,
safe-loaded (or composed, for readers that name each value's line), and when it is not, one line
naming the file, the line and what is wrong (never a parser's stack trace, never the line's text:
a web config's line can hold a password hash).

Callers turn `YamlFileError` into their own error type so each command keeps its exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1 << 20   # a config file larger than this is not one (or is hostile)


class YamlFileError(ValueError):
    """The file cannot be read as YAML; the message names it (and the line, for a syntax error)."""


def read_text(path: str | Path, what: str = "config file", limit: int = MAX_FILE_BYTES) -> str:
    """The text of a small UTF-8 file."""
    try:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except OSError as error:
        raise YamlFileError(f"{what} {path}: cannot read it ({error.strerror})") from None
    if len(data) > limit:
        raise YamlFileError(f"{what} {path}: larger than {limit >> 20} MiB; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise YamlFileError(f"{what} {path}: not a UTF-8 text file") from None


def _syntax(error: yaml.YAMLError) -> tuple[int | None, str]:
    """The 1-based line of a YAML syntax error (None when the parser gave none) and ` (problem)`."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    return (mark.line + 1 if mark else None), (f" ({problem})" if problem else "")


def parse_text(text: str, source: str) -> Any:
    """The YAML document in `text` (None when empty); `source` opens the error message."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        line, problem = _syntax(error)
        where = f" at line {line}" if line else ""
        raise YamlFileError(f"{source}: not valid YAML{where}{problem}") from None


def load(path: str | Path, what: str = "config file", limit: int = MAX_FILE_BYTES) -> Any:
    """The YAML document in the file at `path` (None when empty)."""
    return parse_text(read_text(path, what, limit), f"{what} {path}")


def compose(path: str | Path, what: str = "config file", limit: int = MAX_FILE_BYTES) -> yaml.Node | None:
    """The node tree of the YAML file at `path` (None when empty), for readers that name the line
    of each wrong value themselves (`path:line: ...`): a syntax error reads the same way,
    `path:line: not valid YAML (problem)`. Composing builds no objects, so no tag is constructed."""
    text = read_text(path, what, limit)
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        line, problem = _syntax(error)
        raise YamlFileError(f"{path}:{line or 1}: not valid YAML{problem}") from None


def files(path: str | Path, what: str, skip: tuple[str, ...] = ()) -> list[Path]:
    """The YAML file at `path`, or every *.yml/*.yaml of the folder (sorted, except the names in
    `skip`); `what` names them in the error when there are none (`scenario files`)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix in (".yml", ".yaml") and p.name not in skip)
        if not found:
            raise YamlFileError(f"{path}: no {what} (*.yml) in this directory")
        return found
    if not path.exists():
        raise YamlFileError(f"{path}: no such {what.removesuffix('s')} or directory")
    return [path]
