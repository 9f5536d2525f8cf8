"""Reads of the work queue: what the report, health, metrics, drains and read-your-writes see.

Each function takes an executor first and returns typed values (the report's rows, counts,
the oldest claimable head, blocked campaigns); nothing here writes, renders or decides health.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import orjson

from outbox import db
from outbox.queries import Queries
from outbox.queue.settle import APPLIED_CHANNEL

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from outbox.db import Connection, Executor

T = TypeVar("T", bound="DataclassInstance")

__all__ = [
    "STATUSES",
    "Applied",
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
    "earliest_next_attempt",
    "failure_groups",
    "first_outstanding",
    "list_leases",
    "list_parked",
    "list_rows",
    "next_due_in",
    "oldest_claimable",
    "outstanding_upto",
    "shadow_observations",
    "wait_applied",
]

STATUSES = ("pending", "processing", "failed", "dead")
# Seconds between looks of a `wait_applied` that listens and hears nothing.
RECHECK = 1.0


class InspectQueries(Queries):
    get_first_outstanding: str
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
    get_next_due: str
    get_outstanding_upto: str


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
        rows = await conn.fetch(Q.count_rows_by_status, campaign_id)
    return StatusCounts(**{r["status"]: r["n"] for r in rows})


async def count_rows_bounded(conn: Connection, bound: int) -> StatusCounts:
    """Work rows per status, each counted up to `bound` (a count of `bound`: that many or more)."""
    row = await conn.fetchrow(Q.count_rows_bounded, bound)
    assert row is not None  # scalar subqueries: always one row
    return _of(StatusCounts, row)


async def oldest_claimable(
    conn: Connection, campaign_id: str | None = None, *, park: bool
) -> OldestClaimable | None:
    r = await conn.fetchrow(Q.get_oldest_claimable, campaign_id, park)
    return None if r is None else _of(OldestClaimable, r)


async def count_dead(conn: Connection, campaign_id: str | None = None) -> int:
    return int(await conn.fetchval(Q.count_dead_rows, campaign_id))


async def earliest_next_attempt(
    conn: Connection, campaign_id: str | None = None
) -> datetime | None:
    """The earliest next_attempt_at among claimable statuses."""
    value: datetime | None = await conn.fetchval(Q.get_earliest_next_attempt, campaign_id)
    return value


async def blocked_campaigns(
    conn: Connection,
    campaign_id: str | None = None,
    *,
    park: bool,
    limit: int,
    waiting_bound: int | None = None,
) -> tuple[list[BlockedCampaign], int]:
    """Up to `limit` blocked campaigns, oldest first, and how many there are in all; the rows
    waiting behind each head are counted up to `waiting_bound` (None: all of them)."""
    rows = await conn.fetch(Q.list_blocked_campaigns, campaign_id, park, limit, waiting_bound)
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
    rows = await conn.fetch(Q.list_rows, status, campaign_id, limit, payload)
    listed = [_of(QueueRow, r) for r in rows]
    return [replace(q, payload=_decoded(q.payload)) for q in listed] if payload else listed


def _decoded(text: str | None) -> Any:
    """A payload as JSON, or its text where it does not decode (the row fails for that)."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


async def list_parked(conn: Connection, campaign_id: str | None, *, limit: int) -> list[ParkedRow]:
    rows = await conn.fetch(Q.list_rows, "dead", campaign_id, limit, False)
    return [_of(ParkedRow, r) for r in rows]


async def list_leases(conn: Connection, campaign_id: str | None, *, limit: int) -> list[LeaseRow]:
    rows = await conn.fetch(Q.list_leases, campaign_id, limit)
    return [_of(LeaseRow, r) for r in rows]


async def shadow_observations(
    conn: Connection, campaign_id: str | None = None
) -> ShadowObservations:
    r = await conn.fetchrow(Q.get_shadow_observations, campaign_id)
    assert r is not None  # an aggregate always returns its row
    return _of(ShadowObservations, r)


async def next_due_in(executor: Executor, *, ordered: bool, later: bool = False) -> float | None:
    """Seconds until the next claimable work is due (negative: already due); None: none
    waits. `later`: only work not due yet counts."""
    async with db.acquire(executor) as conn:
        value: float | None = await conn.fetchval(Q.get_next_due, not ordered, later)
    return value


async def outstanding_upto(conn: Connection, campaign_id: str, seq: int) -> bool:
    """Whether a work row of the campaign at or below `seq` is still outstanding."""
    found: bool = await conn.fetchval(Q.get_outstanding_upto, campaign_id, seq)
    return found


@dataclass(frozen=True, slots=True)
class Applied:
    """What `wait_applied` found for a campaign's events up to a seq: `applied`, or what holds
    them, the first row still outstanding (`seq`, its `attempts`, `last_error` and
    `next_attempt_at`): `pending` or `processing` (a worker has it, or will), `failed` (waiting
    for a retry) or `dead` (blocked until an operator requeues it). True only when applied."""

    state: Literal["applied", "pending", "processing", "failed", "dead"]
    campaign_id: str
    seq: int | None = None
    attempts: int = 0
    last_error: str | None = None
    next_attempt_at: datetime | None = None

    def __bool__(self) -> bool:
        return self.state == "applied"

    @property
    def blocked(self) -> bool:
        """A failed or dead row holds the campaign: waiting longer may not help."""
        return self.state in ("failed", "dead")


async def first_outstanding(
    conn: Connection, campaign_id: str, seq: int
) -> tuple[Applied, float | None]:
    """Where the campaign's events up to `seq` stand, and the seconds until the holding row's
    next attempt (None when all are applied)."""
    r = await conn.fetchrow(Q.get_first_outstanding, campaign_id, seq)
    if r is None:
        return Applied("applied", campaign_id), None
    found = Applied(
        r["status"],
        campaign_id,
        r["seq"],
        r["attempt_count"],
        r["last_error"],
        r["next_attempt_at"],
    )
    return found, r["due_in"]


async def wait_applied(
    executor: Executor,
    campaign_id: str,
    seq: int,
    timeout: float,  # noqa: ASYNC109 - the public signature takes a timeout
) -> Applied:
    """Read-your-writes: wait until `campaign_id`'s events up to `seq` are applied. Returns an
    `Applied`, true when they are; otherwise it says what holds them. It returns early when
    waiting cannot help: a dead row, or a failed one whose retry falls due after the timeout.

    It LISTENs for the workers' applied notification (sent when a batch deletes rows) and looks
    again on each, so it returns within a round trip of the projection's commit. On a connection
    inside a transaction (where notifications wait for the transaction's end) it polls."""
    async with db.acquire(executor) as conn:
        listening = not db.in_transaction(conn)
        woken = [anyio.Event()]

        def ring(*_: object) -> None:
            woken[0].set()

        if listening:
            await conn.add_listener(APPLIED_CHANNEL, ring)
        try:
            deadline = anyio.current_time() + timeout
            poll = 0.005
            while True:
                found, due_in = await first_outstanding(conn, campaign_id, seq)
                left = deadline - anyio.current_time()
                if found.state in ("applied", "dead") or left <= 0:
                    return found
                if found.state == "failed" and due_in is not None and due_in > left:
                    return found  # its retry falls due after the timeout
                # Listening, a look now and then still covers workers that send no notification
                # (an older release mid-upgrade); inside a transaction, polling is all there is.
                with anyio.move_on_after(min(left, RECHECK if listening else poll)):
                    await woken[0].wait()
                woken[0] = anyio.Event()
                poll = min(poll * 2, 0.25)
        finally:
            if listening:
                await conn.remove_listener(APPLIED_CHANNEL, ring)
