"""The in-process API: the worker inside an application, and the test helper."""

from __future__ import annotations

import anyio
import pytest
from factories import make_dead

import outbox
from outbox import Event, Settings, db
from outbox.model import StoredEvent


def counting_app(dsn: str | None) -> outbox.Outbox:
    app = outbox.Outbox(Settings(dsn=dsn, poll_interval=0.05))

    @app.projector("tally", events=["order.placed"])
    async def tally(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO tally VALUES ($1, 1) ON CONFLICT (campaign_id) "
            "DO UPDATE SET n = tally.n + 1",
            event.campaign_id,
        )

    return app


@pytest.fixture
async def tally(pool: db.Pool) -> None:
    await pool.execute("CREATE TABLE tally (campaign_id text PRIMARY KEY, n int NOT NULL)")


@pytest.mark.parametrize("listen", [True, False], ids=["listen", "poll"])
async def test_running_worker_applies_in_the_background_and_stops_cleanly(
    pool: db.Pool, dsn: str, tally: None, listen: bool
) -> None:
    app = counting_app(dsn if listen else None)
    async with outbox.running_worker(app, pool, concurrency=2) as service:
        results = [
            await app.append(pool, f"o-{n}", [Event("order.placed", {})] * 3) for n in range(5)
        ]
        with anyio.fail_after(30):
            for r in results:
                assert await outbox.wait_applied(pool, r.campaign_id, r.last_seq, timeout=30)
        registered = await pool.fetchval(
            "SELECT stopped_at IS NULL FROM outbox.outbox_workers WHERE worker_id = $1",
            service.worker_id,
        )
        assert registered
    assert service.totals.applied == 15
    assert await pool.fetchval("SELECT sum(n) FROM tally") == 15
    assert await pool.fetchval(
        "SELECT stopped_at IS NOT NULL FROM outbox.outbox_workers WHERE worker_id = $1",
        service.worker_id,
    )
    # Its registry row keeps what it did, per projector too (the console's projectors page).
    counters = await pool.fetchval(
        "SELECT counters FROM outbox.outbox_workers WHERE worker_id = $1", service.worker_id
    )
    assert counters["applied"] == 15
    assert counters["projectors"] == [
        {"projector": "tally", "applied": 15, "skipped": 0, "failed": 0}
    ]


async def test_running_worker_refuses_an_unmigrated_database(fresh_db: str) -> None:
    pool = await db.create_pool(fresh_db, min_size=1, max_size=2)
    try:
        with pytest.raises(outbox.SchemaNotReady):
            async with outbox.running_worker(counting_app(fresh_db), pool):
                pass
    finally:
        await pool.close()


async def test_drain_now_applies_what_is_due_for_a_test(pool: db.Pool, tally: None) -> None:
    app = counting_app(None)
    await app.append(pool, "o-1", [Event("order.placed", {})] * 4)
    counts = await outbox.drain_now(app, pool)
    assert (counts.applied, counts.failed) == (4, 0)
    assert await pool.fetchval("SELECT n FROM tally") == 4
    assert (await outbox.drain_now(app, pool)).claimed == 0


async def test_a_drain_claims_past_campaigns_left_with_nothing_live(
    pool: db.Pool, tally: None
) -> None:
    """A requeue, reconcile or discard can leave a campaign row due with nothing live behind it
    (its append head was not held: the next claim removes it). Thirty of them come first in the
    queue; a drain whose claim takes only those claims again, and applies the work behind."""
    app = counting_app(None)
    app.settings = app.settings.replace(batch_size=5)
    empty = [f"e-{i:02}" for i in range(30)]
    for campaign in empty:
        await app.append(pool, campaign, [Event("order.placed", {})])
    for campaign in empty:  # each one's row dead; its queue row left due now, head 0
        await make_dead(pool, campaign)
    await app.append(pool, "o-1", [Event("order.placed", {})] * 3)
    counts = await outbox.drain_now(app, pool)
    assert counts.applied == 3
    assert await pool.fetchval("SELECT n FROM tally WHERE campaign_id = 'o-1'") == 3
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_campaigns") == 0
