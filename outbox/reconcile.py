"""Enqueue-gap repair: journal events that have no work row and are not applied yet.

Events appended while enqueueing was off, or whose rows were deleted by hand, get a work row,
unless every projector that subscribes to them already applied them (checkpoint at or past the
seq, or a processed marker). Projectors without a guard cannot tell, so for them an event
counts as not applied. Types nobody subscribes to are left alone. Keys are `(campaign_id, seq)`
throughout, never a global position, and running it twice enqueues nothing the second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from outbox import db, queue
from outbox.projectors import Registry
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = ["reconcile"]

PAGE = 1000


class ReconcileQueries(Queries, file="reconcile.sql"):
    unqueued_events: str
    checkpoints_of: str
    markers_of: str
    enqueue_rows: str


Q = ReconcileQueries


async def _unapplied(
    conn: Connection, registry: Registry, events: Sequence[Any]
) -> list[tuple[str, int, str]]:
    campaigns = sorted({e["campaign_id"] for e in events})
    checkpoints = {
        (r["campaign_id"], r["projector"]): r["applied_seq"]
        for r in await conn.fetch(Q.checkpoints_of, campaigns)
    }
    markers = {
        (r["campaign_id"], r["seq"], r["handler"])
        for r in await conn.fetch(
            Q.markers_of, [e["campaign_id"] for e in events], [e["seq"] for e in events]
        )
    }
    missing = []
    for e in events:
        key = (e["campaign_id"], e["seq"])
        for p in registry.subscribers(e["event_type"]):
            if p.ordered:
                applied = checkpoints.get((key[0], p.name), 0) >= key[1]
            else:
                applied = p.idempotent and (*key, p.name) in markers
            if not applied:
                missing.append((key[0], key[1], e["event_type"]))
                break
    return missing


async def reconcile(
    executor: Executor,
    registry: Registry,
    *,
    campaign_id: str | None = None,
    limit: int = 1000,
    dry_run: bool = False,
) -> list[dict[str, Any]]:
    """Enqueue up to `limit` missing work rows (none with `dry_run`); return them."""
    found: list[tuple[str, int, str]] = []
    cursor: tuple[str, int] = ("", 0)
    async with db.acquire(executor) as conn:
        while len(found) < limit:
            page = await conn.fetch(Q.unqueued_events, campaign_id, *cursor, PAGE)
            if not page:
                break
            cursor = (page[-1]["campaign_id"], page[-1]["seq"])
            found += await _unapplied(conn, registry, page)
        found = found[:limit]
        if found and not dry_run:
            async with conn.transaction():
                await conn.execute(
                    Q.enqueue_rows,
                    [f[0] for f in found],
                    [f[1] for f in found],
                    [f[2] for f in found],
                )
                await queue.notify_work(conn)
    return [{"campaign_id": c, "seq": s, "event_type": t} for c, s, t in found]
