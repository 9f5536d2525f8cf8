"""The append function's call: its statement in each driver's paramstyle, its arguments, and
what its answer (or a driver's error) means.

Every client appends with one call of `outbox_try_append` (`call_fn.sql`), in the caller's
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
from functools import cache
from typing import Any, Literal

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
from outbox.queries import Queries, current_schema
from outbox.retry import describe_error

__all__ = [
    "Paramstyle",
    "arguments",
    "failures",
    "named",
    "result",
    "sqlstate",
    "statement",
]


class CallQueries(Queries):
    append_events: str


# `$n` (asyncpg), `%s` (psycopg, DB-API cursors such as Django's), `:pN` (SQLAlchemy text()).
Paramstyle = Literal["numeric", "format", "named"]


@cache
def _styled(text: str, style: Paramstyle) -> str:
    if style == "format":
        return re.sub(r"\$\d+", "%s", text)
    if style == "named":
        return re.sub(r"\$(\d+)", r":p\1", text)
    return text


def statement(style: Paramstyle = "numeric") -> str:
    """The call, naming the schema in effect, in a driver's paramstyle."""
    return _styled(CallQueries.append_events, style)


# SQLSTATEs of a database without the function: not migrated, or the outbox in another schema.
_NOT_MIGRATED = {"42883", "42P01", "3F000"}  # undefined function, table, schema


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
    """The values for the `named` statement (`p1`, `p2`, ...)."""
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
                f"outbox_try_append is missing from schema {current_schema()!r}: run "
                "`maintenance migrate`, or set OUTBOX_SCHEMA to the schema the outbox is in"
            ) from exc
        raise
