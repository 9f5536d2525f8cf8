"""Metrics series that exist before any work, and what counts as a batch (no database)."""

from __future__ import annotations

from outbox.model import BatchCounts
from outbox.obs.metrics import Metrics


def test_a_claim_that_found_nothing_is_not_a_batch() -> None:
    metrics = Metrics()
    metrics.record_batch(BatchCounts())
    sample = metrics.registry.get_sample_value
    assert sample("outbox_batches_total") == 0
    assert sample("outbox_batch_size_count") == 0
    metrics.record_batch(BatchCounts(claimed=2, applied=2))
    assert sample("outbox_batches_total") == 1
    assert sample("outbox_events_total", {"outcome": "applied"}) == 2


def test_registered_projectors_have_series_at_zero_before_their_first_event() -> None:
    metrics = Metrics()
    metrics.register_projectors(["totals", "roster"])
    sample = metrics.registry.get_sample_value
    for name in ("totals", "roster"):
        for outcome in ("applied", "skipped", "failed"):
            assert sample("outbox_apply_total", {"projector": name, "outcome": outcome}) == 0
        assert sample("outbox_apply_duration_seconds_count", {"projector": name}) == 0
    assert sample("outbox_apply_total", {"projector": "other", "outcome": "applied"}) is None
