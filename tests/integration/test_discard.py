"""Discarding a dead row: the work row goes with an audit entry, the event stays in the
journal, ordered checkpoints move past it and the campaign's later events apply (S9, S17,
S24)."""

from __future__ import annotations

import pytest

from outbox import Conflict, Event, NotFound, Settings, ValidationError, append, db
from outbox.model import StoredEvent
from outbox.ops.discard import discard_one
from outbox.projection.app import Outbox
from outbox.projection.known import record
from outbox.queue.repair import list_audit
from outbox.worker.batch import Worker

APPLIED = "CREATE TABLE applied (campaign_id text, seq bigint, PRIMARY KEY (campaign_id, seq))"


def poisoned_app(settings: Settings) -> Outbox:
    """An ordered projector that fails on a payload marked poison."""
    app = Outbox(settings)

    @app.projector("applied", events=["step"])
    async def applied(tx: db.Connection, event: StoredEvent) -> None:
        if event.payload.get("poison"):
            raise ValueError("poisoned step")
        await tx.execute("INSERT INTO applied VALUES ($1, $2)", event.campaign_id, event.seq)

    return app


async def dead_in_the_middle(pool: db.Pool, dsn: str) -> Outbox:
    """Campaign c: seq 1 applied, seq 2 dead (poison), seq 3 waiting behind it (in the
    projector's dead hold on c: its row went, S24)."""
    await pool.execute(APPLIED)
    settings = Settings(dsn=dsn, max_attempts=1)
    steps = [Event("step", {}), Event("step", {"poison": True}), Event("step", {})]
    await append(pool, "c", steps, settings=settings)
    app = poisoned_app(settings)
    counts = await Worker(app, pool).drain()
    assert (counts.applied, counts.dead) == (1, 1)
    return app


async def test_a_discarded_row_lets_its_campaign_apply_and_keeps_its_event(
    pool: db.Pool, dsn: str
) -> None:
    app = await dead_in_the_middle(pool, dsn)
    discarded = await discard_one(
        pool, app.registry, "c", 2, reason="bad data, ticket 7", actor="ops-ana"
    )
    assert (discarded.event_type, discarded.attempt_count) == ("step", 1)
    assert discarded.last_error == "projector 'applied': ValueError: poisoned step"
    assert discarded.checkpoints_moved == ["applied"]
    counts = await Worker(app, pool).drain()
    assert counts.applied == 1  # seq 3, no gap
    assert [tuple(r) for r in await pool.fetch("SELECT * FROM applied ORDER BY seq")] == [
        ("c", 1),
        ("c", 3),
    ]
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_campaigns") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.event_journal WHERE seq = 2") == 1
    assert await pool.fetchval("SELECT applied_seq FROM outbox.projection_checkpoints") == 3
    async with pool.acquire() as conn:
        (entry,) = await list_audit(conn, "c", limit=10)
    assert (entry.action, entry.seq, entry.actor, entry.reason) == (
        "discard",
        2,
        "ops-ana",
        "bad data, ticket 7",
    )
    assert (entry.previous_status, entry.previous_attempt_count) == ("dead", 1)


async def test_a_discard_is_refused_without_changing_anything(pool: db.Pool, dsn: str) -> None:
    app = await dead_in_the_middle(pool, dsn)
    with pytest.raises(ValidationError, match="reason"):
        await discard_one(pool, app.registry, "c", 2, reason="  ")
    with pytest.raises(NotFound):
        await discard_one(pool, app.registry, "c", 9, reason="r")
    with pytest.raises(NotFound):  # its share waits in the hold: no row
        await discard_one(pool, app.registry, "c", 3, reason="r")
    await append(pool, "d", [Event("step", {})], settings=app.settings)
    with pytest.raises(Conflict, match="is pending, not dead"):
        await discard_one(pool, app.registry, "d", 1, reason="r")
    with pytest.raises(NotFound, match="projector 'other' is not recorded"):  # not the app's
        await discard_one(pool, app.registry, "c", 2, reason="r", projector="other")
    await record(pool, app.registry, "w-1")
    other = Outbox(app.settings)  # a projector the database knows, holding nothing here

    @other.projector("other", events=["step"])
    async def nothing(tx: db.Connection, event: StoredEvent) -> None:
        pass

    await record(pool, other.registry, "w-2")
    with pytest.raises(Conflict, match="'other' holds nothing"):
        await discard_one(pool, app.registry, "c", 2, reason="r", projector="other")
    # A checkpoint before the event's predecessor: the events before it are not applied.
    await pool.execute(
        "DELETE FROM outbox.projection_checkpoint_moves;"
        " UPDATE outbox.projection_checkpoint_keys SET applied_seq = 0"
    )
    with pytest.raises(Conflict, match="projector 'applied' is at seq 0"):
        await discard_one(pool, app.registry, "c", 2, reason="r")
    rows = await pool.fetch("SELECT campaign_id, seq, status FROM outbox.projection_apply_outbox")
    assert sorted(tuple(r) for r in rows) == [("c", 2, "dead"), ("d", 1, "pending")]
    holds = await pool.fetch("SELECT projector, seq, status FROM outbox.projection_holds")
    assert [tuple(r) for r in holds] == [("applied", 2, "dead")]
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 0
