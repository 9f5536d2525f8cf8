"""The journal's reads: events, heads and campaigns, and decoding rows for projectors.

It owns the reads of `event_journal` and `campaign_heads`, the pruning of
`append_idempotency_keys`, and decoding journal rows into what projectors see: one row into a
`StoredEvent`, a claim's rows in bulk (`decode_bulk`). The journal is written only by the
append function (`call_fn.sql`), which every driver calls through `outbox.append.api`. It never
runs projectors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from outbox import buckets, db
from outbox.errors import EventUnavailable
from outbox.model import EventBatch, StoredEvent
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "Decoded",
    "JournalEntry",
    "batch_of",
    "count_typed",
    "decode_bulk",
    "decode_event",
    "decode_record",
    "get_campaign_head",
    "list_campaigns",
    "load_events",
    "load_ranges",
    "prune_append_keys",
    "rebuild_events",
    "recent_events",
]


class JournalQueries(Queries):
    get_campaign_head: str
    load_events: str
    load_ranges: str
    load_typed_ranges: str
    count_typed_ranges: str
    list_campaigns: str
    load_rebuild_events: str
    prune_append_keys: str
    list_recent_events: str


Q = JournalQueries


def decode_event(
    campaign_id: str,
    seq: int,
    event_type: str,
    payload: str,
    metadata: str,
    recorded_at: datetime,
    version: int = 1,
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
    return StoredEvent(
        campaign_id, seq, event_type, decoded_payload, decoded_metadata, recorded_at, version
    )


@dataclass(slots=True)
class Decoded:
    """Journal rows' payloads and metadata, decoded (`decode_bulk`): the i-th items are the
    i-th row's, None where `unavailable` has the row's index."""

    payloads: list[Any]
    metadata: list[dict[str, Any] | None]
    unavailable: dict[int, EventUnavailable] = field(default_factory=dict)


def decode_bulk(rows: Sequence[db.Record]) -> Decoded:
    """The payloads and metadata of journal rows (columns as `decode_record` reads them) in two
    decoder calls for all the rows: each column joined into one JSON array (a jsonb text is
    always one whole JSON value). When a row cannot be decoded (see `decode_event`), every row
    is decoded alone and that row's error kept in `unavailable`: it fails alone."""
    if not rows:
        return Decoded([], [])
    try:
        payloads = orjson.loads("[" + ",".join([r["payload"] for r in rows]) + "]")
        metadata = orjson.loads("[" + ",".join([r["metadata"] for r in rows]) + "]")
    except orjson.JSONDecodeError:
        pass
    else:
        if all(type(m) is dict for m in metadata):
            return Decoded(payloads, metadata)
    decoded = Decoded([None] * len(rows), [None] * len(rows))
    for index, r in enumerate(rows):
        try:
            event = decode_record(r)
        except EventUnavailable as exc:
            decoded.unavailable[index] = exc
        else:
            decoded.payloads[index], decoded.metadata[index] = event.payload, event.metadata
    return decoded


def batch_of(
    rows: Sequence[db.Record], payloads: list[Any], metadata: Sequence[dict[str, Any] | None]
) -> EventBatch:
    """Journal rows (`load_ranges`' columns, in its order: campaign, seq, type, payload,
    metadata, recorded_at, version) with their decoded payloads and metadata as one batch: the
    columns taken at once, not looked up by name per event."""
    if not rows:
        return EventBatch([], [], [], [], [], [])
    cids, seqs, types, _, _, recorded, versions = (list(c) for c in zip(*rows, strict=True))
    return EventBatch(cids, seqs, types, payloads, [m or {} for m in metadata], recorded, versions)


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
        r.get("version") or 1,  # a read without the column (a missing event's) reads 1
    )


async def load_events(
    conn: Connection, campaign_id: str, first: int, last: int
) -> list[StoredEvent]:
    """A campaign's events `first..last` as projectors see them (decoded from the journal)."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    rows = await conn.fetch(Q.load_events, campaign_id, first, last, bucket)
    return [decode_record(r, campaign_id) for r in rows]


async def load_ranges(
    conn: Connection,
    ranges: Sequence[tuple[str, int, int]],
    *,
    bucket: int | None = None,
    types: Collection[str] | None = None,
) -> list[db.Record]:
    """The journal rows of each (campaign_id, first, last) range, in campaign and seq order
    (columns as `decode_record` reads them), one statement per bucket: `bucket` when the caller
    knows every campaign is in it, else each campaign's. `types`: only the events of those
    types, read by the journal's type index (a projector's own)."""
    rows: list[db.Record] = []
    parts = await _by_bucket(conn, ranges, bucket)
    for part_bucket, args in parts:
        if types is None:
            rows.extend(await conn.fetch(Q.load_ranges, part_bucket, *args))
        else:
            rows.extend(await conn.fetch(Q.load_typed_ranges, part_bucket, *args, sorted(types)))
    if len(parts) > 1:
        rows.sort(key=lambda r: (r["campaign_id"], r["seq"]))
    return rows


async def count_typed(
    conn: Connection, ranges: Sequence[tuple[str, int, int]], types: Collection[str], *, bucket: int
) -> dict[str, int]:
    """How many events of `types` each (campaign_id, first, last) range holds (all in
    `bucket`), from the type index alone: a campaign with none is left out."""
    counts: dict[str, int] = {}
    for part_bucket, args in await _by_bucket(conn, ranges, bucket):
        for r in await conn.fetch(Q.count_typed_ranges, part_bucket, *args, sorted(types)):
            counts[r["campaign_id"]] = r["events"]
    return counts


async def _by_bucket(
    conn: Connection, ranges: Sequence[tuple[str, int, int]], bucket: int | None
) -> list[tuple[int, tuple[list[str], list[int], list[int]]]]:
    """`ranges` as the range statements take them, one group per bucket (see `load_ranges`)."""
    parts = await buckets.grouped(conn, ranges, lambda r: r[0], bucket=bucket, span=True)
    grouped = []
    for part_bucket, part in parts.items():
        cids, firsts, lasts = (list(column) for column in zip(*part, strict=True))
        grouped.append((part_bucket, (cids, firsts, lasts)))
    return grouped


async def rebuild_events(
    conn: Connection, campaign_id: str, types: Sequence[str], *, prefetch: int
) -> AsyncIterator[tuple[int, StoredEvent | None]]:
    """A campaign's events of `types` up to its journal head, in seq order, each with that
    head (read in the same snapshot, so a checkpoint set to it passes no event unseen); one
    (head, None) when there are none. Needs a transaction (a server-side cursor)."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    cursor = conn.cursor(Q.load_rebuild_events, campaign_id, list(types), bucket, prefetch=prefetch)
    async for r in cursor:
        yield r["last_seq"], None if r["seq"] is None else decode_record(r, campaign_id)


async def get_campaign_head(executor: Executor, campaign_id: str) -> int:
    """The last allocated seq of a campaign (0: it has no events)."""
    async with db.acquire(executor) as conn:
        bucket = await buckets.bucket_for(conn, campaign_id)
        head: int | None = await conn.fetchval(Q.get_campaign_head, campaign_id, bucket)
    return head or 0


async def list_campaigns(executor: Executor, campaign_id: str | None = None) -> list[str]:
    """Campaigns with events, one or all, in id order."""
    async with db.acquire(executor) as conn:
        bucket = None if campaign_id is None else await buckets.bucket_for(conn, campaign_id)
        rows = await conn.fetch(Q.list_campaigns, campaign_id, bucket)
    return [r["campaign_id"] for r in rows]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """An event as the journal holds it, payload and metadata as stored text (undecoded)."""

    seq: int
    event_type: str
    payload: str
    metadata: str
    recorded_at: datetime


async def recent_events(conn: Connection, campaign_id: str, *, limit: int) -> list[JournalEntry]:
    """A campaign's last `limit` events, newest first, as stored."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    rows = await conn.fetch(Q.list_recent_events, campaign_id, limit, bucket)
    return [JournalEntry(*r) for r in rows]


async def prune_append_keys(conn: Connection, *, batch_size: int) -> int:
    """Delete expired idempotency keys, `batch_size` per statement; how many went."""
    return await db.prune(conn, Q.prune_append_keys, batch=batch_size)
