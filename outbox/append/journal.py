"""The journal: the append (allocate gap-free seqs, journal, enqueue, wake) and its reads.

`append()` takes an executor first: a pool (the append runs in its own transaction) or a
connection (inside the caller's transaction when one is open, so the append joins the caller's
write unit). Without an idempotency key the whole append is one statement, atomic on its own;
with a key it is two statements in a transaction or savepoint, so a failed append leaves no key.
The append's statement also inserts the events' work rows (one round trip; the work rows'
trigger queues their campaign and wakes the workers): it is the only statement outside
`outbox.queue` that writes them.

It owns every statement on `event_journal`, `campaign_heads` and `append_idempotency_keys`,
and decoding a journal row into the `StoredEvent` projectors see. It never runs projectors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

import orjson

from outbox import db
from outbox.append.validate import Batch, prepare
from outbox.config import Settings
from outbox.errors import (
    AppendOutcomeUnknown,
    ConcurrencyError,
    DuplicateAppendError,
    EventUnavailable,
    IdempotencyKeyConflict,
    ValidationError,
)
from outbox.model import AppendResult, Event, StoredEvent
from outbox.queries import Queries
from outbox.retry import describe_error

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "append",
    "decode_event",
    "decode_record",
    "get_campaign_head",
    "list_campaigns",
    "load_events",
    "outcome_unknown_on_connection_loss",
    "prune_append_keys",
    "rebuild_events",
]


class JournalQueries(Queries):
    append_events: str
    claim_append_key: str
    get_append_key: str
    get_campaign_head: str
    load_events: str
    list_campaigns: str
    load_rebuild_events: str
    prune_append_keys: str


Q = JournalQueries


async def append(
    executor: Executor,
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

    `expected_seq` is the head the caller saw (0 for a new campaign); a mismatch raises
    `ConcurrencyError` and writes nothing. A retried `idempotency_key` returns the first result
    with `duplicate=True` and writes nothing, or raises `DuplicateAppendError` when
    `raise_on_duplicate`. A connection that fails mid-append raises `AppendOutcomeUnknown`:
    retry with the same key (docs/append.md). `settings` default to the environment
    (`OUTBOX_ENABLED`, `OUTBOX_APPEND_KEY_TTL`). Inline apply needs the projectors: use
    `Outbox.append`.
    """
    if apply_inline:
        raise ValidationError(
            "apply_inline", "inline apply needs the app's projectors: call app.append(...)"
        )
    batch = prepare(campaign_id, events, expected_seq, idempotency_key)
    settings = settings if settings is not None else Settings.from_env()
    with outcome_unknown_on_connection_loss(batch.campaign_id):
        async with db.acquire(executor) as conn:
            if batch.idempotency_key is None:
                result = await _insert(conn, batch, settings)
            else:
                # A transaction of its own, or a savepoint inside the caller's: a failed append
                # must take its key with it.
                async with conn.transaction():
                    result = await _insert_once(conn, batch, batch.idempotency_key, settings)
    if result.duplicate and raise_on_duplicate:
        raise DuplicateAppendError(result)
    return result


@contextmanager
def outcome_unknown_on_connection_loss(campaign_id: str) -> Iterator[None]:
    """Turn a lost connection during an append into AppendOutcomeUnknown (one documented error
    for "retry with the same idempotency key"); every other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        if not db.connection_lost(exc):
            raise
        raise AppendOutcomeUnknown(
            f"campaign {campaign_id!r}: the connection failed during the append "
            f"({describe_error(exc)}); whether it committed is unknown: retry with the same "
            "idempotency key"
        ) from exc


async def _insert_once(
    conn: Connection, batch: Batch, key: str, settings: Settings
) -> AppendResult:
    claimed = await conn.fetchval(
        Q.claim_append_key, batch.campaign_id, key, settings.append_key_ttl, batch.fingerprint
    )
    if not claimed:
        row = await conn.fetchrow(Q.get_append_key, batch.campaign_id, key)
        if row is None or row["first_seq"] is None:  # pragma: no cover - key rows commit filled
            raise RuntimeError(f"idempotency key {key!r} has no recorded result")
        first = AppendResult(batch.campaign_id, row["first_seq"], row["last_seq"], duplicate=True)
        if row["fingerprint"] is not None and row["fingerprint"] != batch.fingerprint:
            raise IdempotencyKeyConflict(key, first)
        return first
    return await _insert(conn, batch, settings)


async def _insert(conn: Connection, batch: Batch, settings: Settings) -> AppendResult:
    row = await conn.fetchrow(
        Q.append_events,
        batch.campaign_id,
        batch.types,
        batch.payloads,
        batch.metadata,
        batch.expected_seq,
        settings.enabled,
        batch.idempotency_key,
    )
    if row is None:
        actual = await conn.fetchval(Q.get_campaign_head, batch.campaign_id)
        raise ConcurrencyError(batch.campaign_id, batch.expected_seq or 0, actual or 0)
    last_seq: int = row["last_seq"]
    return AppendResult(batch.campaign_id, last_seq - len(batch.types) + 1, last_seq)


def decode_event(
    campaign_id: str,
    seq: int,
    event_type: str,
    payload: str,
    metadata: str,
    recorded_at: datetime,
) -> StoredEvent:
    """A journal row (payload and metadata as jsonb text) as projectors see it.

    Valid jsonb is not always decodable here (another client or a manual fix can store
    `{"v": 1e400}`, out of range for a float): that is EventUnavailable for this event alone.
    """
    try:
        decoded_payload = orjson.loads(payload)
        decoded_metadata = orjson.loads(metadata)
    except orjson.JSONDecodeError as exc:
        raise EventUnavailable(
            f"journal event {campaign_id!r} seq {seq} cannot be decoded: {exc}"
        ) from None
    if not isinstance(decoded_metadata, dict):
        raise EventUnavailable(
            f"journal event {campaign_id!r} seq {seq}: metadata is not a JSON object"
        )
    return StoredEvent(campaign_id, seq, event_type, decoded_payload, decoded_metadata, recorded_at)


def decode_record(r: db.Record, campaign_id: str | None = None) -> StoredEvent:
    """`decode_event` of a fetched journal row (payload and metadata as text); the campaign
    comes from the row unless the query left it out."""
    return decode_event(
        r["campaign_id"] if campaign_id is None else campaign_id,
        r["seq"],
        r["event_type"],
        r["payload"],
        r["metadata"],
        r["recorded_at"],
    )


async def load_events(
    conn: Connection, campaign_id: str, first: int, last: int
) -> list[StoredEvent]:
    """A campaign's events `first..last` as projectors see them (decoded from the journal)."""
    rows = await conn.fetch(Q.load_events, campaign_id, first, last)
    return [decode_record(r, campaign_id) for r in rows]


async def rebuild_events(
    conn: Connection, campaign_id: str, types: Sequence[str], *, prefetch: int
) -> AsyncIterator[tuple[int, StoredEvent | None]]:
    """A campaign's events of `types` up to its journal head, in seq order, each with that
    head (read in the same snapshot, so a checkpoint set to it passes no event unseen); one
    (head, None) when there are none. Needs a transaction (a server-side cursor)."""
    cursor = conn.cursor(Q.load_rebuild_events, campaign_id, list(types), prefetch=prefetch)
    async for r in cursor:
        yield r["last_seq"], None if r["seq"] is None else decode_record(r, campaign_id)


async def get_campaign_head(executor: Executor, campaign_id: str) -> int:
    """The last allocated seq of a campaign (0: it has no events)."""
    async with db.acquire(executor) as conn:
        head: int | None = await conn.fetchval(Q.get_campaign_head, campaign_id)
    return head or 0


async def list_campaigns(executor: Executor, campaign_id: str | None = None) -> list[str]:
    """Campaigns with events, one or all, in id order."""
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.list_campaigns, campaign_id)
    return [r["campaign_id"] for r in rows]


async def prune_append_keys(conn: Connection, *, batch_size: int) -> int:
    """Delete expired idempotency keys, `batch_size` per statement; how many went."""
    return await db.prune(conn, Q.prune_append_keys, batch_size)
