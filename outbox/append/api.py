"""`outbox.append`: append in the caller's own transaction, from asyncpg, SQLAlchemy or psycopg.

    await outbox.append(pool_or_connection, "campaign-42", [outbox.Event("joined", {...})])
    await outbox.append(session, ...)          # SQLAlchemy AsyncSession (or AsyncConnection)
    await outbox.append(psycopg_conn, ...)     # psycopg AsyncConnection

Whatever the driver, the append is one call of the append function (`call`), made through
the caller's object so it begins or joins the caller's transaction: the events, their work rows
and the caller's own writes commit or roll back together. Anything else is a TypeError naming
what is accepted; synchronous code uses `outbox.sync.append`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox import db
from outbox.append import call, drivers, journal
from outbox.append.validate import prepare
from outbox.config import Settings
from outbox.errors import ValidationError
from outbox.model import AppendResult, Event

__all__ = ["append"]


async def append(
    executor: Any,
    campaign_id: str,
    events: Sequence[Event],
    *,
    expected_seq: int | None = None,
    idempotency_key: str | None = None,
    raise_on_duplicate: bool = False,
    settings: Settings | None = None,
    apply_inline: bool | None = None,
) -> AppendResult:
    """Append `events` to `campaign_id`'s journal and enqueue their work rows.

    `executor`: an asyncpg pool (its own transaction) or connection, an SQLAlchemy
    AsyncConnection or AsyncSession, a psycopg AsyncConnection (inside the caller's transaction
    when one is open). `expected_seq` is the head the caller saw (0 for a new campaign); a
    mismatch raises `ConcurrencyError` and writes nothing. A retried `idempotency_key` returns
    the first result with `duplicate=True` and writes nothing, or raises `DuplicateAppendError`
    when `raise_on_duplicate`; the same key with other events raises `IdempotencyKeyConflict`.
    A connection that fails mid-append raises `AppendOutcomeUnknown`: retry with the same key
    (docs/append.md). `settings` default to the environment (`OUTBOX_ENABLED`,
    `OUTBOX_APPEND_KEY_TTL`). Inline apply needs the projectors: use `Outbox.append`.
    """
    if apply_inline:
        raise ValidationError(
            "apply_inline", "inline apply needs the app's projectors: call app.append(...)"
        )
    if db.is_executor(executor):
        return await journal.append(
            executor,
            campaign_id,
            events,
            expected_seq=expected_seq,
            idempotency_key=idempotency_key,
            raise_on_duplicate=raise_on_duplicate,
            settings=settings,
        )
    kind = drivers.async_kind(executor)
    if kind is None:
        synchronous = " (a synchronous one: use outbox.sync.append)"
        raise TypeError(
            f"outbox.append takes {drivers.ASYNC_TYPES}, not {type(executor).__name__}"
            + (synchronous if drivers.sync_kind(executor) else "")
        )
    batch = prepare(campaign_id, events, expected_seq, idempotency_key)
    settings = settings if settings is not None else Settings.from_env()
    with call.failures(batch.campaign_id, drivers.lost):
        row = await drivers.run_async(kind, executor, call.arguments(batch, settings))
    return call.result(batch, row, raise_on_duplicate=raise_on_duplicate)
