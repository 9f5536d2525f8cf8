"""The consumer dedup guard, for handlers of messages from elsewhere.

A handler of a broker's or a webhook's messages claims each message before acting on it:

    async with pool.acquire() as conn, conn.transaction():
        if not await dedup.claim_in_transaction(conn, "billing", msg.id, msg.time):
            return  # claimed before: a redelivery
        ...  # the work, in the same transaction

Two variants share one INSERT ... ON CONFLICT DO NOTHING on `consumer_claims`:

- `claim_in_transaction` joins the caller's open transaction (and refuses to run outside one):
  the claim commits or rolls back with the work, so a failure redelivers the message
  (at-least-once; the broker needs a retry limit and a dead-letter destination).
- `claim_now` commits on its own before the work runs: a failure afterwards does not undo it,
  so the message is not processed again (at-most-once on failure), unless `release` undoes it.

The key is `(scope, event_id, bucket)`, the bucket being the Monday 00:00 UTC that starts the
week of the event's own timestamp (never the consumer's clock). Claims are pruned by
`maintenance cleanup --claims-retention-days` counted from the end of their week, so a
duplicate delivered after that window is not caught. Outcomes are counted in
`outbox_dedup_claims_total{scope,outcome}` (`claimed`, `duplicate`) on the default
prometheus registry, which the worker's `/metrics` serves too.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from outbox import db
from outbox.append.validate import check_identifier
from outbox.config import FIELDS
from outbox.errors import ConfigError, TransactionRequired, ValidationError
from outbox.obs.metrics import DEDUP_CLAIMS
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = ["claim_in_transaction", "claim_now", "prune_claims", "release", "week_bucket"]

MAX_LENGTH = 256
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1


class DedupQueries(Queries):
    claim_event: str
    release_event: str
    prune_consumer_claims: str


Q = DedupQueries


def week_bucket(event_time: datetime) -> date:
    """The Monday (UTC) of the week holding `event_time`: Sunday 23:30 UTC belongs to the week
    that began six days before, Monday 00:30 UTC to the week starting that Monday."""
    utc = _check_time(event_time).astimezone(UTC)
    return utc.date() - timedelta(days=utc.weekday())


async def claim_in_transaction(
    conn: Connection,
    scope: str | None,
    event_id: str,
    event_time: datetime,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> bool:
    """Claim `event_id` for `scope` inside the caller's open transaction on `conn`; True when
    this call won, False when it was claimed before (skip the message). The claim rolls back
    with the transaction (at-least-once). `scope=None` takes OUTBOX_DEDUP_SCOPE. A concurrent
    claim of the same event waits for this transaction to end. Raises TransactionRequired when
    `conn` is a pool or holds no open transaction."""
    args = _arguments(scope, event_id, event_time, topic, partition, offset)
    if not db.in_transaction(conn):
        raise TransactionRequired(
            "dedup.claim_in_transaction joins the caller's transaction: call it on a "
            "connection inside `async with conn.transaction():` (or use dedup.claim_now)"
        )
    return _count(args[0], await conn.fetchval(Q.claim_event, *args))


async def claim_now(
    executor: Executor,
    scope: str | None,
    event_id: str,
    event_time: datetime,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> bool:
    """Claim `event_id` for `scope` and commit at once, before the work runs; True when this
    call won. A later failure of the work does not undo the claim (at-most-once on failure):
    call `release` to have a redelivery processed. `executor` is a pool or a connection outside
    any transaction (inside one, the claim would silently share its fate: TransactionRequired).
    """
    args = _arguments(scope, event_id, event_time, topic, partition, offset)
    if db.in_transaction(executor):
        raise TransactionRequired(
            "dedup.claim_now commits on its own: call it on the pool or on a connection outside "
            "a transaction (or use dedup.claim_in_transaction to join this one)"
        )
    async with db.acquire(executor) as conn:
        return _count(args[0], await conn.fetchval(Q.claim_event, *args))


async def release(
    executor: Executor, scope: str | None, event_id: str, event_time: datetime
) -> bool:
    """Undo a claim, so a redelivery of the event is processed again; True when a claim was
    removed. On a connection inside a transaction the release joins that transaction."""
    args = _arguments(scope, event_id, event_time, None, None, None)
    async with db.acquire(executor) as conn:
        return bool(await conn.fetchval(Q.release_event, *args[:3]))


async def prune_claims(conn: Connection, *, retention_days: int, batch_size: int) -> int:
    """Delete claims whose week ended more than `retention_days` ago (UTC), `batch_size` per
    statement; how many went. A redelivery after that window is not caught."""
    return await db.prune(conn, Q.prune_consumer_claims, retention_days, batch=batch_size)


def _count(scope: str, claimed: object) -> bool:
    won = bool(claimed)
    DEDUP_CLAIMS.labels(scope, "claimed" if won else "duplicate").inc()
    return won


def _check_time(event_time: object) -> datetime:
    if event_time is None:
        raise ValidationError("event_time", "is required: the event's own timestamp")
    if not isinstance(event_time, datetime):
        raise ValidationError("event_time", f"expected a datetime, got {type(event_time).__name__}")
    if event_time.tzinfo is None or event_time.utcoffset() is None:
        raise ValidationError(
            "event_time", "must be timezone-aware (a naive datetime has no fixed instant)"
        )
    return event_time


def _number(field: str, value: object, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ValidationError(field, f"expected an integer 0..{high} or None, got {value!r}")
    return value


def _default_scope() -> str:
    spec = FIELDS["dedup_scope"]
    scope = os.environ.get(spec.env, "").strip()
    if not scope:
        raise ConfigError(
            f"no dedup scope: pass scope=... or set {spec.env} (the consumer's logical name)"
        )
    return scope


def _arguments(
    scope: str | None,
    event_id: str,
    event_time: datetime,
    topic: str | None,
    partition: int | None,
    offset: int | None,
) -> tuple[str, str, date, datetime, str | None, int | None, int | None]:
    """Every argument checked before any statement runs, in the order of the queries' $n."""
    resolved = _default_scope() if scope is None else check_identifier("scope", scope, MAX_LENGTH)
    return (
        resolved,
        check_identifier("event_id", event_id, MAX_LENGTH),
        week_bucket(event_time),
        event_time,
        None if topic is None else check_identifier("topic", topic, MAX_LENGTH),
        _number("partition", partition, _INT32),
        _number("offset", offset, _INT64),
    )
