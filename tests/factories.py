"""Queue states as the worker and operators leave them, for tests to start from.

Each factory writes work rows the way the worker's settle or lease would (status, attempts,
the error line, the next attempt by the database clock) and then brings the campaign rows in
line with them (`refresh_campaigns`: a dead head blocks its campaign under `block`, a failed
head is due at its retry), so a test starts from a state the system itself can reach, not from
a half-written one. `where` picks rows: one campaign, optionally one seq.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from outbox import db
from outbox.queue.settle import refresh_campaigns


async def _aged(
    executor: db.Executor, campaign_id: str, seq: int | None, assignments: str, *args: Any
) -> None:
    """`assignments` on the rows: `$3` is the database's clock, read once first (Citus routes
    no write that calls the clock itself), the factory's own values follow."""
    async with db.acquire(executor) as conn, conn.transaction():
        now = await conn.fetchval("SELECT clock_timestamp()")
        await conn.execute(
            f"UPDATE outbox.projection_apply_outbox SET {assignments}, "
            "updated_at = $3::timestamptz "
            "WHERE campaign_id = $1 AND ($2::bigint IS NULL OR seq = $2)",
            campaign_id,
            seq,
            now,
            *args,
        )
        # A row that projectors' holds stand for (S24): its holders are in the same state.
        await conn.execute(
            "UPDATE outbox.projection_holds h SET status = o.status, "
            "attempt_count = o.attempt_count, next_attempt_at = o.next_attempt_at, "
            "last_error = o.last_error, updated_at = o.updated_at "
            "FROM outbox.projection_apply_outbox o "
            "WHERE h.bucket = o.bucket AND h.campaign_id = o.campaign_id AND h.seq = o.seq "
            "AND o.campaign_id = $1 AND ($2::bigint IS NULL OR o.seq = $2) "
            "AND o.status IN ('failed', 'dead')",
            campaign_id,
            seq,
        )
        await refresh_campaigns(conn, [campaign_id], park=False, removable=())


async def make_dead(
    executor: db.Executor,
    campaign_id: str,
    seq: int | None = None,
    *,
    error: str = "Boom",
    attempts: int = 8,
    hours_ago: float = 0.0,
) -> None:
    """The row(s) dead after `attempts`, their last error `error`, the last attempt
    `hours_ago`."""
    await _aged(
        executor,
        campaign_id,
        seq,
        "status = 'dead', attempt_count = $4, last_error = $5, "
        "next_attempt_at = $3::timestamptz - make_interval(secs => $6::float8 * 3600)",
        attempts,
        error,
        hours_ago,
    )


async def make_failed(
    executor: db.Executor,
    campaign_id: str,
    seq: int | None = None,
    *,
    error: str = "Flaky",
    attempts: int = 2,
    due_in: float = 0.0,
) -> None:
    """The row(s) failed `attempts` times, retried in `due_in` seconds (negative: overdue)."""
    await _aged(
        executor,
        campaign_id,
        seq,
        "status = 'failed', attempt_count = $4, last_error = $5, "
        "next_attempt_at = $3::timestamptz + make_interval(secs => $6::float8)",
        attempts,
        error,
        due_in,
    )


async def make_leased(
    executor: db.Executor,
    campaign_id: str,
    seq: int | None = None,
    *,
    owner: str,
    epoch: int = 1,
    attempts: int = 0,
    expires_in: float = 60.0,
    length: float = 60.0,
) -> None:
    """The row(s) leased by `owner` (lease mode) for `length` seconds at claim `epoch` after
    `attempts`, the lease expiring in `expires_in` seconds (negative: expired, due for
    reclaim)."""
    await _aged(
        executor,
        campaign_id,
        seq,
        "status = 'processing', lease_owner = $4, claim_epoch = $5::bigint, "
        "attempt_count = $6::integer, "
        "leased_at = $3::timestamptz + make_interval(secs => $7::float8 - $8::float8), "
        "lease_expires_at = $3::timestamptz + make_interval(secs => $7::float8), "
        "next_attempt_at = $3::timestamptz + make_interval(secs => $7::float8)",
        owner,
        epoch,
        attempts,
        expires_in,
        length,
    )


async def register_worker(
    executor: db.Executor,
    worker_id: str,
    *,
    concurrency: int = 2,
    counters: Mapping[str, Any] | None = None,
) -> None:
    """A live worker's registry row, as a starting worker writes it."""
    async with db.acquire(executor) as conn:
        await conn.execute(
            "INSERT INTO outbox.outbox_workers (worker_id, host, pid, mode, concurrency, counters) "
            "VALUES ($1, 'host', 1, 'apply', $2, $3::text::jsonb)",
            worker_id,
            concurrency,
            orjson.dumps(dict(counters or {})).decode(),
        )
