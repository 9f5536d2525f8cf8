"""Lease statements: rows of events a non-transactional projector handles are leased by the
batch that claims them, extended by heartbeats, and ended by a compare-and-set on owner, epoch
and status (completed, failed, or handed back).

While a row is processing its next_attempt_at equals its lease expiry, so the ordinary claim
takes it back when the lease expires. Running the leases (the projectors, the heartbeat, when
to end) is the worker's (`outbox.worker.lease`); this module only runs the statements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import TYPE_CHECKING

from outbox import buckets, db
from outbox.model import Key
from outbox.queries import Queries
from outbox.queue.claim import ClaimedRow

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "Lease",
    "complete_lease",
    "extend_leases",
    "lease_rows",
    "release_lease",
    "settle_lease",
]


class LeaseQueries(Queries):
    lease_rows: str
    extend_leases: str
    complete_lease: str
    settle_lease: str
    release_lease: str


Q = LeaseQueries


@dataclass(frozen=True, slots=True)
class Lease:
    """A row leased by a worker: the epoch that fences it, and its attempts so far. `holders`:
    the projectors whose holds on the row the lease retries (S24), lease-mode ones run in it and
    transactional ones at its end; None: the event's first run, every subscriber."""

    row: ClaimedRow
    epoch: int
    expires_at: datetime
    attempt_count: int
    holders: frozenset[str] | None = None

    @property
    def key(self) -> Key:
        return self.row.key


async def lease_rows(
    conn: Connection,
    rows: Sequence[ClaimedRow],
    *,
    owner: str,
    seconds: float,
    now: datetime | None = None,
    bucket: int | None = None,
    holders: Mapping[Key, frozenset[str]] | None = None,
) -> list[Lease]:
    """Lease `rows` (their campaigns held by the caller's claim) in the caller's transaction;
    rows no longer at the epoch the claim read are left out. A row taken back from an expired
    lease counts that lease as an attempt. `bucket`: the batch's, when every row is in it.
    `holders`: the rows whose holds a lease retries, and for whom."""
    records: list[db.Record] = []
    by_bucket = await buckets.grouped(conn, rows, attrgetter("campaign_id"), bucket=bucket)
    for in_bucket, group in by_bucket.items():
        records += await conn.fetch(
            Q.lease_rows,
            [r.campaign_id for r in group],
            [r.seq for r in group],
            owner,
            seconds,
            [r.claim_epoch for r in group],
            now,
            in_bucket,
        )
    by_key = {r.key: r for r in rows}
    return [
        Lease(
            by_key[(r["campaign_id"], r["seq"])],
            r["claim_epoch"],
            r["lease_expires_at"],
            r["attempt_count"],
            (holders or {}).get((r["campaign_id"], r["seq"])),
        )
        for r in records
    ]


async def extend_leases(
    executor: Executor, owner: str, leases: Sequence[Lease], *, seconds: float
) -> set[Key]:
    """Extend by `seconds` the `leases` (sorted by key) that `owner` still holds; returns
    those still held (a missing one was taken over or ended). One statement per bucket."""
    held: set[Key] = set()
    async with db.acquire(executor) as conn:
        by_bucket = await buckets.grouped(conn, leases, attrgetter("row.campaign_id"))
        for bucket, group in by_bucket.items():
            rows = await conn.fetch(
                Q.extend_leases,
                owner,
                [lease.row.campaign_id for lease in group],
                [lease.row.seq for lease in group],
                seconds,
                [lease.epoch for lease in group],
                bucket,
            )
            held.update((r["campaign_id"], r["seq"]) for r in rows)
    return held


async def complete_lease(conn: Connection, lease: Lease, owner: str) -> float | None:
    """Delete the leased row if `owner` still holds it at its epoch; the seconds since it was
    enqueued, or None when the lease was taken over (fenced)."""
    bucket = await buckets.bucket_for(conn, lease.row.campaign_id)
    age: float | None = await conn.fetchval(
        Q.complete_lease, *lease.key, owner, lease.epoch, bucket
    )
    return age


async def settle_lease(conn: Connection, lease: Lease, owner: str) -> float | None:
    """End the lease, its row back to pending for its holds to settle, if `owner` still holds
    it at its epoch; the seconds since it was enqueued, or None when fenced."""
    bucket = await buckets.bucket_for(conn, lease.row.campaign_id)
    age: float | None = await conn.fetchval(Q.settle_lease, *lease.key, owner, lease.epoch, bucket)
    return age


async def release_lease(conn: Connection, lease: Lease, owner: str) -> bool:
    """Hand the lease back unfinished (due now, no attempt counted); False when fenced."""
    bucket = await buckets.bucket_for(conn, lease.row.campaign_id)
    return bool(await conn.fetchval(Q.release_lease, *lease.key, owner, lease.epoch, bucket))
