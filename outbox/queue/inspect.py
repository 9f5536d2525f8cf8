"""Reads of the work queue: what the report, health, metrics, drains and read-your-writes see.

Each function takes an executor first and returns typed values (the report's rows, counts,
the oldest claimable head, blocked campaigns); nothing here writes, renders or decides health.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import anyio

from outbox import db
from outbox.queries import Queries

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from outbox.db import Connection, Executor

T = TypeVar("T", bound="DataclassInstance")

__all__ = [
    "STATUSES",
    "BlockedCampaign",
    "LeaseRow",
    "OldestClaimable",
    "ParkedRow",
    "QueueRow",
    "ShadowObservations",
    "StatusCounts",
    "blocked_campaigns",
    "count_dead",
    "count_rows",
    "earliest_next_attempt",
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


class InspectQueries(Queries):
    count_rows_by_status: str
    get_oldest_claimable: str
    count_dead_rows: str
    get_earliest_next_attempt: str
    list_blocked_campaigns: str
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


def _of(cls: type[T], record: db.Record) -> T:
    """A row type from a record holding (at least) its fields."""
    return cls(**{f.name: record[f.name] for f in fields(cls)})


async def count_rows(executor: Executor, campaign_id: str | None = None) -> StatusCounts:
    """Work rows per status (every status present, zero when empty)."""
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.count_rows_by_status, campaign_id)
    return StatusCounts(**{r["status"]: r["n"] for r in rows})


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
    conn: Connection, campaign_id: str | None = None, *, park: bool, limit: int
) -> tuple[list[BlockedCampaign], int]:
    """Up to `limit` blocked campaigns, oldest first, and how many there are in all."""
    rows = await conn.fetch(Q.list_blocked_campaigns, campaign_id, park, limit)
    total = int(rows[0]["total"]) if rows else 0
    return [_of(BlockedCampaign, r) for r in rows], total


async def list_rows(
    conn: Connection, *, status: str | None, campaign_id: str | None, limit: int
) -> list[QueueRow]:
    """Rows by status and campaign: failed and dead first when no status is given."""
    rows = await conn.fetch(Q.list_rows, status, campaign_id, limit)
    return [_of(QueueRow, r) for r in rows]


async def list_parked(conn: Connection, campaign_id: str | None, *, limit: int) -> list[ParkedRow]:
    rows = await conn.fetch(Q.list_rows, "dead", campaign_id, limit)
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


async def next_due_in(executor: Executor, *, ordered: bool) -> float | None:
    """Seconds until the next claimable work is due (negative: already due); None: none
    waits."""
    async with db.acquire(executor) as conn:
        value: float | None = await conn.fetchval(Q.get_next_due, not ordered)
    return value


async def outstanding_upto(conn: Connection, campaign_id: str, seq: int) -> bool:
    """Whether a work row of the campaign at or below `seq` is still outstanding."""
    found: bool = await conn.fetchval(Q.get_outstanding_upto, campaign_id, seq)
    return found


async def wait_applied(
    executor: Executor,
    campaign_id: str,
    seq: int,
    timeout: float,  # noqa: ASYNC109 - the public signature takes a timeout
) -> bool:
    """Read-your-writes: wait until `campaign_id`'s events up to `seq` are applied (no work
    row at or below `seq` is left). True when applied, False when `timeout` seconds ran out
    (a dead row never gets applied: its campaign waits for an operator)."""
    delay = 0.005
    with anyio.move_on_after(timeout):
        while True:
            async with db.acquire(executor) as conn:
                if not await outstanding_upto(conn, campaign_id, seq):
                    return True
            await anyio.sleep(delay)  # deletions send no notification: poll, gently
            delay = min(delay * 2, 0.25)
    return False
