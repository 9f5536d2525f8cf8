"""Enqueue-gap repair: journal events that have no work row and are not applied yet.

Events appended while enqueueing was off, or whose rows were deleted by hand, get a work row,
unless they count as applied (`projectors.applied_events`: every subscribed projector applied
them, or their type is declared ignored). A type this app does not know is enqueued: the worker
fails it visibly rather than anyone dropping it (S8). Keys are `(campaign_id, seq)`
throughout, never a global position, and running it twice enqueues nothing the second time.
Work rows that have no campaign in the campaign queue (inserted with triggers off) get one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outbox import db, queue
from outbox.apply import applied_events
from outbox.queries import Queries
from outbox.registry import Registry

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["reconcile"]

PAGE = 1000


class ReconcileQueries(Queries, file="reconcile.sql"):
    unqueued_events: str
    enqueue_rows: str
    unqueued_campaigns: str


Q = ReconcileQueries


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
            keys = [(r["campaign_id"], r["seq"], r["event_type"]) for r in page]
            done = await applied_events(conn, registry, keys)
            found += [k for k in keys if k[:2] not in done]
        found = found[:limit]
        if not dry_run:
            orphans = [r[0] for r in await conn.fetch(Q.unqueued_campaigns, campaign_id)]
            if orphans:
                async with conn.transaction():
                    await queue.refresh_campaigns(conn, orphans, park=True, removable=())
                    await queue.notify_work(conn)
        if found and not dry_run:
            async with conn.transaction():
                await conn.execute(
                    Q.enqueue_rows,
                    [f[0] for f in found],
                    [f[1] for f in found],
                    [f[2] for f in found],
                )
                # A row enqueued before a campaign's head moves the head back (the insert
                # trigger only creates missing campaign rows). Never blocked: see requeue.
                await queue.refresh_campaigns(
                    conn, sorted({f[0] for f in found}), park=True, removable=()
                )
                await queue.notify_work(conn)
    return [{"campaign_id": c, "seq": s, "event_type": t} for c, s, t in found]
