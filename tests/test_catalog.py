"""The catalogue is the single source of metric names; docs/metrics.md is generated from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwatch.catalog import Metric, all_metrics, by_name
from flopwatch.commands.docs import render_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_names_unique_and_conventional():
    names = [metric.name for _, metric in all_metrics()]
    assert len(names) == len(set(names))
    for name in names:
        assert name.startswith("flopwatch_")
        assert name == name.lower()
    assert "flopwatch_build_info" in by_name()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "gpu_power_watts", "type": "gauge", "unit": "watts"}, "starts with flopwatch_"),
        ({"name": "flopwatch_x_bytes", "type": "counter", "unit": "bytes"}, "_total"),
        ({"name": "flopwatch_x_total", "type": "gauge", "unit": ""}, "_total"),
        ({"name": "flopwatch_x_power", "type": "gauge", "unit": "watts"}, "unit"),
        ({"name": "flopwatch_x", "type": "gauge", "unit": "", "labels": ("job",)}, "owned by Prometheus"),
    ],
)
def test_catalogue_rejects_bad_specs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Metric(help="h", **kwargs)


def test_docs_metrics_md_matches_catalogue():
    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed == render_metrics(), (
        "docs/metrics.md drifted from flopwatch/catalog: run `make docs` "
        "(flopwatch docs metrics --out docs/metrics.md) and commit the result"
    )


def test_every_metric_is_documented():
    text = render_metrics()
    for _, metric in all_metrics():
        assert f"`{metric.name}`" in text
