"""Append heads held by lock alone (S28): a campaign's first append makes its head's key row,
every later one locks it and never updates it; the head is the journal's last seq, read after
the lock, so an append that waited for another continues after it; under REPEATABLE READ an
append committed since the snapshot makes this one a serialization failure, as before; a
journal row written without the head's lock fails the append, and the journal keeps it."""

from __future__ import annotations

import asyncpg
import pytest

from helpers import blocked_then_released, journal_seqs
from outbox import db
from outbox.testing.localcitus import CitusCluster

pytestmark = pytest.mark.asyncio

APPEND = "SELECT first_seq, last_seq FROM outbox.outbox_append($1, $2::jsonb, $3::bigint)"
KEY = (
    "SELECT ctid::text AS ctid, xmin::text AS xmin, last_seq FROM outbox.campaign_head_keys "
    "WHERE campaign_id = $1"
)
HEAD = "SELECT last_seq FROM outbox.campaign_heads WHERE campaign_id = $1"


async def append(
    executor: db.Executor, campaign_id: str, n: int, expected: int | None = None
) -> tuple[int, int]:
    """`n` events appended to `campaign_id` by the append function: (first_seq, last_seq)."""
    events = [{"type": "t", "payload": i} for i in range(n)]
    row = await executor.fetchrow(APPEND, campaign_id, events, expected)
    assert row is not None
    return (row["first_seq"], row["last_seq"])


async def key_row(pool: db.Pool, campaign_id: str) -> tuple[str, str, int]:
    row = await pool.fetchrow(KEY, campaign_id)
    assert row is not None
    return (row["ctid"], row["xmin"], row["last_seq"])


async def test_the_key_row_is_made_once_and_never_updated(pool: db.Pool) -> None:
    assert await append(pool, "c", 2) == (1, 2)
    key = await key_row(pool, "c")
    assert await append(pool, "c", 1) == (3, 3)
    assert await append(pool, "c", 5, 3) == (4, 8)
    assert await key_row(pool, "c") == key  # same version: locked, not updated
    assert key[2] == 2  # the floor: the head when the row was made
    assert await pool.fetchval(HEAD, "c") == 8
    assert await journal_seqs(pool, "c") == list(range(1, 9))
    # expected_seq still holds against the journal's head.
    with pytest.raises(asyncpg.PostgresError, match="expected seq 7, head is 8") as refused:
        await append(pool, "c", 1, 7)
    assert refused.value.sqlstate == "OB002"
    with pytest.raises(asyncpg.PostgresError, match="expected seq 0, head is 8"):
        await append(pool, "c", 1, 0)
    assert await journal_seqs(pool, "c") == list(range(1, 9))


async def test_an_append_that_waited_continues_after_the_one_it_waited_for(
    pool: db.Pool, dsn: str, citus: CitusCluster | None
) -> None:
    await append(pool, "w", 1)
    holder = await db.connect(dsn)
    try:
        await holder.execute("BEGIN")
        assert await append(holder, "w", 3) == (2, 4)
        got: list[tuple[int, int]] = []

        async def append_second(second: db.Connection) -> None:
            got.append(await append(second, "w", 2))

        async def commit() -> None:
            assert not got
            await holder.execute("COMMIT")

        await blocked_then_released(pool, append_second, commit, on_citus=citus is not None)
    finally:
        await holder.close()
    assert got == [(5, 6)]
    assert await journal_seqs(pool, "w") == list(range(1, 7))


async def test_a_first_append_that_waited_for_another_first_one_goes_after_it(
    pool: db.Pool, dsn: str, citus: CitusCluster | None
) -> None:
    holder = await db.connect(dsn)
    try:
        await holder.execute("BEGIN")
        assert await append(holder, "new", 2) == (1, 2)
        got: list[tuple[int, int]] = []

        async def append_second(second: db.Connection) -> None:
            got.append(await append(second, "new", 1))

        async def commit() -> None:
            await holder.execute("COMMIT")

        await blocked_then_released(pool, append_second, commit, on_citus=citus is not None)
    finally:
        await holder.close()
    assert got == [(3, 3)]
    assert await journal_seqs(pool, "new") == [1, 2, 3]


async def test_repeatable_read_sees_a_later_append_as_a_serialization_failure(
    pool: db.Pool,
) -> None:
    await append(pool, "r", 1)
    async with pool.acquire() as conn:
        tx = conn.transaction(isolation="repeatable_read")
        await tx.start()
        try:
            assert await conn.fetchval(HEAD, "r") == 1  # the snapshot is taken
            await append(pool, "r", 1)  # committed after it
            with pytest.raises(asyncpg.SerializationError):
                await append(conn, "r", 1)
        finally:
            await tx.rollback()
    assert await journal_seqs(pool, "r") == [1, 2]


async def test_a_journal_row_written_without_the_heads_lock_fails_the_append(
    pool: db.Pool, dsn: str, citus: CitusCluster | None
) -> None:
    await append(pool, "t", 1)
    tool = await db.connect(dsn)
    try:
        await tool.execute("BEGIN")
        await tool.execute(
            "INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload) "
            "VALUES (outbox.outbox_bucket('t'), 't', 2, 'by-hand', '1')"
        )
        failed: list[BaseException] = []

        async def append_second(second: db.Connection) -> None:
            try:
                await append(second, "t", 1)
            except asyncpg.UniqueViolationError as e:
                failed.append(e)

        async def commit() -> None:
            await tool.execute("COMMIT")

        await blocked_then_released(pool, append_second, commit, on_citus=citus is not None)
    finally:
        await tool.close()
    assert len(failed) == 1
    assert "seq 2 is in the journal already" in str(failed[0])
    rows = await pool.fetch(
        "SELECT seq, event_type FROM outbox.event_journal WHERE campaign_id = 't' ORDER BY seq"
    )
    assert [tuple(r) for r in rows] == [(1, "t"), (2, "by-hand")]
    # The next append goes after the row the tool wrote.
    assert await append(pool, "t", 1) == (3, 3)
