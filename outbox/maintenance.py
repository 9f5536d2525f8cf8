"""Operator operations returning plain data: the outbox report and requeues of dead rows.

Each function takes an executor first and returns dicts and lists ready for JSON or a table;
nothing here renders, parses options or prints. Every filter travels as a bound parameter.
Requeues keep history: the row gets a fresh attempt budget, and an insert-only audit row keeps
what it was (status, attempts, last error, when), who did it and why.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from outbox import db, queue
from outbox.errors import Conflict, SchemaNotReady, ValidationError
from outbox.migrate import check_current
from outbox.queries import Queries
from outbox.workers import live_workers

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "MAX_LIMIT",
    "STATUSES",
    "cleanup",
    "current_actor",
    "health",
    "leftovers",
    "outbox_report",
    "queue_counts",
    "requeue_dead",
    "requeue_one",
]

STATUSES = ("pending", "processing", "failed", "dead")
MAX_LIMIT = 10_000
REQUEUE_CHUNK = 500
SUMMARY_LIST_LIMIT = 100
# Consumer dedup claims outlive the end of their week by this many days: a redelivery later
# than that is not caught (docs/idempotency.md). Brokers keep messages about a week by default.
CLAIMS_RETENTION_DAYS = 14


class MaintenanceQueries(Queries, file="maintenance.sql"):
    count_by_status: str
    oldest_claimable: str
    dead_rows: str
    earliest_next_attempt: str
    blocked_campaigns: str
    list_rows: str
    list_leases: str
    requeue_dead_rows: str
    prune_markers: str
    prune_append_keys: str
    prune_consumer_claims: str
    prune_workers: str
    shadow_observations: str


Q = MaintenanceQueries


def current_actor() -> str:
    """The operating-system user, for the audit."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"expected an integer from 1 to {MAX_LIMIT}, got {limit!r}")


async def queue_counts(executor: Executor, campaign_id: str | None = None) -> dict[str, int]:
    """Work rows per status (every status present, zero when empty)."""
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.count_by_status, campaign_id)
    return dict.fromkeys(STATUSES, 0) | {r["status"]: r["n"] for r in rows}


async def outbox_report(
    executor: Executor,
    *,
    status: str | None = None,
    limit: int = 50,
    campaign_id: str | None = None,
    park: bool = False,
) -> dict[str, Any]:
    """Counts, the oldest claimable row, blocked campaigns, parked rows, live workers, rows."""
    if status is not None and status not in STATUSES:
        raise ValidationError("status", f"expected one of {'/'.join(STATUSES)}, got {status!r}")
    _check_limit(limit)
    async with db.acquire(executor) as conn:
        counts = await queue_counts(conn, campaign_id)
        oldest = await conn.fetchrow(Q.oldest_claimable, campaign_id, park)
        earliest = await conn.fetchval(Q.earliest_next_attempt, campaign_id)
        blocked = await conn.fetch(Q.blocked_campaigns, campaign_id, park, SUMMARY_LIST_LIMIT)
        parked = (
            await conn.fetch(Q.list_rows, "dead", campaign_id, SUMMARY_LIST_LIMIT) if park else []
        )
        rows = await conn.fetch(Q.list_rows, status, campaign_id, limit)
        leases = await conn.fetch(Q.list_leases, campaign_id, SUMMARY_LIST_LIMIT)
        workers = await live_workers(conn)
        shadow = await conn.fetchrow(Q.shadow_observations, campaign_id)
    return {
        "status": status,
        "limit": limit,
        "summary": {
            "campaign_id": campaign_id,
            "counts": counts,
            "total": sum(counts.values()),
            "oldest_claimable": dict(oldest) if oldest else None,
            "earliest_next_attempt_at": earliest,
            "blocked_campaigns": [{k: v for k, v in r.items() if k != "total"} for r in blocked],
            "shadow": dict(shadow) if shadow else None,
            "parked_rows": [
                {k: r[k] for k in ("campaign_id", "seq", "event_type", "last_error")}
                for r in parked
            ],
            "leases": [dict(r) for r in leases],
            "workers": [
                {
                    "worker_id": w["worker_id"],
                    "host": w["host"],
                    "pid": w["pid"],
                    "mode": w["mode"],
                    "concurrency": w["concurrency"],
                    "heartbeat_age_seconds": w["heartbeat_age"],
                    "counters": w["counters"],
                }
                for w in workers
            ],
        },
        "rows": [dict(r) for r in rows],
    }


async def _requeue(
    conn: Connection,
    *,
    limit: int,
    campaign_id: str | None = None,
    event_type: str | None = None,
    one: tuple[str, int] | None = None,
    dry_run: bool = False,
    actor: str,
    reason: str | None,
) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        Q.requeue_dead_rows,
        limit,
        campaign_id,
        event_type,
        one[0] if one else None,
        one[1] if one else None,
        dry_run,
        actor,
        reason,
    )
    if not dry_run:
        # Live again: their campaigns are claimable at once. The dead policy is the workers'
        # to know; never marking a campaign blocked is the safe side (a block worker's next
        # claim of it marks it again if a dead row still precedes).
        await queue.refresh_campaigns(
            conn, sorted({r["campaign_id"] for r in rows}), park=True, removable=()
        )
    return [dict(r) for r in rows]


async def requeue_one(
    executor: Executor,
    campaign_id: str,
    seq: int,
    *,
    actor: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """One dead row back to pending; NotFound, or Conflict when not dead or held by a batch."""
    async with db.acquire(executor) as conn:
        async with conn.transaction():
            row, _ = await queue.claim_one(conn, campaign_id, seq, park=True)
            status = row.status
            if status != "dead":
                raise Conflict(f"row {campaign_id!r} seq {seq} is {status}, not dead")
            await _requeue(
                conn, limit=1, one=(campaign_id, seq), actor=actor or current_actor(), reason=reason
            )
        await queue.notify_work(conn)
    return {"campaign_id": campaign_id, "seq": seq, "requeued": True}


async def requeue_dead(
    executor: Executor,
    *,
    limit: int,
    campaign_id: str | None = None,
    event_type: str | None = None,
    dry_run: bool = False,
    actor: str | None = None,
    reason: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Up to `limit` dead rows back to pending, oldest first, in chunks of their own
    transactions (a long requeue never holds many locks); `progress(n)` after each chunk.
    With `dry_run` nothing changes and the rows that would move come back."""
    _check_limit(limit)
    actor = actor or current_actor()
    done: list[dict[str, Any]] = []
    async with db.acquire(executor) as conn:
        if dry_run:
            return await _requeue(
                conn,
                limit=limit,
                campaign_id=campaign_id,
                event_type=event_type,
                dry_run=True,
                actor=actor,
                reason=reason,
            )
        while len(done) < limit:
            ask = min(REQUEUE_CHUNK, limit - len(done))
            async with conn.transaction():
                chunk = await _requeue(
                    conn,
                    limit=ask,
                    campaign_id=campaign_id,
                    event_type=event_type,
                    actor=actor,
                    reason=reason,
                )
            done += chunk
            if progress is not None:
                progress(len(chunk))
            if len(chunk) < ask:
                break
        if done:
            await queue.notify_work(conn)
    return done


async def _prune(conn: Connection, query: str, *args: int) -> int:
    """Run a bounded DELETE until it removes fewer rows than its batch (the last argument)."""
    total = 0
    while True:
        status = await conn.execute(query, *args)
        removed = int(status.split()[-1])
        total += removed
        if removed < args[-1]:
            return total


async def cleanup(
    executor: Executor,
    *,
    markers_retention_hours: int = 168,
    claims_retention_days: int = CLAIMS_RETENTION_DAYS,
    batch_size: int = 5000,
) -> dict[str, int]:
    """Prune markers past retention, expired append keys, consumer claims whose week ended more
    than `claims_retention_days` ago, and stale worker-registry rows, each in bounded batches
    (short transactions, short locks)."""
    if not 1 <= markers_retention_hours <= 24 * 3660:
        raise ValidationError("markers_retention_hours", "expected 1 to 87840 hours")
    if not 1 <= claims_retention_days <= 3660:
        raise ValidationError("claims_retention_days", "expected 1 to 3660 days")
    if not 1 <= batch_size <= 1_000_000:
        raise ValidationError("batch_size", "expected 1 to 1000000")
    hours, days = markers_retention_hours, claims_retention_days
    async with db.acquire(executor) as conn:
        return {
            "processed_markers": await _prune(conn, Q.prune_markers, hours, batch_size),
            "append_idempotency_keys": await _prune(conn, Q.prune_append_keys, batch_size),
            "consumer_claims": await _prune(conn, Q.prune_consumer_claims, days, batch_size),
            "outbox_workers": await _prune(conn, Q.prune_workers, hours, batch_size),
        }


async def leftovers(executor: Executor, *, park: bool) -> dict[str, int]:
    """What a finished drain leaves: rows per status, and campaigns blocked behind a failed or
    dead head (under `park`, dead rows block nothing)."""
    counts = await queue_counts(executor)
    async with db.acquire(executor) as conn:
        first = await conn.fetchrow(Q.blocked_campaigns, None, park, 1)
    return {**counts, "blocked_campaigns": int(first["total"]) if first else 0}


async def health(
    executor: Executor,
    *,
    max_oldest_age: float | None = None,
    max_dead: int = 0,
    max_blocked: int = 0,
    park: bool = False,
) -> dict[str, Any]:
    """Healthy when migrations are current, at most `max_dead` rows are dead, at most
    `max_blocked` campaigns are blocked behind a failed or dead head (under `park` dead rows
    block nothing), and the oldest claimable row is younger than `max_oldest_age`; the reasons
    say what is not. (The database answering is the caller's first check.)"""
    reasons: list[str] = []
    try:
        await check_current(executor)
        migrations = "current"
    except SchemaNotReady as exc:
        migrations = "not current"
        reasons.append(str(exc))
    age: float | None = None
    dead = blocked = None
    if migrations == "current":
        async with db.acquire(executor) as conn:
            oldest = await conn.fetchrow(Q.oldest_claimable, None, park)
            dead = int(await conn.fetchval(Q.dead_rows, None))
            first = await conn.fetchrow(Q.blocked_campaigns, None, park, 1)
        blocked = int(first["total"]) if first else 0
        if dead > max_dead:
            reasons.append(f"{dead} dead row(s), over {max_dead}")
        if blocked > max_blocked:
            where = (
                f" (oldest: {first['campaign_id']!r} at seq {first['blocking_seq']})"
                if first
                else ""
            )
            reasons.append(f"{blocked} blocked campaign(s), over {max_blocked}{where}")
        if oldest is not None:
            age = oldest["age_seconds"]
            if max_oldest_age is not None and age > max_oldest_age:
                reasons.append(
                    f"oldest claimable row {oldest['campaign_id']!r} seq {oldest['seq']} "
                    f"is {age:.0f}s old, over {max_oldest_age:g}s"
                )
    return {
        "healthy": not reasons,
        "migrations": migrations,
        "oldest_claimable_age_seconds": age,
        "max_oldest_age_seconds": max_oldest_age,
        "dead_rows": dead,
        "max_dead": max_dead,
        "blocked_campaigns": blocked,
        "max_blocked": max_blocked,
        "reasons": reasons,
    }
