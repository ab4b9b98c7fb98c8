"""The training family in the catalogue, and the histogram type it brought to `Metric`."""

from __future__ import annotations

import pytest
from prometheus_client.core import HistogramMetricFamily

from flopwatch.catalog import Metric, metrics_of
from flopwatch.catalog import train as m
from flopwatch.train import wire


def test_histogram_family_and_buckets_from_the_wire():
    family = m.STEP_SECONDS.family()
    assert isinstance(family, HistogramMetricFamily)
    assert m.STEP_SECONDS.buckets == wire.STEP_BUCKETS
    family.add_metric(["n1", "job"], [("1.0", 2), ("+Inf", 3)], 4.5)
    assert {s.name for s in family.samples} == {"flopwatch_train_step_seconds_bucket",
                                               "flopwatch_train_step_seconds_count",
                                               "flopwatch_train_step_seconds_sum"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "flopwatch_x_seconds", "type": "histogram", "unit": "seconds"}, "only histograms have buckets"),
        ({"name": "flopwatch_x_seconds", "type": "gauge", "unit": "seconds", "buckets": (1.0,)},
         "only histograms have buckets"),
        ({"name": "flopwatch_x_seconds", "type": "histogram", "unit": "seconds", "buckets": (2.0, 1.0)},
         "ascending"),
        ({"name": "flopwatch_x_seconds_total", "type": "histogram", "unit": "seconds", "buckets": (1.0,)},
         "_total"),
        ({"name": "flopwatch_x_seconds_sum", "type": "histogram", "unit": "seconds", "buckets": (1.0,)},
         "_bucket, _count or _sum"),
    ],
)
def test_bad_histogram_specs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Metric(help="h", **kwargs)


def test_train_series_use_the_documented_names_and_labels():
    names = {metric.name: metric for metric in metrics_of(m)}
    for name in ("flopwatch_train_steps_total", "flopwatch_train_tokens_total",
                 "flopwatch_train_model_flops_total", "flopwatch_train_hardware_flops_total",
                 "flopwatch_train_last_step_timestamp_seconds"):
        assert names[name].labels == ("job_id", "rank", "gpu", "stage", "dp_rank")
    assert names["flopwatch_train_phase_seconds_total"].labels == ("job_id", "rank", "gpu", "stage", "dp_rank",
                                                                    "phase")
    assert names["flopwatch_train_checkpoint_seconds_total"].labels == ("job_id", "rank", "gpu", "stage",
                                                                         "dp_rank", "kind")
    assert names["flopwatch_train_comm_min_seconds"].labels == ("job_id", "rank", "gpu", "stage", "dp_rank")
    assert names["flopwatch_train_step_seconds"].labels == ("job_id",)
    assert names["flopwatch_train_events_rejected_total"].labels == ("reason",)
    assert names["flopwatch_train_client_dropped_events_total"].labels == ("job_id", "rank")
