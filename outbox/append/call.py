"""The append function's call: its statement in each driver's paramstyle, its arguments, and
what its answer (or a driver's error) means.

Every client appends with one call of `outbox_try_append` (migration 0006), in the caller's
own transaction: the function allocates gap-free seqs, journals, enqueues, keeps the
idempotency key and wakes the workers. This module is what every Python driver shares:
`arguments()` from a checked `Batch`, `result()` from the row it returns (a refusal becomes
the matching `OutboxError`, raised with nothing written and the caller's transaction intact),
and `failures()` around a driver's call (a lost connection is `AppendOutcomeUnknown`, a
missing function is `SchemaNotReady`). It never opens a connection or imports a driver: the drivers'
modules run the statement.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from outbox.append.validate import Batch
from outbox.config import Settings
from outbox.errors import (
    AppendOutcomeUnknown,
    ConcurrencyError,
    DuplicateAppendError,
    IdempotencyKeyConflict,
    SchemaNotReady,
    ValidationError,
)
from outbox.model import AppendResult
from outbox.queries import Queries
from outbox.retry import describe_error

__all__ = [
    "STATEMENT",
    "STATEMENT_NAMED",
    "STATEMENT_PYFORMAT",
    "arguments",
    "failures",
    "named",
    "result",
    "sqlstate",
]


class CallQueries(Queries):
    append_events: str


# `$n` (asyncpg), `%s` (psycopg, DB-API cursors such as Django's), `:pN` (SQLAlchemy text()).
STATEMENT = CallQueries.append_events
STATEMENT_PYFORMAT = re.sub(r"\$\d+", "%s", STATEMENT)
STATEMENT_NAMED = re.sub(r"\$(\d+)", r":p\1", STATEMENT)

# SQLSTATEs of a database without the function: not migrated (or not to 0006).
_NOT_MIGRATED = {"42883", "42P01"}  # undefined_function, undefined_table


def arguments(batch: Batch, settings: Settings) -> tuple[Any, ...]:
    """The statement's values, in `$n` order."""
    return (
        batch.campaign_id,
        batch.events,
        batch.expected_seq,
        batch.idempotency_key,
        settings.enabled,
        float(settings.append_key_ttl),
    )


def named(values: Sequence[Any]) -> dict[str, Any]:
    """The values for `STATEMENT_NAMED` (`p1`, `p2`, ...)."""
    return {f"p{i}": value for i, value in enumerate(values, start=1)}


def result(batch: Batch, row: Sequence[Any] | None, *, raise_on_duplicate: bool) -> AppendResult:
    """The append's result from the function's row: (first_seq, last_seq, duplicate, refusal,
    field, message); a refusal raises its error."""
    if row is None:  # pragma: no cover - the function always returns one row
        raise RuntimeError("outbox_try_append returned no row")
    first_seq, last_seq, duplicate, refusal, field, message = row
    cid = batch.campaign_id
    if refusal == "invalid":
        raise ValidationError(field, message)
    if refusal == "expected_seq":
        raise ConcurrencyError(cid, batch.expected_seq or 0, last_seq)
    if refusal == "key_conflict":
        first = AppendResult(cid, first_seq, last_seq, duplicate=True)
        raise IdempotencyKeyConflict(batch.idempotency_key or "", first)
    appended = AppendResult(cid, first_seq, last_seq, duplicate=bool(duplicate))
    if appended.duplicate and raise_on_duplicate:
        raise DuplicateAppendError(appended)
    return appended


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE behind a driver's error, whichever driver (asyncpg's `sqlstate`,
    psycopg's `sqlstate`, psycopg2's `pgcode`), through wrappers (`orig`, the cause)."""
    seen: BaseException | None = exc
    while seen is not None:
        for attribute in ("sqlstate", "pgcode"):
            state = getattr(seen, attribute, None)
            if isinstance(state, str) and state:
                return state
        orig = getattr(seen, "orig", None)
        seen = orig if isinstance(orig, BaseException) else seen.__cause__
    return None


@contextmanager
def failures(campaign_id: str, lost: Callable[[BaseException], bool]) -> Iterator[None]:
    """Around a driver's append call: an error after which the connection is `lost` (the
    driver's own test) becomes `AppendOutcomeUnknown` (retry with the same key), one saying the
    database lacks the function `SchemaNotReady`; any other error passes as it is."""
    try:
        yield
    except Exception as exc:
        if lost(exc):
            raise AppendOutcomeUnknown(
                f"campaign {campaign_id!r}: the connection failed during the append "
                f"({describe_error(exc)}); whether it committed is unknown: retry with the "
                "same idempotency key"
            ) from exc
        if sqlstate(exc) in _NOT_MIGRATED:
            raise SchemaNotReady(
                "the database is not migrated (outbox_append is missing): run `maintenance migrate`"
            ) from exc
        raise
