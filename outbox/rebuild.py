"""Projection rebuild (S19), the final repair path: reset a projector's projection of one
campaign and re-apply its journal in seq order.

One transaction per campaign holds the campaign's queued rows (so no worker interleaves) and
resets the projector's checkpoint or markers, then replays the journal up to the head it read,
in chunks (a batch projector gets each chunk in one call). It never touches other projectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox import db, queue
from outbox.apply import Q as GuardQueries
from outbox.errors import ConfigError
from outbox.journal import StoredEvent, decode_record
from outbox.queries import Queries
from outbox.registry import Projector, Registry

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = ["campaigns_to_rebuild", "rebuild_campaign", "rebuildable"]

CHUNK = 500


class RebuildQueries(Queries, file="rebuild.sql"):
    list_campaigns: str
    reset_checkpoint: str
    set_checkpoint: str
    delete_markers: str
    journal_for_rebuild: str


Q = RebuildQueries


def rebuildable(registry: Registry, name: str) -> Projector:
    """The projector to rebuild, or a ConfigError saying why it cannot be."""
    projector = registry.projectors.get(name)
    if projector is None:
        known = ", ".join(sorted(registry.projectors)) or "none"
        raise ConfigError(f"no projector named {name!r} (registered: {known})")
    if projector.reset is None:
        raise ConfigError(
            f"projector {name!r} has no reset hook: register it with reset= to rebuild it"
        )
    if not projector.ordered and not projector.idempotent:
        raise ConfigError(
            f"projector {name!r} has no guard (neither ordered nor idempotent): a rebuild "
            "beside running workers could apply an event twice"
        )
    return projector


async def campaigns_to_rebuild(executor: Executor, campaign_id: str | None) -> list[str]:
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.list_campaigns, campaign_id)
    return [r["campaign_id"] for r in rows]


async def _replay(conn: Connection, projector: Projector, events: list[StoredEvent]) -> None:
    if projector.idempotent and not projector.ordered:
        await conn.fetch(
            GuardQueries.reserve_markers,
            [e.campaign_id for e in events],
            [e.seq for e in events],
            [projector.name] * len(events),
        )
    await projector.run(conn, events)


async def rebuild_campaign(executor: Executor, projector: Projector, campaign_id: str) -> int:
    """Reset one campaign's projection and re-apply its journal in seq order, in one
    transaction that holds the campaign's queued rows and the projector's checkpoint, so a
    running worker neither interleaves nor applies twice (S19). Returns events applied."""
    reset = projector.reset
    if reset is None:
        raise ConfigError(f"projector {projector.name!r} has no reset hook")
    applied = 0
    async with db.acquire(executor) as conn, conn.transaction():
        await queue.lock_campaign_rows(conn, campaign_id)
        if projector.ordered:
            await conn.execute(Q.reset_checkpoint, campaign_id, projector.name)
        if projector.idempotent and not projector.ordered:
            await conn.execute(Q.delete_markers, campaign_id, projector.name)
        await reset(conn, campaign_id)
        head = 0
        chunk: list[StoredEvent] = []
        types = sorted(projector.events)
        async for r in conn.cursor(Q.journal_for_rebuild, campaign_id, types, prefetch=CHUNK):
            head = r["last_seq"]
            if r["seq"] is None:
                continue
            chunk.append(decode_record(r, campaign_id))
            if len(chunk) == CHUNK:
                await _replay(conn, projector, chunk)
                applied, chunk = applied + len(chunk), []
        if chunk:
            await _replay(conn, projector, chunk)
            applied += len(chunk)
        if projector.ordered:
            await conn.execute(Q.set_checkpoint, campaign_id, projector.name, head)
    return applied
