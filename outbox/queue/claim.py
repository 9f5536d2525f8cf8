"""The claim: which due work a batch takes, with its events, and the locks that hold a campaign.

Under campaign ordering a claim locks due campaigns from the campaign queue (oldest due
first, `SKIP LOCKED`), then reads each one's rows from its head with their events and the
ordered projectors' checkpoints, locked: one call of the server-side `outbox_claim`. The
events are decoded in bulk (`decode_bulk`) into the rows' fields; `event_batch` hands a group of
rows to dispatch as columns. The
campaign's holder owns its rows until it commits. Under ordering `none` it locks due rows
directly. Operators' tools lock one row without waiting (`claim_one`); paths that must keep
every applier out of a campaign hold its queue row (`hold_campaign`) or all its rows
(`lock_campaign_rows`). Nothing here decides which rows to apply, or applies anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from outbox import buckets, db
from outbox.append.journal import decode_bulk
from outbox.errors import Conflict, EventUnavailable, NotFound
from outbox.model import EventBatch, Key, StoredEvent, Take
from outbox.queries import Queries
from outbox.queue.holds import Hold, parse_holds

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = [
    "ClaimedCampaign",
    "ClaimedRow",
    "claim",
    "claim_holds",
    "claim_one",
    "event_batch",
    "group_due_in",
    "hold_campaign",
    "lock_campaign_rows",
    "lock_heads",
]


class ClaimQueries(Queries):
    claim_batch: str
    claim_holds: str
    get_group_due: str
    claim_due_rows: str
    claim_one: str
    lock_heads: str
    hold_campaign: str
    lock_campaign_rows: str


Q = ClaimQueries


@dataclass(slots=True)
class ClaimedRow:
    """A locked work row with its journal event's fields. `event_type` is None when the event
    is unavailable (its journal row missing or undecodable), and `unavailable` then says why
    (raised as that row's failure). One is built per claimed row, so it holds the event's
    fields rather than a `StoredEvent` (built on demand, `stored_event()`), and is a plain slots
    class: a frozen dataclass's `__init__` costs several times more. Read-only by contract."""

    campaign_id: str
    seq: int
    status: str
    attempt_count: int
    next_attempt_at: datetime
    due: bool
    event_type: str | None
    payload: Any = None
    metadata: dict[str, Any] | None = None
    recorded_at: datetime | None = None
    unavailable: EventUnavailable | None = None
    lease_owner: str | None = None  # lease mode: who last claimed it, and that claim's epoch
    claim_epoch: int | None = None
    version: int = 1  # the version its event was appended at (issue 62)

    @property
    def key(self) -> Key:
        return (self.campaign_id, self.seq)

    def stored_event(self) -> StoredEvent:
        """The event, or the row's EventUnavailable."""
        if self.event_type is None or self.metadata is None or self.recorded_at is None:
            raise self.unavailable or EventUnavailable(
                f"journal event {self.campaign_id!r} seq {self.seq} is missing"
            )
        return StoredEvent(
            self.campaign_id,
            self.seq,
            self.event_type,
            self.payload,
            self.metadata,
            self.recorded_at,
            self.version,
        )


def event_batch(rows: Sequence[ClaimedRow]) -> EventBatch:
    """The events of `rows` (each one available) as one batch: its columns read from the rows,
    no `StoredEvent` built."""
    return EventBatch(
        [r.campaign_id for r in rows],
        [r.seq for r in rows],
        cast(list[str], [r.event_type for r in rows]),
        [r.payload for r in rows],
        cast(list[dict[str, Any]], [r.metadata for r in rows]),
        cast(list[datetime], [r.recorded_at for r in rows]),
        [r.version for r in rows],
    )


@dataclass(frozen=True, slots=True)
class ClaimedCampaign:
    """A campaign an ordered claim holds: its rows from the head (as far as the budget went)
    and its first and last outstanding seq (None: no row is left)."""

    campaign_id: str
    rows: list[ClaimedRow]
    first_seq: int | None
    last_seq: int | None
    checkpoints: dict[str, int]  # ordered projector -> applied_seq (missing: 0), locked
    holds: tuple[Hold, ...] = ()  # its projectors' holds (S24): an ordered claim reads them all,
    # a claim of rows those of its rows


async def claim(
    conn: Connection,
    *,
    bucket: int,
    limit: int,
    ordered: bool,
    campaigns: int | None = None,
    projectors: Sequence[str] = (),
    now: datetime | None = None,
    take: Take = "all",
) -> list[ClaimedCampaign]:
    """Lock up to `limit` rows of `bucket`: under campaign ordering, due campaigns and the rows
    from their heads (the campaign's rows are the holder's alone) with the checkpoints of the
    ordered `projectors`, in one call whose second statement sees every commit of the
    campaigns' previous holders (`bucket` may be `buckets.SPAN`: the campaigns due first in
    every bucket, on one server); else due rows, each locked, one pseudo-campaign per row's
    campaign (no checkpoints read). Campaigns sorted by id, rows by seq. `campaigns`: how many
    campaigns an ordered claim takes at most (default `limit`), the rows shared among them;
    `take`: all due campaigns, `live` ones only (not those that wait for holds alone), or
    those only (`holds`; S25)."""
    if ordered:
        records = await conn.fetch(
            Q.claim_batch,
            bucket,
            min(campaigns or limit, limit),
            limit,
            list(projectors),
            now,
            take,
        )
    else:
        records = await conn.fetch(Q.claim_due_rows, limit, now, bucket)
    return _campaigns(records, ordered=ordered)


async def claim_holds(
    conn: Connection, *, projectors: Sequence[str], limit: int, now: datetime | None = None
) -> list[ClaimedCampaign]:
    """A worker group's claim (S35): up to `limit` due holds of its `projectors` per projector,
    each campaign they stand on with no rows and its checkpoints of `projectors` locked; the
    campaigns sorted by id."""
    records = await conn.fetch(Q.claim_holds, list(projectors), limit, now)
    return [
        ClaimedCampaign(r["campaign_id"], [], None, None, _checkpoints(r), parse_holds(r["holds"]))
        for r in records
    ]


async def group_due_in(
    conn: Connection, projectors: Sequence[str], *, later: bool = False
) -> float | None:
    """Seconds until a hold of `projectors` that is not dead is due (`later`: of those not due
    yet); None when there is none: a worker group's wait (S35)."""
    due: float | None = await conn.fetchval(Q.get_group_due, list(projectors), later)
    return due


def _checkpoints(r: db.Record) -> dict[str, int]:
    """A claimed campaign's checkpoints: ordered projector -> applied_seq (missing: 0)."""
    return dict(zip(r["projectors"] or (), r["applied_seqs"] or (), strict=True))


def _campaigns(records: Sequence[db.Record], *, ordered: bool) -> list[ClaimedCampaign]:
    """A claim's records as campaigns, each with its rows (decoded in bulk)."""
    rows = iter(_claimed_rows([r for r in records if r["seq"] is not None]))
    claimed: list[ClaimedCampaign] = []
    for r in records:
        if not claimed or claimed[-1].campaign_id != r["campaign_id"]:
            claimed.append(
                ClaimedCampaign(
                    r["campaign_id"],
                    [],
                    r["first_seq"],
                    r["last_seq"],
                    _checkpoints(r),
                    parse_holds(r["holds"]),
                )
            )
        elif not ordered and r["holds"] is not None:  # a claim of rows: each row's own
            last = claimed[-1]
            claimed[-1] = replace(last, holds=last.holds + parse_holds(r["holds"]))
        if r["seq"] is not None:
            claimed[-1].rows.append(next(rows))
    return claimed


def _claimed_rows(records: Sequence[db.Record]) -> list[ClaimedRow]:
    """The claimed rows of `records` (rows with a seq), their events decoded in bulk: a missing
    or undecodable event makes its row unavailable alone (S8)."""
    found = [r for r in records if r["event_type"] is not None]
    decoded = decode_bulk(found)
    payloads, metadata, unavailable = decoded.payloads, decoded.metadata, decoded.unavailable
    rows: list[ClaimedRow] = []
    index = 0
    for r in records:
        event_type: str | None = r["event_type"]
        if event_type is None:
            error: EventUnavailable | None = EventUnavailable(
                f"journal event {r['campaign_id']!r} seq {r['seq']} is missing"
            )
            payload = meta = None
        else:
            error, payload, meta = unavailable.get(index), payloads[index], metadata[index]
            index += 1
            if error is not None:
                event_type = None
        rows.append(
            ClaimedRow(
                r["campaign_id"],
                r["seq"],
                r["status"],
                r["attempt_count"],
                r["next_attempt_at"],
                r["due"],
                event_type,
                payload,
                meta,
                r["recorded_at"],
                error,
                r["lease_owner"],
                r["claim_epoch"],
                r["version"] or 1,  # null: the event is missing
            )
        )
    return rows


async def claim_one(
    conn: Connection, campaign_id: str, seq: int, *, park: bool
) -> tuple[ClaimedRow, int | None]:
    """Lock one row for an operator without waiting, with the seq of the earliest earlier
    outstanding row of its campaign (None: it is the head). NotFound when there is no such row,
    Conflict when a running batch holds it."""
    try:
        bucket = await buckets.bucket_for(conn, campaign_id)
        r = await conn.fetchrow(Q.claim_one, campaign_id, seq, park, bucket)
    except Exception as exc:
        if not db.lock_not_available(exc):
            raise
        raise Conflict(
            f"row {campaign_id!r} seq {seq} is held by a running batch; try again"
        ) from None
    if r is None:
        raise NotFound(f"no queued row {campaign_id!r} seq {seq}")
    (row,) = _claimed_rows([r])
    return row, r["blocked_by"]


async def hold_campaign(conn: Connection, campaign_id: str) -> None:
    """Lock the campaign's queue row until the transaction ends (first, as a batch does)."""
    await conn.execute(Q.hold_campaign, campaign_id, await buckets.bucket_for(conn, campaign_id))


async def lock_campaign_rows(conn: Connection, campaign_id: str) -> int:
    """Hold the campaign and every queued row of it until the transaction ends; returns how
    many rows."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    locked: int = await conn.fetchval(Q.lock_campaign_rows, campaign_id, bucket)
    return locked


async def lock_heads(conn: Connection, campaigns: Sequence[str]) -> set[str]:
    """Hold the append heads of `campaigns` (no append of them runs until commit), skipping
    the ones an append holds now; returns the campaigns held. A campaign row may be deleted
    only while its head is held. One statement per bucket, in bucket order."""
    held: set[str] = set()
    for bucket, group in (await buckets.grouped(conn, sorted(set(campaigns)), str)).items():
        rows = await conn.fetch(Q.lock_heads, bucket, group)
        held.update(r["campaign_id"] for r in rows)
    return held
