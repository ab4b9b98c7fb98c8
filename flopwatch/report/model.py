"""What a report says, independent of how it is rendered (HTML, Markdown, CSV, PDF).

Sections hold key figures, tables (each also written as a CSV file), charts and notes. A note is
how missing data is said out loud: a section without data has a note, never a silent zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ColumnKind = Literal["text", "int", "float", "pct", "hours", "kwh", "money", "time", "duration", "si"]


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    kind: ColumnKind = "text"


@dataclass
class Table:
    """Rows of values (raw numbers: formatting belongs to the renderers). `name` is the CSV stem."""

    name: str
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    empty: str = "nothing to list"


@dataclass
class Series:
    name: str
    times: list[float]
    values: list[float]          # NaN where there is no value


@dataclass
class Chart:
    """A line or stacked-area chart over time, or a horizontal bar chart of labelled values."""

    name: str
    title: str
    kind: Literal["line", "area", "bar"]
    unit: ColumnKind = "float"
    series: list[Series] = field(default_factory=list)
    bars: list[tuple[str, float]] = field(default_factory=list)
    y_max: float | None = None


@dataclass
class Figure:
    """A key number with its label, e.g. ("Fleet MFU", 0.31, "pct")."""

    label: str
    value: float | str | None
    kind: ColumnKind = "float"
    detail: str = ""


@dataclass
class Section:
    id: str
    title: str
    intro: str = ""
    figures: list[Figure] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)   # bullet points (recommendations)


@dataclass
class Report:
    title: str
    prometheus: str
    start: float
    end: float
    generated: float
    step: float
    currency: str
    sections: list[Section] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # report-wide (no data, failed queries)
    has_data: bool = True

    def tables(self) -> list[Table]:
        return [table for section in self.sections for table in section.tables]

    def section(self, section_id: str) -> Section:
        return next(section for section in self.sections if section.id == section_id)
