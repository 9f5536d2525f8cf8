"""The batch histogram exposes what prometheus_client's Histogram would for the same values."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from outbox.obs.metrics import BatchHistogram

BUCKETS = (0.005, 0.01, 0.025, 0.1, 1, 10, 3600)
# Values on a bound count in that bucket (le is inclusive); the last ones only under +Inf.
VALUES = [0.0, 0.005, 0.0050001, 0.01, 0.3, 0.3, 1.0, 9.99, 10.0, 3600.0, 3600.5, 1e9]


def exposition(registry: CollectorRegistry) -> tuple[list[str], float]:
    """The bucket and count lines, and the sum (added in another order: equal to rounding)."""
    lines = generate_latest(registry).decode().splitlines()
    (total,) = [float(line.split()[1]) for line in lines if line.startswith("ages_sum")]
    return [line for line in lines if line.startswith(("ages_bucket", "ages_count"))], total


def test_batches_of_values_expose_as_one_histogram_observed_value_by_value() -> None:
    expected, batched = CollectorRegistry(), CollectorRegistry()
    histogram = Histogram("ages", "Ages.", buckets=BUCKETS, registry=expected)
    for value in VALUES:
        histogram.observe(value)
    by_batch = BatchHistogram("ages", "Ages.", buckets=BUCKETS, registry=batched)
    by_batch.observe_many(VALUES[:5])
    by_batch.observe_many([])
    by_batch.observe_many(reversed(VALUES[5:]))
    lines, total = exposition(batched)
    expected_lines, expected_total = exposition(expected)
    assert lines == expected_lines
    assert total == pytest.approx(expected_total)
    assert 'ages_bucket{le="+Inf"} 12.0' in lines
