"""Renders one mixin template with a config: Jinja with delimiters that cannot meet the Go
templates of annotations (`{{ }}`) or PromQL, then the selectors added to every raw series.

Templates write settings as `[[ c.jobs.goodput_low.target ]]` and blocks as `[% ... %]`. A
template with neither is copied as it is, so a new rule file can be folded in by copying it here.

Selectors are added by one controlled pass instead of by hand in every expression: each name of a
series an exporter exports (`flopwatch_*` from the agent, `DCGM_FI_*` from dcgm-exporter) that is
not part of a recording rule's name gets the exporter's matchers; lines that are YAML comments are
left alone. In promtool test files the same pass sets those labels on the input series, so tests
written for the defaults feed the rules of any selector made of `=` matchers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import jinja2

from flopwatch import xid
from flopwatch.catalog import train as train_metrics
from flopwatch.catalog.gpu import CLOCK_EVENT_BITS
from flopwatch.durations import format_duration
from flopwatch.mixin.config import MixinConfig, Selector, duration_seconds
from flopwatch.mixin.promql import clock_events_from_mask
from flopwatch.mixin.scrape import Scrape

#: Raw-series name patterns per selector (MixinConfig.selectors field).
SERIES = {"agent": r"flopwatch_[a-z0-9_]+", "dcgm": r"DCGM_(?:FI|EXP)_[A-Z0-9_]+"}
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


def matchers(selector: Selector) -> list[tuple[str, str, str]]:
    """`job="a", env=~"b"` -> [("job", "=", "a"), ("env", "=~", "b")] (values still escaped)."""
    return [(m.group(1), m.group(2), m.group(3)) for m in _MATCHER.finditer(selector)]


def _single_quoted(value: str) -> str:
    """A PromQL string in single quotes (it sits inside double-quoted Go templates as well)."""
    return "'" + value.replace('\\"', '"').replace("'", "\\'") + "'"


def _reference(kind: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w:\"'])({SERIES[kind]})(?![\w:])(\{{[^}}]*\}})?")


def _promql_matchers(selector: Selector) -> str:
    return ",".join(f"{label}{op}{_single_quoted(value)}" for label, op, value in matchers(selector))


def select(name: str, selector: Selector) -> str:
    """`name` selecting `selector` (`up` -> `up{job='flopwatch'}`), for series the pass cannot know."""
    extra = _promql_matchers(selector)
    return f"{name}{{{extra}}}" if extra else name


def input_label(selector: Selector, label: str, default: str) -> str:
    """In a test file: the value an input series must carry for `label` (the selector's `=` value)."""
    return next((value for name, op, value in matchers(selector) if name == label and op == "="), default)


def add_selectors(text: str, config: MixinConfig) -> str:
    """`text` (rules or dashboard queries) with each raw series selecting its exporter's matchers."""
    for kind in SERIES:
        extra = _promql_matchers(getattr(config.selectors, kind))
        if not extra:
            continue
        pattern = _reference(kind)

        def select(match: re.Match[str], extra: str = extra) -> str:
            inner = (match.group(2) or "{}")[1:-1].strip()
            return f"{match.group(1)}{{{extra}{',' + inner if inner else ''}}}"

        text = _outside_comments(text, lambda line, p=pattern, f=select: p.sub(f, line))
    return text


def label_inputs(text: str, config: MixinConfig) -> str:
    """A promtool test file whose input series carry the selectors' `=` labels (replacing any label
    of the same name), so the tests of the defaults run against rules with other selectors."""
    for kind, names in SERIES.items():
        equal = [(label, value) for label, op, value in matchers(getattr(config.selectors, kind)) if op == "="]
        if not equal:
            continue
        pattern = re.compile(rf"(?<![\w:])({names})(\{{[^}}]*\}})")

        def relabel(match: re.Match[str], equal: list[tuple[str, str]] = equal) -> str:
            pairs = [p for p in re.findall(r'[a-zA-Z_]\w*="(?:[^"\\]|\\.)*"', match.group(2))
                     if p.split("=", 1)[0] not in {label for label, _ in equal}]
            return match.group(1) + "{" + ",".join([f'{label}="{value}"' for label, value in equal] + pairs) + "}"

        text = "\n".join(pattern.sub(relabel, line) if line.lstrip().startswith("- series:") else line
                         for line in text.split("\n"))
    return text


def _outside_comments(text: str, change: Callable[[str], str]) -> str:
    return "\n".join(line if line.lstrip().startswith("#") else change(line) for line in text.split("\n"))


# --- filters: settings as PromQL and as words ------------------------------------------------
def number(value: float) -> str:
    """A threshold as PromQL reads it: 120, 0.85, 1e-06."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def percent(value: float) -> str:
    """0.85 -> '85%'."""
    return f"{value * 100:.6g}%"


def seconds(duration: str) -> str:
    return number(duration_seconds(duration))


_WORDS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def words(duration: str) -> str:
    """'15m' -> '15 minutes', '1m30s' -> '1 minute 30 seconds' (annotations a person reads)."""
    left, parts = duration_seconds(duration), []
    for name, size in _WORDS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{int(count)} {name}{'s' if count != 1 else ''}")
    return " ".join(parts) or "0 seconds"


def environment(templates: Path, config: MixinConfig) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)), undefined=jinja2.StrictUndefined,
        variable_start_string="[[", variable_end_string="]]", block_start_string="[%", block_end_string="%]",
        comment_start_string="[#", comment_end_string="#]", keep_trailing_newline=True, autoescape=False,
        trim_blocks=True, lstrip_blocks=True,
    )
    scrape = Scrape.of(config.scrape_interval)
    env.filters.update(num=number, pct=percent, seconds=seconds, words=words, window=lambda d: f"[{d}]",
                       span=lambda d: f"[{scrape.span(d)}]", duration=format_duration,
                       sel=lambda name, kind: select(name, getattr(config.selectors, kind)))
    env.globals.update(
        input_label=lambda kind, label, default: input_label(getattr(config.selectors, kind), label, default),
        c=config, scrape=scrape, sev=config.severities, runbooks=config.urls.runbooks,
        xid_actions=xid.action_template, xid_page_regex=xid.page_regex, clock_event_bits=CLOCK_EVENT_BITS,
        clock_events_from_mask=clock_events_from_mask, recent_window=f"{train_metrics.RECENT_WINDOW_S:g}",
        recent_stale=f"{train_metrics.RECENT_STALE_S:g}",
    )
    return env


def generated_header(template: str, comment: str = "#") -> str:
    """The first line of every generated file: what made it and where to edit."""
    text = (f"GENERATED by `flopwatch rules build` from flopwatch/mixin/templates/{template}: edit the "
            "template and run `flopwatch rules build --out alerts`.")
    return f"{{{{/* {text} */}}}}\n" if comment == "go" else f"# {text}\n"


def render(templates: Path, name: str, config: MixinConfig) -> str:
    """Template `name` (a path under `templates`) rendered with `config`, without the header."""
    try:
        return environment(templates, config).get_template(name).render()
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"flopwatch/mixin/templates/{name}:{error.lineno}: {error.message}") from None
    except jinja2.UndefinedError as error:
        raise ValueError(f"flopwatch/mixin/templates/{name}: {error.message}") from None
