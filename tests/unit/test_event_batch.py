"""EventBatch: a batch projector's events as columns, and as StoredEvents on demand."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from outbox import EventBatch, StoredEvent

AT = datetime(2026, 11, 24, tzinfo=UTC)


def events(n: int) -> list[StoredEvent]:
    return [StoredEvent(f"c{i % 2}", i + 1, "t", {"n": i}, {"m": i}, AT) for i in range(n)]


Columns = tuple[list[str], list[int], list[str], list[Any], list[dict[str, Any]], list[datetime]]


def columns(batch: EventBatch) -> Columns:
    return (
        batch.campaign_ids,
        batch.seqs,
        batch.types,
        batch.payloads,
        batch.metadata,
        batch.recorded_at,
    )


def test_columns_and_events_say_the_same() -> None:
    stored = events(5)
    batch = EventBatch(*columns(EventBatch.of(stored)))  # built from columns alone
    assert isinstance(batch, Sequence)
    assert len(batch) == 5
    assert list(batch) == stored
    assert [batch[i] for i in range(-5, 5)] == stored + stored
    assert batch.seqs == [1, 2, 3, 4, 5]
    assert [p["n"] for p in batch.payloads] == [0, 1, 2, 3, 4]
    assert batch[2] is batch[2]  # built once
    assert next(iter(batch)) is batch[0]


def test_of_keeps_a_batch_and_the_objects_it_was_given() -> None:
    stored = events(3)
    batch = EventBatch.of(stored)
    assert EventBatch.of(batch) is batch
    assert all(a is b for a, b in zip(batch, stored, strict=True))


def test_take_and_slices_are_batches_of_those_events() -> None:
    stored = events(6)
    batch = EventBatch.of(stored)
    picked = batch.take([4, 1])
    assert isinstance(picked, EventBatch)
    assert picked.seqs == [5, 2]
    assert list(picked) == [stored[4], stored[1]]
    assert batch.take(range(6)) is batch
    sliced = batch[1:5:2]
    assert isinstance(sliced, EventBatch)
    assert list(sliced) == stored[1:5:2]
    assert columns(sliced)[0] == ["c1", "c1"]
    assert len(batch[6:]) == 0
