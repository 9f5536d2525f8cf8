"""`outbox.sync.append`: the append for synchronous code, in the caller's own transaction.

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("UPDATE accounts ...")
        outbox.sync.append(conn, "acct-7", [outbox.Event("deposited", {"amount": 5})])

It takes a psycopg Connection, an SQLAlchemy Connection or Session, or Django's connection
(`outbox.contrib.django.append` passes the current one). The append is one call of the append
function, made through the caller's object, so it begins or joins the caller's transaction
(with autocommit on, it is a transaction of its own). Rules, results and errors are those of
`outbox.append`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox.append import call, drivers
from outbox.append.validate import prepare
from outbox.config import Settings
from outbox.model import AppendResult, Event

__all__ = ["append"]


def append(
    connection: Any,
    campaign_id: str,
    events: Sequence[Event],
    *,
    expected_seq: int | None = None,
    idempotency_key: str | None = None,
    raise_on_duplicate: bool = False,
    settings: Settings | None = None,
) -> AppendResult:
    """Append `events` to `campaign_id` on a synchronous connection (see the module
    docstring); the same arguments and errors as `outbox.append`."""
    kind = drivers.sync_kind(connection)
    if kind is None:
        asynchronous = (
            " (an asynchronous one: use await outbox.append)"
            if drivers.async_kind(connection)
            else ""
        )
        raise TypeError(
            f"outbox.sync.append takes {drivers.SYNC_TYPES}, not "
            f"{type(connection).__name__}{asynchronous}"
        )
    batch = prepare(campaign_id, events, expected_seq, idempotency_key)
    settings = settings if settings is not None else Settings.from_env()
    with call.failures(batch.campaign_id, drivers.lost):
        row = drivers.run_sync(kind, connection, call.arguments(batch, settings))
    return call.result(batch, row, raise_on_duplicate=raise_on_duplicate)
