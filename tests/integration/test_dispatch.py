"""Dispatch of a group in bulk: each projector gets the events after its own checkpoint, the
first failing event is the one named, a batch projector gets an EventBatch (S17, S18)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from outbox import EventBatch, Settings, db
from outbox.errors import CheckpointGap, UnknownEventType
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.dispatch import ApplyOutcome, Dispatch, GroupFailed

AT = datetime(2026, 11, 24, tzinfo=UTC)


def group(*runs: tuple[str, range], kind: str = "add") -> list[StoredEvent]:
    return [StoredEvent(c, s, kind, {"n": s}, {}, AT) for c, seqs in runs for s in seqs]


def recording_app(seen: dict[str, list[tuple[str, int]]], *, per_event: bool) -> Outbox:
    """Two batch projectors (a, b) and optionally a per-event one (c), all ordered, on `add`."""
    app = Outbox(Settings())
    for name in ("a", "b"):

        async def batch(tx: db.Connection, events: EventBatch, name: str = name) -> None:
            assert isinstance(events, EventBatch)
            seen[name] += list(zip(events.campaign_ids, events.seqs, strict=True))
            assert [(e.campaign_id, e.seq) for e in events] == seen[name][-len(events) :]

        app.projector(name, events=["add"], batch=True)(batch)
    if per_event:

        @app.projector("c", events=["add"])
        async def one(tx: db.Connection, event: StoredEvent) -> None:
            seen["c"].append((event.campaign_id, event.seq))

    return app


@pytest.mark.parametrize("per_event", [False, True], ids=["batch_only", "with_per_event"])
async def test_each_ordered_projector_gets_the_events_after_its_own_checkpoint(
    pool: db.Pool, per_event: bool
) -> None:
    seen: dict[str, list[tuple[str, int]]] = {"a": [], "b": [], "c": []}
    app = recording_app(seen, per_event=per_event)
    events = group(("x", range(1, 7)), ("y", range(1, 3)))
    async with pool.acquire() as conn:
        dispatch = Dispatch(conn, app.registry)
        dispatch.use({("x", "a"): 4, ("x", "b"): 2, ("x", "c"): 6})
        outcomes = await dispatch.apply(events)
    assert seen["a"] == [("x", 5), ("x", 6), ("y", 1), ("y", 2)]
    assert seen["b"] == [("x", s) for s in range(3, 7)] + [("y", 1), ("y", 2)]
    assert seen["c"] == ([("y", 1), ("y", 2)] if per_event else [])
    # x1 and x2 are behind every checkpoint: duplicates; the rest ran somewhere.
    duplicate, applied = ApplyOutcome.DUPLICATE, ApplyOutcome.APPLIED
    assert outcomes == [duplicate] * 2 + [applied] * 6
    ys = [("y", "a", 2), ("y", "b", 2)] + ([("y", "c", 2)] if per_event else [])
    assert dispatch.moves() == [("x", "a", 6), ("x", "b", 6), *ys]  # sorted: the lock order
    assert dispatch.tally[("a", "applied")] == 4
    assert dispatch.tally[("a", "skipped")] == 4
    assert dispatch.tally[("b", "skipped")] == 2


@pytest.mark.parametrize(
    ("events", "index", "error"),
    [
        # y's checkpoint is at 0: y3 (position 2) is a gap; nothing else fails.
        (group(("x", range(1, 3)), ("y", range(3, 5))), 2, CheckpointGap),
        # An unknown type before the gap is the first failure.
        (
            group(("x", range(1, 2)))
            + group(("x", range(2, 3)), kind="nope")
            + group(("y", range(3, 4))),
            1,
            UnknownEventType,
        ),
        # A gap before the unknown type is.
        (group(("x", range(2, 3))) + group(("y", range(1, 2)), kind="nope"), 0, CheckpointGap),
    ],
    ids=["gap", "unknown_first", "gap_first"],
)
async def test_the_first_failing_event_of_the_group_is_the_one_named(
    pool: db.Pool, events: list[StoredEvent], index: int, error: type[Exception]
) -> None:
    seen: dict[str, list[tuple[str, int]]] = {"a": [], "b": [], "c": []}
    app = recording_app(seen, per_event=False)
    async with pool.acquire() as conn:
        dispatch = Dispatch(conn, app.registry, unsubscribed="retry")
        with pytest.raises(GroupFailed) as failed:
            await dispatch.apply(events)
    assert failed.value.index == index
    assert isinstance(failed.value.cause, error)
    assert seen == {"a": [], "b": [], "c": []}  # nothing ran
    assert dispatch.moves() == []
