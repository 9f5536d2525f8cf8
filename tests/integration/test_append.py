"""The append path against a real PostgreSQL: S1-S4."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

import outbox
from helpers import campaigns_in_one_bucket, counts, journal_seqs, queue_count
from outbox import Event, Settings, append, db
from outbox.buckets import DEFAULT_COUNT, bucket_of
from outbox.queue.settle import work_channel


def ev(n: int = 0, type_: str = "note.added") -> Event:
    return Event(type_, {"n": n}, {"source": "test"})


async def test_append_writes_journal_head_and_work_rows(pool: db.Pool, settings: Settings) -> None:
    result = await append(pool, "c-1", [ev(1), ev(2), ev(3)], settings=settings)
    assert result == outbox.AppendResult("c-1", 1, 3, duplicate=False)
    result = await append(pool, "c-1", [ev(4)], settings=settings)
    assert (result.first_seq, result.last_seq) == (4, 4)
    rows = await pool.fetch(
        "SELECT j.seq, j.event_type, j.payload, j.metadata, o.status, o.attempt_count "
        "FROM outbox.event_journal j JOIN outbox.projection_apply_outbox o USING (bucket, "
        "campaign_id, seq) "
        "WHERE campaign_id = 'c-1' ORDER BY seq"
    )
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["payload"] == {"n": 1}
    assert rows[0]["metadata"] == {"source": "test"}
    assert {r["status"] for r in rows} == {"pending"}
    assert {r["attempt_count"] for r in rows} == {0}
    assert (
        await pool.fetchval("SELECT last_seq FROM outbox.campaign_heads WHERE campaign_id='c-1'")
        == 4
    )


async def test_enqueue_off_writes_the_journal_only(pool: db.Pool, dsn: str) -> None:
    off = Settings(dsn=dsn, enabled=False)
    result = await append(pool, "c-off", [ev(1), ev(2)], settings=off)
    assert result.seqs == range(1, 3)
    c = await counts(pool)
    assert c["event_journal"] == 2
    assert c["projection_apply_outbox"] == 0


async def test_seqs_gap_free_with_20_concurrent_appenders_on_one_campaign(
    pool: db.Pool, settings: Settings
) -> None:
    results: list[outbox.AppendResult] = []

    async def appender(i: int) -> None:
        for j in range(5):
            results.append(await append(pool, "hot", [ev(i), ev(j)], settings=settings))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(appender, i)

    assert await journal_seqs(pool, "hot") == list(range(1, 201))
    allocated = sorted(s for r in results for s in r.seqs)
    assert allocated == list(range(1, 201))
    assert await queue_count(pool) == 200


async def test_seqs_gap_free_on_20_campaigns_at_once(pool: db.Pool, settings: Settings) -> None:
    async def appender(campaign: str) -> None:
        for j in range(10):
            await append(pool, campaign, [ev(j)], settings=settings)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            for _ in range(2):  # two writers per campaign
                tg.start_soon(appender, f"c-{i}")

    for i in range(20):
        assert await journal_seqs(pool, f"c-{i}") == list(range(1, 21))


async def test_expected_seq_match_appends(pool: db.Pool, settings: Settings) -> None:
    first = await append(pool, "c", [ev()], expected_seq=0, settings=settings)
    second = await append(pool, "c", [ev(), ev()], expected_seq=1, settings=settings)
    assert (first.last_seq, second.first_seq, second.last_seq) == (1, 2, 3)


@pytest.mark.parametrize("key", [None, "k-1"])
async def test_expected_seq_conflict_raises_and_writes_nothing(
    pool: db.Pool, settings: Settings, key: str | None
) -> None:
    await append(pool, "c", [ev(), ev()], settings=settings)
    before = await counts(pool)
    with pytest.raises(outbox.ConcurrencyError) as info:
        await append(pool, "c", [ev()], expected_seq=1, idempotency_key=key, settings=settings)
    assert (info.value.expected_seq, info.value.actual_seq) == (1, 2)
    assert await counts(pool) == before
    # A new campaign has head 0: any other expectation conflicts, and nothing is created.
    with pytest.raises(outbox.ConcurrencyError):
        await append(pool, "new", [ev()], expected_seq=3, idempotency_key=key, settings=settings)
    assert await counts(pool) == before


async def test_idempotency_key_retry_returns_first_result_and_writes_nothing(
    pool: db.Pool, settings: Settings
) -> None:
    first = await append(pool, "c", [ev(1), ev(2)], idempotency_key="req-1", settings=settings)
    before = await counts(pool)
    again = await append(pool, "c", [ev(1), ev(2)], idempotency_key="req-1", settings=settings)
    assert again == outbox.AppendResult("c", first.first_seq, first.last_seq, duplicate=True)
    assert await counts(pool) == before
    # The key is scoped to its campaign, and another key appends.
    other = await append(pool, "c", [ev(3)], idempotency_key="req-2", settings=settings)
    assert (other.first_seq, other.duplicate) == (3, False)


async def test_raise_on_duplicate_carries_the_first_result(
    pool: db.Pool, settings: Settings
) -> None:
    first = await append(pool, "c", [ev()], idempotency_key="req", settings=settings)
    with pytest.raises(outbox.DuplicateAppendError) as info:
        await append(
            pool, "c", [ev()], idempotency_key="req", raise_on_duplicate=True, settings=settings
        )
    assert info.value.result == outbox.AppendResult("c", first.first_seq, first.last_seq, True)


async def test_20_concurrent_appends_with_one_key_append_once(
    pool: db.Pool, settings: Settings
) -> None:
    results: list[outbox.AppendResult] = []

    async def attempt() -> None:
        results.append(
            await append(pool, "c", [ev(), ev()], idempotency_key="same", settings=settings)
        )

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(attempt)

    assert len(results) == 20
    assert sum(not r.duplicate for r in results) == 1
    assert {(r.first_seq, r.last_seq) for r in results} == {(1, 2)}
    assert await journal_seqs(pool, "c") == [1, 2]


async def test_expired_key_appends_again(pool: db.Pool, settings: Settings) -> None:
    await append(pool, "c", [ev()], idempotency_key="req", settings=settings)
    # The TTL running out, written as the database would see it: expires_at in the past.
    await pool.execute(
        "UPDATE outbox.append_idempotency_keys "
        "SET expires_at = statement_timestamp() - interval '1 second'"
    )
    again = await append(pool, "c", [ev()], idempotency_key="req", settings=settings)
    assert (again.first_seq, again.duplicate) == (2, False)
    row = await pool.fetchrow(
        "SELECT first_seq, last_seq, expires_at > now() AS live FROM outbox.append_idempotency_keys"
    )
    assert row is not None
    assert (row["first_seq"], row["last_seq"], row["live"]) == (2, 2, True)


async def test_key_ttl_comes_from_settings(pool: db.Pool, dsn: str) -> None:
    short = Settings(dsn=dsn, append_key_ttl=60)
    await append(pool, "c", [ev()], idempotency_key="req", settings=short)
    ttl = await pool.fetchval(
        "SELECT extract(epoch FROM expires_at - created_at) FROM outbox.append_idempotency_keys"
    )
    assert 59 <= float(ttl) <= 61


async def test_failed_append_leaves_no_key(pool: db.Pool, settings: Settings) -> None:
    await append(pool, "c", [ev()], settings=settings)
    with pytest.raises(outbox.ConcurrencyError):
        await append(pool, "c", [ev()], expected_seq=5, idempotency_key="req", settings=settings)
    assert await pool.fetchval("SELECT count(*) FROM outbox.append_idempotency_keys") == 0
    retried = await append(
        pool, "c", [ev()], expected_seq=1, idempotency_key="req", settings=settings
    )
    assert (retried.first_seq, retried.duplicate) == (2, False)


async def test_append_inside_callers_transaction_rolls_back_with_it(
    pool: db.Pool, settings: Settings
) -> None:
    class Boom(Exception):
        pass

    async with pool.acquire() as conn:
        with pytest.raises(Boom):  # noqa: PT012 - the whole unit of work must raise
            async with conn.transaction():
                await conn.execute("CREATE TEMP TABLE mine (x int)")
                await append(conn, "c", [ev()], settings=settings)
                await append(conn, "c", [ev()], idempotency_key="k", settings=settings)
                raise Boom
    assert set((await counts(pool)).values()) == {0}


async def test_append_joins_callers_transaction_and_commits_with_it(
    pool: db.Pool, settings: Settings
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await append(conn, "c", [ev()], settings=settings)
        # The caller's own write in the same unit.
        await conn.execute("CREATE TABLE side_effect AS SELECT 1 AS x")
        # Not visible to anyone else before the caller commits.
        assert await pool.fetchval("SELECT count(*) FROM outbox.event_journal") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.event_journal") == 1


async def test_conflict_inside_callers_transaction_keeps_the_transaction_usable(
    pool: db.Pool, settings: Settings
) -> None:
    await append(pool, "c", [ev()], settings=settings)
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(outbox.ConcurrencyError):
            await append(conn, "c", [ev()], expected_seq=0, idempotency_key="k", settings=settings)
        # The savepoint took the key back; the caller's transaction goes on.
        assert await conn.fetchval("SELECT count(*) FROM outbox.append_idempotency_keys") == 0
        await append(conn, "c", [ev()], expected_seq=1, settings=settings)
    assert await journal_seqs(pool, "c") == [1, 2]


@asynccontextmanager
async def work_notifications(pool: db.Pool, dsn: str) -> AsyncIterator[list[object]]:
    """The payloads of the work channel's notifications that what the block commits sends
    (complete when the block ends: notifications arrive in commit order, and a sentinel sent
    after the block marks the end of ours)."""
    received: list[object] = []
    sentinel = anyio.Event()

    def on_notify(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        if payload == "sentinel":
            sentinel.set()
        else:
            received.append(payload)

    listener = await db.connect(dsn)
    try:
        await listener.add_listener(work_channel(), on_notify)
        yield received
        await pool.execute("SELECT pg_notify($1, 'sentinel')", work_channel())
        with anyio.fail_after(10):
            await sentinel.wait()
    finally:
        await listener.close()


async def test_one_notify_per_bucket_and_append_transaction(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    """Each new campaign's append names its bucket; one transaction sends each bucket once."""
    names = [*campaigns_in_one_bucket(2, "same"), "other", "solo"]
    async with work_notifications(pool, dsn) as received:
        async with pool.acquire() as conn, conn.transaction():
            for name in names[:3]:
                await append(conn, name, [ev(), ev()], settings=settings)
                await append(conn, name, [ev()], settings=settings)  # known: no second one
        await append(pool, "solo", [ev()], settings=settings)
    expected = list(dict.fromkeys(str(bucket_of(n, DEFAULT_COUNT)) for n in names[:3]))
    assert received == [*expected, str(bucket_of("solo", DEFAULT_COUNT))]


async def test_enqueue_off_sends_no_notify(pool: db.Pool, dsn: str) -> None:
    async with work_notifications(pool, dsn) as received:
        await append(pool, "c", [ev()], settings=Settings(dsn=dsn, enabled=False))
    assert received == []
