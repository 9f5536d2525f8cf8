"""`outbox.append` and `outbox.sync.append`: one append path, whichever driver the caller holds.

    await outbox.append(pool_or_connection, "campaign-42", [outbox.Event("joined", {...})])
    await outbox.append(session, ...)          # SQLAlchemy AsyncSession (or AsyncConnection)
    await outbox.append(psycopg_conn, ...)     # psycopg AsyncConnection
    outbox.sync.append(connection, ...)        # psycopg, SQLAlchemy, Django: blocking

Both forms check the arguments (`validate.prepare`), pick the driver for the caller's object
(`drivers`), run the append function's call through it with the settings' schema in effect,
and turn its answer into the result or the refusal's error (`call`): the events, their work
rows and the caller's own writes commit or roll back together. Anything else is a TypeError
naming what is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox.append import call, drivers
from outbox.append.validate import Batch, prepare
from outbox.config import Settings
from outbox.errors import ValidationError
from outbox.model import AppendResult, Event
from outbox.queries import using_schema

__all__ = ["append", "append_sync"]


def _batch(
    campaign_id: str,
    events: Sequence[Event],
    expected_seq: int | None,
    idempotency_key: str | None,
    settings: Settings | None,
) -> tuple[Batch, Settings]:
    batch = prepare(campaign_id, events, expected_seq, idempotency_key)
    return batch, settings if settings is not None else Settings.from_env()


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
    `OUTBOX_APPEND_KEY_TTL`, `OUTBOX_SCHEMA`). Inline apply needs the projectors: use
    `Outbox.append`.
    """
    if apply_inline:
        raise ValidationError(
            "apply_inline", "inline apply needs the app's projectors: call app.append(...)"
        )
    driver = drivers.async_driver(executor)
    if driver is None:
        synchronous = " (a synchronous one: use outbox.sync.append)"
        raise TypeError(
            f"outbox.append takes {drivers.ASYNC_TYPES}, not {type(executor).__name__}"
            + (synchronous if drivers.sync_driver(executor) else "")
        )
    batch, settings = _batch(campaign_id, events, expected_seq, idempotency_key, settings)
    with call.failures(batch.campaign_id, driver.lost), using_schema(settings.schema):
        row = await driver.call(executor, call.arguments(batch, settings))
    return call.result(batch, row, raise_on_duplicate=raise_on_duplicate)


def append_sync(
    connection: Any,
    campaign_id: str,
    events: Sequence[Event],
    *,
    expected_seq: int | None = None,
    idempotency_key: str | None = None,
    raise_on_duplicate: bool = False,
    settings: Settings | None = None,
) -> AppendResult:
    """`append` for blocking code (`outbox.sync.append`): a psycopg Connection, an SQLAlchemy
    Connection or Session, or Django's connection; the same arguments and errors."""
    driver = drivers.sync_driver(connection)
    if driver is None:
        asynchronous = (
            " (an asynchronous one: use await outbox.append)"
            if drivers.async_driver(connection)
            else ""
        )
        raise TypeError(
            f"outbox.sync.append takes {drivers.SYNC_TYPES}, not "
            f"{type(connection).__name__}{asynchronous}"
        )
    batch, settings = _batch(campaign_id, events, expected_seq, idempotency_key, settings)
    with call.failures(batch.campaign_id, driver.lost), using_schema(settings.schema):
        row = driver.call(connection, call.arguments(batch, settings))
    return call.result(batch, row, raise_on_duplicate=raise_on_duplicate)
