"""The queue's generations (S26): new work rows and campaign rows go to the current period's
slot, a rotation moves the oldest slot's live rows forward and truncates it, never waits past
its lock timeout, leaves a backlog to vacuum, and a campaign never has two campaign rows."""

from __future__ import annotations

from datetime import datetime, timedelta

import anyio
import pytest
from campaigns_demo import campaigns as c
from campaigns_demo.app import build_app, install

from helpers import campaigns_in_one_bucket, session_id, wait_until_blocked
from outbox import Event, Settings, append, db
from outbox.projection.app import Outbox
from outbox.queue.rotation import rotate
from outbox.queue.settle import refresh_campaigns
from outbox.worker.batch import Worker

pytestmark = pytest.mark.asyncio

ROWS = """
SELECT campaign_id, slot, head_seq, due_at, blocked
FROM outbox.projection_apply_campaigns ORDER BY campaign_id
"""


async def slot_at(pool: db.Pool, at: datetime) -> int:
    slot: int = await pool.fetchval("SELECT outbox.outbox_queue_slot($1)", at)
    return slot


async def slot_bytes(pool: db.Pool, slot: int) -> int:
    """The slot's heap bytes, work rows and campaign rows."""
    size: int = await pool.fetchval(
        "SELECT pg_relation_size(format('outbox.projection_apply_campaigns_%s', $1::int)) "
        "+ pg_relation_size(format('outbox.projection_apply_outbox_%s', $1::int))",
        slot,
    )
    return size


WORK_ROWS = """
SELECT campaign_id, seq, slot, status, attempt_count, next_attempt_at, last_error, enqueued_at
FROM outbox.projection_apply_outbox ORDER BY campaign_id, seq
"""


async def database_now(pool: db.Pool) -> datetime:
    now: datetime = await pool.fetchval("SELECT clock_timestamp()")
    return now


async def test_slots_turn_every_ten_seconds_over_three_partitions(pool: db.Pool) -> None:
    start = datetime.fromisoformat("2026-11-26T12:00:00+00:00")
    slots = [await slot_at(pool, start + timedelta(seconds=s)) for s in (0, 9.9, 10, 20, 30)]
    assert slots[0] == slots[1]
    assert len({slots[0], slots[2], slots[3]}) == 3
    assert slots[4] == slots[0]


async def test_a_rotation_moves_live_rows_forward_and_empties_the_oldest_slot(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = build_app(Outbox(settings))
    live, drained = campaigns_in_one_bucket(2, "rot")
    now = await database_now(pool)
    await append(pool, live, [Event(c.DICE_ROLLED, {"value": 2})], settings=settings)
    await append(pool, drained, [Event(c.DICE_ROLLED, {"value": 3})], settings=settings)
    before = {r["campaign_id"]: r for r in await pool.fetch(ROWS)}
    old = before[live]["slot"]
    rows_before = await pool.fetch(WORK_ROWS)
    assert [(r["campaign_id"], r["slot"]) for r in rows_before if r["campaign_id"] == live] == [
        (live, old)
    ]
    assert old in {
        await slot_at(pool, now),
        await slot_at(pool, now + timedelta(seconds=10)),
    }
    # The drained campaign's row goes (a dead version the rotation frees); the live one stays.
    await pool.execute(
        "UPDATE outbox.projection_apply_campaigns SET due_at = now() + interval '1 hour' "
        "WHERE campaign_id = $1",
        live,
    )
    await Worker(app, pool).drain()
    assert [r["campaign_id"] for r in await pool.fetch(ROWS)] == [live]
    # Two periods on, the slot the rows went to is the oldest.
    later = now + timedelta(seconds=20)
    while (await slot_at(pool, later) + 1) % 3 != old:
        later += timedelta(seconds=10)
    done = await rotate(pool, now=later)
    assert (done.slot, done.outcome, done.moved) == (old, "rotated", 2)  # a campaign row, a row
    assert await slot_bytes(pool, old) == 0
    # The live work row moved with every column it had but its slot.
    [row] = await pool.fetch(WORK_ROWS)
    [was] = [r for r in rows_before if r["campaign_id"] == live]
    assert row["slot"] == await slot_at(pool, later)
    assert dict(row) == {**dict(was), "slot": row["slot"]}
    after = await pool.fetch(ROWS)
    assert len(after) == 1
    moved = after[0]
    assert moved["slot"] == await slot_at(pool, later)
    assert (moved["campaign_id"], moved["head_seq"], moved["blocked"]) == (
        live, before[live]["head_seq"], before[live]["blocked"],
    )  # fmt: skip
    again = await rotate(pool, now=later)
    assert (again.outcome, again.moved) == ("empty", 0)
    # The moved row is claimed like any other once due: nothing lost, nothing twice.
    await pool.execute("UPDATE outbox.projection_apply_campaigns SET due_at = now()")
    await Worker(app, pool).drain()
    rows = await pool.fetch("SELECT campaign_id, total FROM demo_dice_totals")
    totals = {r["campaign_id"]: r["total"] for r in rows}
    assert totals == {live: 2, drained: 3}
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0


async def test_a_busy_slot_is_left_for_the_next_call_without_waiting_past_the_timeout(
    pool: db.Pool, settings: Settings, dsn: str
) -> None:
    now = await database_now(pool)
    await append(pool, "busy-1", [Event("noted", {})], settings=settings)
    old = await pool.fetchval(
        "SELECT slot FROM outbox.projection_apply_campaigns WHERE campaign_id = 'busy-1'"
    )
    later = now + timedelta(seconds=20)
    while (await slot_at(pool, later) + 1) % 3 != old:
        later += timedelta(seconds=10)
    reader = await db.connect(dsn)
    try:
        await reader.execute("BEGIN")
        await reader.fetchval("SELECT count(*) FROM outbox.projection_apply_campaigns")
        done = await rotate(pool, now=later, lock_timeout=0.01)
        assert (done.outcome, done.moved) == ("busy", 0)
        assert await reader.fetchval("SELECT count(*) FROM outbox.projection_apply_campaigns") == 1
        await reader.execute("COMMIT")
    finally:
        await reader.close()
    done = await rotate(pool, now=later)
    assert (done.outcome, done.moved) == ("rotated", 2)


async def test_a_backlog_over_the_limit_is_left_to_vacuum(
    pool: db.Pool, settings: Settings
) -> None:
    now = await database_now(pool)
    for n in range(3):
        await append(pool, f"deep-{n}", [Event("noted", {})], settings=settings)
    slots = {r["slot"] for r in await pool.fetch(ROWS)}
    later = now + timedelta(seconds=20)
    old = min(slots)
    while (await slot_at(pool, later) + 1) % 3 != old:
        later += timedelta(seconds=10)
    live = sum(1 for r in await pool.fetch(ROWS) if r["slot"] == old)
    done = await rotate(pool, now=later, limit=live - 1)  # a campaign row and a row each
    assert (done.outcome, done.moved) == ("backlog", 2 * live)
    assert len(await pool.fetch(ROWS)) == 3
    assert await slot_bytes(pool, old) > 0


async def test_a_refresh_waits_for_an_append_holding_the_head_and_makes_no_second_row(
    pool: db.Pool, settings: Settings, dsn: str
) -> None:
    """A campaign with no campaign row gets one only under its append head: a refresh that
    would create one waits for the append that holds the head, then finds the append's row."""
    await append(pool, "one-row", [Event("noted", {})], settings=settings)
    await pool.execute("DELETE FROM outbox.projection_apply_campaigns")
    appender = await db.connect(dsn)
    try:
        await appender.execute("BEGIN")
        await append(appender, "one-row", [Event("noted", {})], settings=settings)
        done = anyio.Event()
        async with pool.acquire() as conn:
            session = await session_id(conn, on_citus=False)

            async def refresh() -> None:
                async with conn.transaction():
                    await refresh_campaigns(conn, ["one-row"], park=True, removable=())
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(refresh)
                await wait_until_blocked(pool, session, on_citus=False)
                assert not done.is_set()
                await appender.execute("COMMIT")
    finally:
        await appender.close()
    rows = await pool.fetch(ROWS)
    assert [(r["campaign_id"], r["head_seq"]) for r in rows] == [("one-row", 1)]


async def test_a_row_whose_event_is_gone_moves_like_any_other(pool: db.Pool) -> None:
    """No foreign key ties a work row to the journal (S26): a row written around the append
    for an event that is not there (S8 fails it when claimed) does not pin its slot."""
    now = await database_now(pool)
    await pool.execute(
        "INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type) "
        "VALUES (outbox.outbox_bucket('gone'), 'gone', 1, 'step')"
    )
    old = await pool.fetchval("SELECT slot FROM outbox.projection_apply_outbox")
    later = now + timedelta(seconds=20)
    while (await slot_at(pool, later) + 1) % 3 != old:
        later += timedelta(seconds=10)
    done = await rotate(pool, now=later)
    assert (done.outcome, done.moved) == ("rotated", 1)
    assert await slot_bytes(pool, old) == 0
    moved = await pool.fetch("SELECT campaign_id, seq, slot FROM outbox.projection_apply_outbox")
    assert [tuple(r) for r in moved] == [("gone", 1, await slot_at(pool, later))]
