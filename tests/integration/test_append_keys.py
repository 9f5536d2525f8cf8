"""Append idempotency keys at their edges: a key names one request, so a retry with
the same key and different events is refused, and the key travels with the events it wrote."""

from __future__ import annotations

import pytest

import outbox
from helpers import counts
from outbox import Event, Settings, append, db
from outbox.append.validate import KEY_METADATA


def deposit(amount: int, **meta: str) -> Event:
    return Event("money.deposited", {"amount": amount, "currency": "EUR"}, meta or None)


async def test_same_key_different_payload_is_refused_and_writes_nothing(
    pool: db.Pool, settings: Settings
) -> None:
    first = await append(pool, "acct-1", [deposit(30)], idempotency_key="req-7", settings=settings)
    before = await counts(pool)
    with pytest.raises(outbox.IdempotencyKeyConflict) as caught:
        await append(pool, "acct-1", [deposit(31)], idempotency_key="req-7", settings=settings)
    assert caught.value.result.seqs == first.seqs
    assert "'req-7'" in str(caught.value)
    assert "different events" in str(caught.value)
    assert await counts(pool) == before
    # A different type, an extra event or different metadata are different requests too.
    for events in (
        [Event("money.withdrawn", {"amount": 30, "currency": "EUR"})],
        [deposit(30), deposit(30)],
        [deposit(30, channel="web")],
    ):
        with pytest.raises(outbox.IdempotencyKeyConflict):
            await append(pool, "acct-1", events, idempotency_key="req-7", settings=settings)
    assert await counts(pool) == before


async def test_a_retry_may_order_object_keys_differently(pool: db.Pool, settings: Settings) -> None:
    """jsonb does not keep key order, and neither does the fingerprint."""
    first = await append(pool, "acct-2", [deposit(5)], idempotency_key="k", settings=settings)
    reordered = Event("money.deposited", {"currency": "EUR", "amount": 5})
    again = await append(pool, "acct-2", [reordered], idempotency_key="k", settings=settings)
    assert again.duplicate
    assert again.seqs == first.seqs


async def test_a_refused_retry_inside_the_callers_transaction_leaves_it_usable(
    pool: db.Pool, settings: Settings
) -> None:
    await append(pool, "acct-3", [deposit(1)], idempotency_key="k", settings=settings)
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(outbox.IdempotencyKeyConflict):
            await append(conn, "acct-3", [deposit(2)], idempotency_key="k", settings=settings)
        # The append's savepoint rolled back; the caller's own transaction goes on.
        await append(conn, "acct-3", [deposit(2)], idempotency_key="k2", settings=settings)
    assert await pool.fetchval("SELECT last_seq FROM outbox.campaign_heads") == 2


async def test_keys_written_before_fingerprints_are_still_honoured(
    pool: db.Pool, settings: Settings
) -> None:
    first = await append(pool, "acct-4", [deposit(9)], idempotency_key="old", settings=settings)
    await pool.execute("UPDATE outbox.append_idempotency_keys SET fingerprint = NULL")
    again = await append(pool, "acct-4", [deposit(10)], idempotency_key="old", settings=settings)
    assert again.duplicate
    assert again.seqs == first.seqs


async def test_the_key_is_in_every_event_metadata_projectors_see(pool: db.Pool, dsn: str) -> None:
    app = outbox.Outbox(Settings(dsn=dsn))
    seen: list[tuple[int, object, object]] = []

    @app.projector("payments", events=["money.deposited"])
    async def payments(tx: db.Connection, event: outbox.StoredEvent) -> None:
        seen.append((event.seq, event.metadata.get(KEY_METADATA), event.metadata.get("channel")))

    await app.append(
        pool,
        "acct-5",
        [deposit(1, channel="web"), deposit(2)],
        idempotency_key="req-42",
        apply_inline=True,
    )
    await app.append(pool, "acct-5", [deposit(3)], apply_inline=True)
    assert seen == [(1, "req-42", "web"), (2, "req-42", None), (3, None, None)]


async def test_metadata_may_repeat_the_key_but_not_contradict_it(
    pool: db.Pool, settings: Settings
) -> None:
    same = Event("money.deposited", {"amount": 1}, {KEY_METADATA: "k"})
    result = await append(pool, "acct-6", [same], idempotency_key="k", settings=settings)
    assert result.seqs == range(1, 2)
    other = Event("money.deposited", {"amount": 1}, {KEY_METADATA: "other"})
    with pytest.raises(outbox.ValidationError, match=r"events\[0\]\.metadata"):
        await append(pool, "acct-6", [other], idempotency_key="k2", settings=settings)
