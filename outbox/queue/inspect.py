"""Reads of the work queue: what the report, health, metrics and drains see.

Each function takes an executor first and returns typed values (the report's rows, counts,
the oldest claimable head, blocked campaigns); nothing here writes, renders or decides health.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from outbox import buckets, db
from outbox.queries import Queries

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from outbox.db import Connection, Executor

T = TypeVar("T", bound="DataclassInstance")

__all__ = [
    "STATUSES",
    "BlockedCampaign",
    "FailureGroup",
    "LeaseRow",
    "OldestClaimable",
    "ParkedRow",
    "QueueRow",
    "ShadowObservations",
    "StatusCounts",
    "blocked_campaigns",
    "count_dead",
    "count_rows",
    "count_rows_bounded",
    "decoded",
    "earliest_next_attempt",
    "failure_groups",
    "list_leases",
    "list_parked",
    "list_rows",
    "oldest_claimable",
    "shadow_observations",
]

STATUSES = ("pending", "processing", "failed", "dead")


class InspectQueries(Queries):
    count_rows_by_status: str
    count_rows_bounded: str
    get_oldest_claimable: str
    count_dead_rows: str
    get_earliest_next_attempt: str
    list_blocked_campaigns: str
    list_failure_groups: str
    list_rows: str
    list_leases: str
    get_shadow_observations: str


Q = InspectQueries


@dataclass(frozen=True, slots=True)
class StatusCounts:
    pending: int = 0
    processing: int = 0
    failed: int = 0
    dead: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.processing + self.failed + self.dead


@dataclass(frozen=True, slots=True)
class OldestClaimable:
    """The claimable campaign head waiting longest (by enqueued_at), and its age in seconds."""

    campaign_id: str
    seq: int
    enqueued_at: datetime
    age_seconds: float


@dataclass(frozen=True, slots=True)
class BlockedCampaign:
    """A campaign whose head is failed or dead, with the rows waiting behind it."""

    campaign_id: str
    blocking_seq: int
    status: str
    waiting: int
    age_seconds: float
    enqueued_at: datetime  # the head's: the order, and a page's cursor


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """Failed or dead rows of one projector and error shape: the shape is the error (without
    its projector prefix) with quoted values and numbers replaced by `?`; `fingerprint` names
    the group (`outbox-requeue-dead --error`)."""

    status: str
    projector: str | None
    shape: str | None
    fingerprint: str
    rows: int
    event_types: list[str]
    first_at: datetime
    last_at: datetime
    latest_campaign_id: str
    latest_seq: int
    latest_error: str | None


@dataclass(frozen=True, slots=True)
class ShadowObservations:
    rows_seen: int
    sightings: int
    max_lag_seconds: float | None


@dataclass(frozen=True, slots=True)
class ParkedRow:
    """A dead row stepped over under `park`."""

    campaign_id: str
    seq: int
    event_type: str
    last_error: str | None


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A row in lease mode (processing): owner, epoch, how old and how long to go."""

    campaign_id: str
    seq: int
    event_type: str
    lease_owner: str | None
    claim_epoch: int | None
    attempt_count: int
    last_error: str | None
    lease_age_seconds: float | None
    expires_in_seconds: float | None


@dataclass(frozen=True, slots=True)
class QueueRow:
    campaign_id: str
    seq: int
    event_type: str
    status: str
    attempt_count: int
    next_attempt_at: datetime
    enqueued_at: datetime
    updated_at: datetime
    last_error: str | None
    # The event's payload, when asked for (`list_rows(payload=True)`); the journal's text
    # where it does not decode.
    payload: Any = None


def _of(cls: type[T], record: db.Record) -> T:
    """A row type from a record holding (at least) its fields."""
    return cls(**{f.name: record[f.name] for f in fields(cls)})


async def count_rows(executor: Executor, campaign_id: str | None = None) -> StatusCounts:
    """Work rows per status (every status present, zero when empty)."""
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(
            Q.count_rows_by_status, campaign_id, await buckets.filter_bucket(conn, campaign_id)
        )
    return StatusCounts(**{r["status"]: r["n"] for r in rows})


async def count_rows_bounded(conn: Connection, bound: int) -> StatusCounts:
    """Work rows per status, each counted up to `bound` (a count of `bound`: that many or more)."""
    row = await conn.fetchrow(Q.count_rows_bounded, bound)
    assert row is not None  # scalar subqueries: always one row
    return _of(StatusCounts, row)


async def oldest_claimable(
    conn: Connection, campaign_id: str | None = None, *, park: bool
) -> OldestClaimable | None:
    r = await conn.fetchrow(
        Q.get_oldest_claimable, campaign_id, park, await buckets.filter_bucket(conn, campaign_id)
    )
    return None if r is None else _of(OldestClaimable, r)


async def count_dead(conn: Connection, campaign_id: str | None = None) -> int:
    return int(
        await conn.fetchval(
            Q.count_dead_rows, campaign_id, await buckets.filter_bucket(conn, campaign_id)
        )
    )


async def earliest_next_attempt(
    conn: Connection, campaign_id: str | None = None
) -> datetime | None:
    """The earliest next_attempt_at among claimable statuses."""
    bucket = await buckets.filter_bucket(conn, campaign_id)
    value: datetime | None = await conn.fetchval(Q.get_earliest_next_attempt, campaign_id, bucket)
    return value


async def blocked_campaigns(
    conn: Connection,
    campaign_id: str | None = None,
    *,
    park: bool,
    limit: int,
    waiting_bound: int | None = None,
    after: tuple[datetime, str] | None = None,
) -> tuple[list[BlockedCampaign], int]:
    """Up to `limit` blocked campaigns, oldest first (after `after`: a head's enqueue time and
    campaign), and how many there are in all; the rows waiting behind each head are counted
    up to `waiting_bound` (None: all of them)."""
    bucket = await buckets.filter_bucket(conn, campaign_id)
    at, after_campaign = after if after else (None, None)
    rows = await conn.fetch(
        Q.list_blocked_campaigns,
        campaign_id,
        park,
        limit,
        waiting_bound,
        bucket,
        at,
        after_campaign,
    )
    total = int(rows[0]["total"]) if rows else 0
    return [_of(BlockedCampaign, r) for r in rows], total


async def failure_groups(
    conn: Connection, *, status: str | None, scan: int, limit: int
) -> tuple[list[FailureGroup], int]:
    """Failed and dead rows (or those of one `status`) grouped by projector and error shape,
    largest first, at most `limit` groups, from at most `scan` rows; and how many rows were read
    (`scan` of them: there may be more)."""
    rows = await conn.fetch(Q.list_failure_groups, scan, status, limit)
    scanned = int(rows[0]["scanned"]) if rows else 0
    return [_of(FailureGroup, r) for r in rows], scanned


async def list_rows(
    conn: Connection,
    *,
    status: str | None,
    campaign_id: str | None,
    limit: int,
    payload: bool = False,
) -> list[QueueRow]:
    """Rows by status and campaign: failed and dead first when no status is given; `payload`:
    with their events' payloads."""
    rows = await conn.fetch(
        Q.list_rows,
        status,
        campaign_id,
        limit,
        payload,
        await buckets.filter_bucket(conn, campaign_id),
    )
    listed = [_of(QueueRow, r) for r in rows]
    return [replace(q, payload=decoded(q.payload)) for q in listed] if payload else listed


def decoded(text: str | None) -> Any:
    """A payload as JSON, or its text where it does not decode (the row fails for that)."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


async def list_parked(conn: Connection, campaign_id: str | None, *, limit: int) -> list[ParkedRow]:
    rows = await conn.fetch(
        Q.list_rows,
        "dead",
        campaign_id,
        limit,
        False,
        await buckets.filter_bucket(conn, campaign_id),
    )
    return [_of(ParkedRow, r) for r in rows]


async def list_leases(conn: Connection, campaign_id: str | None, *, limit: int) -> list[LeaseRow]:
    rows = await conn.fetch(
        Q.list_leases, campaign_id, limit, await buckets.filter_bucket(conn, campaign_id)
    )
    return [_of(LeaseRow, r) for r in rows]


async def shadow_observations(
    conn: Connection, campaign_id: str | None = None
) -> ShadowObservations:
    r = await conn.fetchrow(
        Q.get_shadow_observations, campaign_id, await buckets.filter_bucket(conn, campaign_id)
    )
    assert r is not None  # an aggregate always returns its row
    return _of(ShadowObservations, r)
