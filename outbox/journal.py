"""The append path (S1-S4): validate, allocate gap-free seqs, journal, enqueue, notify.

`append()` takes an executor first: a pool (the append runs in its own transaction) or a
connection (inside the caller's transaction when one is open, so the append joins the caller's
write unit). Without an idempotency key the whole append is one statement, atomic on its own;
with a key it is two statements in a transaction or savepoint, so a failed append leaves no key.
Nothing here runs projectors; the worker does (and inline apply, when enabled).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson

from outbox import db
from outbox.config import Settings
from outbox.errors import (
    AppendOutcomeUnknown,
    ConcurrencyError,
    DuplicateAppendError,
    EventUnavailable,
    IdempotencyKeyConflict,
    ValidationError,
)
from outbox.queries import Queries
from outbox.retry import connection_lost, describe_error

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "KEY_METADATA",
    "WORK_CHANNEL",
    "AppendResult",
    "Event",
    "StoredEvent",
    "append",
    "check_identifier",
    "decode_event",
    "decode_record",
    "load_events",
    "outcome_unknown_on_connection_loss",
]

# The LISTEN/NOTIFY channel that wakes the workers: payload-free, sent by the work rows' trigger
# when a campaign gets queued work (sql/0003_campaign_queue.sql names it too).
WORK_CHANNEL = "outbox_work"

MAX_ID_LENGTH = 256
MAX_TYPE_LENGTH = 256
MAX_KEY_LENGTH = 256
MAX_EVENTS = 10_000
MAX_PAYLOAD_BYTES = 1 << 20
# The metadata field that carries an append's idempotency key into each of its events, so a
# projector can pass it on to an external system (docs/idempotency.md).
KEY_METADATA = "idempotency_key"


class JournalQueries(Queries, file="journal.sql"):
    append_events: str
    claim_append_key: str
    get_append_key: str
    get_campaign_head: str
    load_events: str


Q = JournalQueries


@dataclass(frozen=True, slots=True)
class Event:
    """An event to append: its type, a JSON payload, optional JSON-object metadata."""

    type: str
    payload: Any
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A journaled event as projectors see it."""

    campaign_id: str
    seq: int
    type: str
    payload: Any
    metadata: dict[str, Any]
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append landed; `duplicate` is True when an idempotency key replayed it."""

    campaign_id: str
    first_seq: int
    last_seq: int
    duplicate: bool = False

    @property
    def seqs(self) -> range:
        return range(self.first_seq, self.last_seq + 1)


@dataclass(frozen=True, slots=True)
class _Batch:
    campaign_id: str
    types: list[str]
    payloads: list[str]
    metadata: list[str]
    expected_seq: int | None
    idempotency_key: str | None
    fingerprint: bytes | None


# jsonb cannot store U+0000; orjson writes it as \u0000 (an even run of backslashes before it
# means the backslash itself was escaped, and the text is harmless).
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def check_identifier(field: str, value: object, limit: int) -> str:
    """A non-blank string of at most `limit` characters without NUL, or a ValidationError
    naming `field` (ids, types and keys, here and in the dedup guard)."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise ValidationError(field, "must not be empty")
    if len(value) > limit:
        raise ValidationError(field, f"must be at most {limit} characters, got {len(value)}")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    return value


def _check_finite(field: str, value: Any) -> None:
    # orjson writes NaN and infinities as null; refuse them instead of losing data silently.
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValidationError(field, "NaN and infinite numbers are not JSON")
    elif isinstance(value, Mapping):
        for item in value.values():
            _check_finite(field, item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_finite(field, item)


def _encode(field: str, value: Any) -> str:
    try:
        encoded = orjson.dumps(value)
    except TypeError as exc:
        raise ValidationError(field, f"not JSON-encodable: {exc}") from None
    _check_finite(field, value)
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise ValidationError(
            field, f"encodes to {len(encoded)} bytes, more than {MAX_PAYLOAD_BYTES}"
        )
    if _JSON_NUL.search(encoded):
        raise ValidationError(field, "must not contain NUL characters (\\u0000)")
    return encoded.decode()


def _prepare(
    campaign_id: object,
    events: object,
    expected_seq: object,
    idempotency_key: object,
) -> _Batch:
    """Validate everything and encode the payloads, before anything is written (S4)."""
    campaign = check_identifier("campaign_id", campaign_id, MAX_ID_LENGTH)
    if isinstance(events, Event) or not isinstance(events, Sequence) or isinstance(events, str):
        raise ValidationError("events", "expected a sequence of outbox.Event")
    if not events:
        raise ValidationError("events", "must not be empty")
    if len(events) > MAX_EVENTS:
        raise ValidationError("events", f"at most {MAX_EVENTS} per append, got {len(events)}")
    expected: int | None = None
    if expected_seq is not None:
        if isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0:
            raise ValidationError("expected_seq", f"expected an integer >= 0, got {expected_seq!r}")
        expected = expected_seq
    key: str | None = None
    if idempotency_key is not None:
        key = check_identifier("idempotency_key", idempotency_key, MAX_KEY_LENGTH)
    types: list[str] = []
    payloads: list[str] = []
    metadata: list[str] = []
    given: list[tuple[str, Any, dict[str, Any]]] = []
    for i, event in enumerate(events):
        if not isinstance(event, Event):
            raise ValidationError(
                f"events[{i}]", f"expected outbox.Event, got {type(event).__name__}"
            )
        types.append(check_identifier(f"events[{i}].type", event.type, MAX_TYPE_LENGTH))
        payloads.append(_encode(f"events[{i}].payload", event.payload))
        if event.metadata is not None and not isinstance(event.metadata, Mapping):
            raise ValidationError(f"events[{i}].metadata", "expected a mapping or None")
        meta = dict(event.metadata or {})
        if key is not None:
            if meta.setdefault(KEY_METADATA, key) != key:
                raise ValidationError(
                    f"events[{i}].metadata",
                    f"{KEY_METADATA!r} is set by the append from its idempotency_key; got a "
                    "different value",
                )
            given.append((event.type, event.payload, meta))
        metadata.append(_encode(f"events[{i}].metadata", meta))
    fingerprint = None if key is None else _fingerprint(given)
    return _Batch(campaign, types, payloads, metadata, expected, key, fingerprint)


def _fingerprint(events: list[tuple[str, Any, dict[str, Any]]]) -> bytes:
    """What a keyed append appended, independent of key order inside objects (as jsonb is): a
    retry with the same key must carry the same events."""
    return hashlib.sha256(orjson.dumps(events, option=orjson.OPT_SORT_KEYS)).digest()


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
    """Append `events` to `campaign_id`'s journal and enqueue their work rows (S1-S4).

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
    batch = _prepare(campaign_id, events, expected_seq, idempotency_key)
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
        if not connection_lost(exc):
            raise
        raise AppendOutcomeUnknown(
            f"campaign {campaign_id!r}: the connection failed during the append "
            f"({describe_error(exc)}); whether it committed is unknown: retry with the same "
            "idempotency key"
        ) from exc


async def _insert_once(
    conn: Connection, batch: _Batch, key: str, settings: Settings
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


async def _insert(conn: Connection, batch: _Batch, settings: Settings) -> AppendResult:
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


def decode_record(r: asyncpg.Record, campaign_id: str | None = None) -> StoredEvent:
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
