"""The consumer dedup guard against a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import anyio
import pytest
from prometheus_client import REGISTRY

import outbox
from outbox import dedup
from outbox.db import Connection, Pool
from outbox.obs.metrics import Metrics
from outbox.ops.cleanup import cleanup

T = datetime(2026, 11, 18, 9, 30, tzinfo=UTC)  # a Wednesday


def claimed_total(scope: str, outcome: str) -> float:
    return (
        REGISTRY.get_sample_value("outbox_dedup_claims_total", {"scope": scope, "outcome": outcome})
        or 0.0
    )


async def claims(pool: Pool) -> list[tuple[str, str, date]]:
    rows = await pool.fetch(
        "SELECT scope, event_id, bucket FROM outbox.consumer_claims ORDER BY 1, 2"
    )
    return [(r["scope"], r["event_id"], r["bucket"]) for r in rows]


def test_week_bucket_is_the_utc_monday_of_the_events_own_week() -> None:
    sunday_late = datetime(2026, 11, 22, 23, 30, tzinfo=UTC)
    monday_early = datetime(2026, 11, 23, 0, 30, tzinfo=UTC)
    assert dedup.week_bucket(sunday_late) == date(2026, 11, 16)
    assert dedup.week_bucket(monday_early) == date(2026, 11, 23)
    # The same instants written in other zones land in the same weeks: Monday 01:30 in Paris is
    # still Sunday in UTC, Sunday 19:30 in New York is already Monday.
    paris, new_york = ZoneInfo("Europe/Paris"), ZoneInfo("America/New_York")
    assert dedup.week_bucket(sunday_late.astimezone(paris)) == date(2026, 11, 16)
    assert sunday_late.astimezone(paris).weekday() == 0
    assert dedup.week_bucket(monday_early.astimezone(new_york)) == date(2026, 11, 23)
    assert monday_early.astimezone(new_york).weekday() == 6
    assert dedup.week_bucket(datetime(2026, 11, 23, 5, 0, tzinfo=timezone(timedelta(hours=6)))) == (
        date(2026, 11, 16)
    )


async def test_bucket_comes_from_the_event_time_not_the_session_or_clock(pool: Pool) -> None:
    async with pool.acquire() as conn:
        await conn.execute("SET TimeZone = 'Pacific/Kiritimati'")  # UTC+14
        assert await dedup.claim_now(conn, "s", "late", datetime(2026, 11, 22, 23, 30, tzinfo=UTC))
        assert await dedup.claim_now(conn, "s", "early", datetime(2026, 11, 23, 0, 30, tzinfo=UTC))
        await conn.execute("RESET TimeZone")
    assert await claims(pool) == [
        ("s", "early", date(2026, 11, 23)),
        ("s", "late", date(2026, 11, 16)),
    ]
    # One event id in two different weeks is two events.
    assert await dedup.claim_now(pool, "s", "late", datetime(2026, 11, 23, 0, 30, tzinfo=UTC))


class BusinessFailure(Exception):
    pass


async def failing_work(conn: Connection, claim: Callable[[], Awaitable[bool]]) -> None:
    """A business transaction that claims, writes, then fails."""
    async with conn.transaction():
        assert await claim()
        await conn.execute("CREATE TEMP TABLE work (n int)")
        raise BusinessFailure


async def test_in_transaction_claim_rolls_back_with_the_work(pool: Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(BusinessFailure):
            await failing_work(conn, lambda: dedup.claim_in_transaction(conn, "billing", "m-1", T))
        assert await claims(pool) == []
        async with conn.transaction():
            assert await dedup.claim_in_transaction(conn, "billing", "m-1", T)
        async with conn.transaction():
            assert not await dedup.claim_in_transaction(conn, "billing", "m-1", T)
    assert len(await claims(pool)) == 1


async def test_in_transaction_claim_refuses_to_run_outside_one(pool: Pool) -> None:
    with pytest.raises(outbox.TransactionRequired, match="caller's transaction"):
        await dedup.claim_in_transaction(pool, "billing", "m-1", T)  # type: ignore[arg-type]
    async with pool.acquire() as conn:
        with pytest.raises(outbox.TransactionRequired):
            await dedup.claim_in_transaction(conn, "billing", "m-1", T)
    assert await claims(pool) == []


async def test_own_transaction_claim_survives_a_failed_business_transaction(pool: Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(BusinessFailure):
            await failing_work(conn, lambda: dedup.claim_now(pool, "push", "m-2", T, topic="t"))
    # At-most-once on failure: the redelivery is skipped ...
    assert not await dedup.claim_now(pool, "push", "m-2", T)
    # ... until the claim is released.
    assert await dedup.release(pool, "push", "m-2", T)
    assert not await dedup.release(pool, "push", "m-2", T)
    assert await dedup.claim_now(pool, "push", "m-2", T)


async def test_own_transaction_claim_refuses_a_connection_inside_a_transaction(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(outbox.TransactionRequired, match="commits on its own"):
            await dedup.claim_now(conn, "push", "m-3", T)
    assert await claims(pool) == []


async def test_forensic_source_fields_are_stored(pool: Pool) -> None:
    await dedup.claim_now(pool, "s", "m", T, topic="orders", partition=7, offset=123_456_789_012)
    row = await pool.fetchrow(
        "SELECT event_time, source_topic, source_partition, source_offset FROM "
        "outbox.consumer_claims"
    )
    assert row is not None
    assert tuple(row) == (T, "orders", 7, 123_456_789_012)


@pytest.mark.parametrize(
    ("scope", "event_id", "event_time", "field"),
    [
        ("", "m", T, "scope"),
        ("  ", "m", T, "scope"),
        ("s", "", T, "event_id"),
        ("s", "m", None, "event_time"),
        ("s", "m", datetime(2026, 11, 18, 9, 30), "event_time"),
        ("s", "m", date(2026, 11, 18), "event_time"),
        ("s", 42, T, "event_id"),
    ],
)
async def test_bad_arguments_are_clear_errors_before_any_write(
    pool: Pool, scope: object, event_id: object, event_time: object, field: str
) -> None:
    with pytest.raises(outbox.ValidationError) as caught:
        await dedup.claim_now(pool, scope, event_id, event_time)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert await claims(pool) == []


async def test_default_scope_comes_from_the_environment(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOX_DEDUP_SCOPE", raising=False)
    with pytest.raises(outbox.ConfigError, match="OUTBOX_DEDUP_SCOPE"):
        await dedup.claim_now(pool, None, "m", T)
    monkeypatch.setenv("OUTBOX_DEDUP_SCOPE", "ledger-consumer")
    assert await dedup.claim_now(pool, None, "m", T)
    assert await claims(pool) == [("ledger-consumer", "m", date(2026, 11, 16))]
    assert await dedup.release(pool, None, "m", T)


@pytest.mark.parametrize("variant", ["in_transaction", "now"])
async def test_concurrent_claims_of_one_key_have_one_winner(pool: Pool, variant: str) -> None:
    scope = f"race-{variant}"
    before = claimed_total(scope, "claimed"), claimed_total(scope, "duplicate")
    results: list[bool] = []

    async def contend() -> None:
        if variant == "now":
            results.append(await dedup.claim_now(pool, scope, "m-race", T))
            return
        async with pool.acquire() as conn, conn.transaction():
            results.append(await dedup.claim_in_transaction(conn, scope, "m-race", T))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(contend)
    assert sorted(results) == [False] * 19 + [True]
    assert len(await claims(pool)) == 1
    assert claimed_total(scope, "claimed") - before[0] == 1
    assert claimed_total(scope, "duplicate") - before[1] == 19


async def test_the_worker_metrics_endpoint_serves_the_dedup_counter(pool: Pool) -> None:
    await dedup.claim_now(pool, "served", "m", T)
    metrics = Metrics()
    value = metrics.registry.get_sample_value(
        "outbox_dedup_claims_total", {"scope": "served", "outcome": "claimed"}
    )
    assert value is not None
    assert value >= 1


async def test_retention_counts_from_the_end_of_the_week_in_utc(pool: Pool) -> None:
    """A claim is kept `claims_retention_days` past the end of its week, whatever the session's
    time zone: the old prune compared the bucket's start and dropped an hour-old claim."""
    now = await pool.fetchval("SELECT clock_timestamp()")
    fresh = now - timedelta(hours=1)
    ended = dedup.week_bucket(now) - timedelta(days=7)  # last week's Monday
    ended_at = datetime.combine(ended, datetime.min.time(), UTC) + timedelta(days=1)
    old_at = now - timedelta(days=40)
    for event_id, at in (("fresh", fresh), ("last-week", ended_at), ("old", old_at)):
        assert await dedup.claim_now(pool, "keep", event_id, at)
    async with pool.acquire() as conn:
        await conn.execute("SET TimeZone = 'Pacific/Kiritimati'")
        removed = (await cleanup(conn, claims_retention_days=1)).removed
        await conn.execute("RESET TimeZone")
    # Last week ended at most 7 days ago: kept by one day of retention only if it ended within
    # the day; the 40-day-old claim is always gone, the hour-old one always kept.
    left = {event_id for _, event_id, _ in await claims(pool)}
    assert "fresh" in left
    assert "old" not in left
    week_end = datetime.combine(ended + timedelta(days=7), datetime.min.time(), UTC)
    assert ("last-week" in left) == (now - week_end < timedelta(days=1))
    assert removed.consumer_claims == 3 - len(left)
    removed = (await cleanup(pool, claims_retention_days=60)).removed
    assert removed.consumer_claims == 0
