"""Enqueue-gap repair: journal events that have no work row and are not applied yet.

Events appended while enqueueing was off, or whose rows were deleted by hand, get a work row,
unless they count as applied (`guards.applied_events`: every subscribed projector applied
them, or their type is declared ignored). A type this app does not know is enqueued: the worker
fails it visibly rather than anyone dropping it. Keys are `(campaign_id, seq)` throughout,
never a global position, and running it twice enqueues nothing the second time. Work rows that
have no campaign in the campaign queue (written around the append: by hand, by a tool, a
restore) get one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import db
from outbox.projection.guards import applied_events
from outbox.projection.registry import Registry
from outbox.queue import repair
from outbox.queue.settle import notify_work, refresh_campaigns

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["Reconciled", "UnqueuedEvent", "reconcile"]

PAGE = 1000


@dataclass(frozen=True, slots=True)
class UnqueuedEvent:
    campaign_id: str
    seq: int
    event_type: str


@dataclass(frozen=True, slots=True)
class Reconciled:
    """How many events matched, how many were enqueued (0 in a dry run), and which."""

    limit: int
    dry_run: bool
    matched: int
    enqueued: int
    rows: list[UnqueuedEvent]


async def reconcile(
    executor: Executor,
    registry: Registry,
    *,
    campaign_id: str | None = None,
    limit: int = 1000,
    dry_run: bool = False,
) -> Reconciled:
    """Enqueue up to `limit` missing work rows (none with `dry_run`)."""
    found: list[tuple[str, int, str]] = []
    cursor = repair.START
    async with db.acquire(executor) as conn:
        while len(found) < limit:
            page, cursor = await repair.list_unqueued_events(conn, campaign_id, cursor, PAGE)
            if not page:
                break
            done = await applied_events(conn, registry, page)
            found += [k for k in page if k[:2] not in done]
        found = found[:limit]
        if not dry_run:
            orphans = await repair.list_unqueued_campaigns(conn, campaign_id)
            if orphans:
                async with conn.transaction():
                    await refresh_campaigns(conn, orphans, park=True, removable=())
                    await notify_work(conn)
        if found and not dry_run:
            async with conn.transaction():
                await repair.enqueue(conn, found)
                await notify_work(conn)
    rows = [UnqueuedEvent(*f) for f in found]
    return Reconciled(limit, dry_run, len(rows), 0 if dry_run else len(rows), rows)
