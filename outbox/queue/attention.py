"""Rows that need an operator: failed and dead work rows, filtered and paged, and one event in
full with its work row (what the console's rows and row pages read).

A page is keyset-paged by the attention index's own order (bucket, campaign, seq), so the
hundredth page costs what the first does; its `total` is counted up to a bound ("10,000+").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING

from outbox import buckets
from outbox.errors import ValidationError
from outbox.queries import Queries
from outbox.queue.inspect import QueueRow, decoded
from outbox.queue.repair import START, Cursor  # the key order shared with the journal's walks

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = [
    "START",
    "AttentionPage",
    "AttentionRow",
    "CampaignRows",
    "Cursor",
    "EventRow",
    "get_event",
    "list_attention",
    "list_campaign_rows",
    "parse_cursor",
]


class AttentionQueries(Queries):
    list_attention_rows: str
    get_event_row: str
    list_campaign_rows: str


Q = AttentionQueries


def parse_cursor(text: str) -> Cursor:
    """A page's `after` as `bucket.seq.campaign` (what `AttentionRow.cursor` writes)."""
    bucket, _, rest = text.partition(".")
    seq, _, campaign = rest.partition(".")
    if not (bucket.isdigit() and seq.isdigit() and campaign) or len(bucket) > 9 or len(seq) > 18:
        raise ValidationError("after", f"expected a page cursor, got {text[:40]!r}")
    return int(bucket), campaign, int(seq)


@dataclass(frozen=True, slots=True)
class AttentionRow:
    bucket: int
    campaign_id: str
    seq: int
    event_type: str
    status: str
    attempt_count: int
    next_attempt_at: datetime
    updated_at: datetime
    last_error: str | None
    projector: str | None  # the projector its error names
    shape: str | None
    fingerprint: str  # its error group

    @property
    def cursor(self) -> str:
        return f"{self.bucket}.{self.seq}.{self.campaign_id}"


@dataclass(frozen=True, slots=True)
class AttentionPage:
    rows: list[AttentionRow]
    total: int  # matches counted from the start, up to `bound`
    bound: int
    after: str | None  # the next page's cursor (None: this is the last)


async def list_attention(
    conn: Connection,
    *,
    status: str | None = None,
    event_type: str | None = None,
    projector: str | None = None,
    fingerprint: str | None = None,
    prefix: str | None = None,
    after: Cursor = START,
    limit: int,
    bound: int,
) -> AttentionPage:
    """One page of failed, dead and leased rows matching every filter given, after `after`."""
    if status not in (None, "failed", "dead", "processing"):
        raise ValidationError("status", f"expected failed, dead or processing, got {status!r}")
    records = await conn.fetch(
        Q.list_attention_rows,
        status,
        event_type,
        projector,
        fingerprint,
        prefix,
        *after,
        limit + 1,
        bound,
    )
    total = int(records[0]["total"]) if records else 0
    rows = [
        AttentionRow(*(r[k] for k in list(r.keys())[1:])) for r in records if r["seq"] is not None
    ]
    more = len(rows) > limit
    rows = rows[:limit]
    return AttentionPage(rows, total, bound, rows[-1].cursor if more else None)


@dataclass(frozen=True, slots=True)
class EventRow:
    """An event as the journal holds it and its work row's state (None: no work row)."""

    campaign_id: str
    seq: int
    event_type: str
    payload: str
    metadata: str
    recorded_at: datetime
    status: str | None
    attempt_count: int | None
    next_attempt_at: datetime | None
    enqueued_at: datetime | None
    updated_at: datetime | None
    last_error: str | None


async def get_event(conn: Connection, campaign_id: str, seq: int) -> EventRow | None:
    bucket = await buckets.bucket_for(conn, campaign_id)
    record = await conn.fetchrow(Q.get_event_row, campaign_id, seq, bucket)
    return EventRow(*record.values()) if record is not None else None


@dataclass(frozen=True, slots=True)
class CampaignRows:
    """A page of one campaign's work rows in seq order, and how many it has (up to `bound`)."""

    rows: list[QueueRow]
    total: int
    bound: int
    after: int | None  # the next page's seq cursor (None: this is the last)


async def list_campaign_rows(
    conn: Connection, campaign_id: str, *, after: int = 0, limit: int, bound: int
) -> CampaignRows:
    """Campaign `campaign_id`'s work rows after seq `after`, `limit` of them, with payloads."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    records = await conn.fetch(Q.list_campaign_rows, campaign_id, bucket, after, limit + 1, bound)
    total = int(records[0]["total"]) if records else 0
    rows = [
        QueueRow(
            **{**{f.name: r[f.name] for f in fields(QueueRow)}, "payload": decoded(r["payload"])}
        )
        for r in records
        if r["seq"] is not None
    ]
    more = len(rows) > limit
    rows = rows[:limit]
    return CampaignRows(rows, total, bound, rows[-1].seq if more else None)
