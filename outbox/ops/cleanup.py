"""Pruning what the guards and the registry no longer need, each table by its owner's
statement, in bounded batches (short transactions, short locks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import db, dedup
from outbox.append.journal import prune_append_keys
from outbox.errors import ValidationError
from outbox.projection.guards import prune_markers
from outbox.projection.sweep import catch_ups
from outbox.worker.registration import prune_workers

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["CLAIMS_RETENTION_DAYS", "Cleanup", "Removed", "cleanup"]

# Consumer dedup claims outlive the end of their week by this many days: a redelivery later
# than that is not caught (docs/idempotency.md). Brokers keep messages about a week by default.
CLAIMS_RETENTION_DAYS = 14


@dataclass(frozen=True, slots=True)
class Removed:
    processed_markers: int
    append_idempotency_keys: int
    consumer_claims: int
    outbox_workers: int


@dataclass(frozen=True, slots=True)
class Cleanup:
    removed: Removed


async def cleanup(
    executor: Executor,
    *,
    markers_retention_hours: int = 168,
    claims_retention_days: int = CLAIMS_RETENTION_DAYS,
    batch_size: int = 5000,
) -> Cleanup:
    """Prune markers past retention (but none of a projector catching up from the journal),
    expired append keys, consumer claims whose week ended more than `claims_retention_days`
    ago, and stale worker-registry rows."""
    if not 1 <= markers_retention_hours <= 24 * 3660:
        raise ValidationError("markers_retention_hours", "expected 1 to 87840 hours")
    if not 1 <= claims_retention_days <= 3660:
        raise ValidationError("claims_retention_days", "expected 1 to 3660 days")
    if not 1 <= batch_size <= 1_000_000:
        raise ValidationError("batch_size", "expected 1 to 1000000")
    hours = markers_retention_hours
    async with db.acquire(executor) as conn:
        removed = Removed(
            await prune_markers(
                conn,
                retention_hours=hours,
                batch_size=batch_size,
                keep=[c.projector for c in await catch_ups(conn, progress=False) if c.catching_up],
            ),
            await prune_append_keys(conn, batch_size=batch_size),
            await dedup.prune_claims(
                conn, retention_days=claims_retention_days, batch_size=batch_size
            ),
            await prune_workers(conn, retention_hours=hours, batch_size=batch_size),
        )
    return Cleanup(removed)
