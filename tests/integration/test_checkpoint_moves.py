"""Checkpoints insert-only (S27): a checkpoint's key row is made once and never updated; each
move is a new row in the queue's slots, the newest one the value (a rebuild's move back to 0
included); a lock that waited reads the move it waited for; the rotation carries each key's
newest move forward and truncates the rest."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
import pytest

from helpers import blocked_then_released
from outbox import db
from outbox.projection.guards import checkpoints_of, lock_checkpoints
from outbox.queue.rotation import rotate
from outbox.queue.settle import settle
from outbox.testing.localcitus import CitusCluster

pytestmark = pytest.mark.asyncio

KEY = "SELECT xmin::text AS xmin, applied_seq FROM outbox.projection_checkpoint_keys"
MOVES = "SELECT n, applied_seq, slot FROM outbox.projection_checkpoint_moves ORDER BY n, slot"


async def move(
    pool: db.Pool, campaign_id: str, projector: str, seq: int, now: datetime | None = None
) -> None:
    """A move as a batch makes it: the key locked (made when missing), then the settle (at
    `now`: its slot's)."""
    async with pool.acquire() as conn, conn.transaction():
        await lock_checkpoints(conn, [campaign_id], [projector], held=False)
        await settle(conn, checkpoints=[(campaign_id, projector, seq)], now=now)


async def current(pool: db.Pool, campaign_id: str) -> dict[str, int]:
    async with pool.acquire() as conn:
        return await checkpoints_of(conn, campaign_id)


async def test_moves_insert_and_the_key_row_is_never_updated(pool: db.Pool) -> None:
    await move(pool, "c", "p", 1)
    [key] = await pool.fetch(KEY)
    for seq in (2, 3, 7):
        await move(pool, "c", "p", seq)
    # A rebuild moves the checkpoint back to 0: the newest move wins, not the greatest.
    await move(pool, "c", "p", 0)
    assert [tuple(r) for r in await pool.fetch(KEY)] == [tuple(key)]
    moves = await pool.fetch(MOVES)
    assert [(r["n"], r["applied_seq"]) for r in moves] == [(1, 1), (2, 2), (3, 3), (4, 7), (5, 0)]
    assert await current(pool, "c") == {"p": 0}
    view = await pool.fetch(
        "SELECT campaign_id, projector, applied_seq FROM outbox.projection_checkpoints"
    )
    assert [tuple(r) for r in view] == [("c", "p", 0)]


async def test_a_lock_that_waited_reads_the_move_it_waited_for(
    pool: db.Pool, dsn: str, citus: CitusCluster | None
) -> None:
    await move(pool, "w", "p", 1)
    holder = await db.connect(dsn)
    try:
        await holder.execute("BEGIN")
        await lock_checkpoints(holder, ["w"], ["p"], held=True)
        await settle(holder, checkpoints=[("w", "p", 2)])
        seen: dict[tuple[str, str], int] = {}

        async def lock_second(second: db.Connection) -> None:
            async with second.transaction():
                seen.update(await lock_checkpoints(second, ["w"], ["p"], held=True))

        async def commit() -> None:
            assert not seen
            await holder.execute("COMMIT")

        await blocked_then_released(pool, lock_second, commit, on_citus=citus is not None)
    finally:
        await holder.close()
    assert seen == {("w", "p"): 2}  # not 1, what its first statement's snapshot held


async def test_checkpoints_are_locked_in_read_committed_only(pool: db.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        with pytest.raises(asyncpg.FeatureNotSupportedError, match="READ COMMITTED"):
            await lock_checkpoints(conn, ["r"], ["p"], held=True)


async def test_the_rotation_carries_each_keys_newest_move_and_truncates_the_rest(
    pool: db.Pool,
) -> None:
    now: datetime = await pool.fetchval("SELECT clock_timestamp()")
    for seq in (1, 2, 3, 4):
        await move(pool, "a", "p", seq, now)
    await move(pool, "b", "p", 1, now)
    await move(pool, "b", "p", 5, now)
    slot = await pool.fetchval("SELECT outbox.outbox_queue_slot($1)", now)
    assert {r["slot"] for r in await pool.fetch(MOVES)} == {slot}
    later = now + timedelta(seconds=20)
    while await pool.fetchval("SELECT (outbox.outbox_queue_slot($1) + 1) % 3", later) != slot:
        later += timedelta(seconds=10)
    done = await rotate(pool, now=later)
    assert (done.slot, done.outcome, done.moved) == (slot, "rotated", 2)  # a move per key
    moves = await pool.fetch(MOVES)
    newest = await pool.fetchval("SELECT outbox.outbox_queue_slot($1)", later)
    assert [(r["n"], r["applied_seq"], r["slot"]) for r in moves] == [
        (2, 5, newest),
        (4, 4, newest),
    ]
    size = await pool.fetchval(
        "SELECT pg_relation_size(format('outbox.projection_checkpoint_moves_%s', $1::int))", slot
    )
    assert size == 0
    assert await current(pool, "a") == {"p": 4}
    assert await current(pool, "b") == {"p": 5}
    # The next move numbers past the carried one.
    await move(pool, "a", "p", 6)
    assert await current(pool, "a") == {"p": 6}
