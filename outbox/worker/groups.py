"""A worker group's own pieces (S35): what its batches leave of their holds, how long its
loops wait, and where it may run.

A worker started with `--group NAME` (OUTBOX_GROUP) serves its projectors from their own
queue, their holds, which the append writes (one per campaign that has none, at seq 0,
`from_seq` the first event owed): its batches claim those (`claim.claim_holds`), take each
projector on from its checkpoint through the journal, and settle the holds (`group_holds`)
without touching a work row or a campaign row, which are the default group's. No group of
its own on Citus: a claim there is one shard's statement, and a group's spans every bucket.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio

from outbox import db
from outbox.buckets.ring import due_buckets, spans
from outbox.errors import ConfigError
from outbox.projection.heal import HEAL_EVENTS
from outbox.queries import Queries
from outbox.queue.claim import ClaimedCampaign, claim_holds, group_due_in
from outbox.queue.holds import CATCHING_UP, HoldKey, HoldWrite

if TYPE_CHECKING:
    from datetime import datetime

    from outbox.config import Settings
    from outbox.db import Connection, Pool
    from outbox.projection.app import Outbox
    from outbox.projection.registry import Registry
    from outbox.worker.sql_batch import OneCall, Result
    from outbox.worker.tracks import Tracks

__all__ = [
    "claim",
    "due_in",
    "group_holds",
    "one_call",
    "require_one_server",
    "wait_older_appends",
]

# Seconds between looks for transactions older than a group's engine (`wait_older_appends`).
OLDER_POLL = 0.05


class GroupQueries(Queries):
    get_snapshot_end: str
    get_older_running: str


Q = GroupQueries


def group_holds(
    tracks: Tracks, checkpoints: Mapping[tuple[str, str], int]
) -> tuple[list[HoldWrite], set[HoldKey], dict[tuple[str, str], int]]:
    """A worker group's batch's holds as its queue keeps them (S35): each at seq 0, saying at
    which event it stands (the one a projector failed on); the ones released, each with the
    checkpoint the batch left (`upto`: the settle keeps a hold owed events journaled past it)."""
    holds = [
        replace(
            w,
            seq=CATCHING_UP,
            from_seq=w.seq if w.seq != CATCHING_UP else w.from_seq,
            row=False,
            event_type=None,
        )
        for w in tracks.placed.values()
    ]
    kept = {w.key for w in holds}
    released = {k for k in tracks.released if k not in kept}
    upto = {(cid, name): checkpoints.get((cid, name), 0) for cid, name, _ in released}
    return holds, released, upto


async def due_in(pool: Pool, app: Outbox, *, span: bool, later: bool) -> float | None:
    """Seconds until the next work of `app`'s worker is due (`later`: of work not due yet);
    None: none. A worker group's: its projectors' holds that are not dead; the default
    group's: the buckets' campaigns (or rows; `span`: across buckets)."""
    if app.settings.grouped:
        async with db.acquire(pool) as conn:
            names = app.registry.checkpointed_names()
            return await group_due_in(conn, names, later=later)
    rows = not app.settings.ordered
    found = await due_buckets(pool, rows=rows, span=span, later=later)
    return min((d for _, d in found), default=None)


async def require_one_server(pool: Pool, settings: Settings) -> None:
    """Refuse (ConfigError) a worker group of its own on Citus."""
    if settings.grouped and not await spans(pool):
        raise ConfigError(
            f"worker group {settings.group!r} (OUTBOX_GROUP, --group): groups run on one "
            "server; on Citus every worker serves the default group"
        )


async def wait_older_appends(pool: Pool) -> None:
    """Return once every transaction that began before now has ended: an append that read
    the record before a worker group's new projector was in it wrote no hold for it, and the
    engine that catches the projector up must see its events (S35)."""
    async with db.acquire(pool) as conn:
        end = await conn.fetchval(Q.get_snapshot_end)
        while True:  # no event says a transaction of another session ended: polled
            if not await conn.fetchval(Q.get_older_running, end):
                return
            await anyio.sleep(OLDER_POLL)


async def claim(
    conn: Connection, app: Outbox, registry: Registry, now: datetime | None
) -> list[ClaimedCampaign]:
    """A worker group's claim: the due holds of its projectors that are not paused, each
    campaign with no rows."""
    paused = await app.pauses.projectors(conn, registry)
    names = [n for n in registry.checkpointed_names() if n not in paused]
    if not names:
        return []
    return await claim_holds(conn, projectors=names, limit=app.settings.batch_size, now=now)


async def one_call(
    conn: Connection, plan: OneCall, settings: Settings, now: datetime | None
) -> Result | None:
    """A worker group's batch of SQL projectors in one call (`outbox_apply_sql_holds`): up to
    a batch's worth of holds per projector, each taken on by its share of the journal events a
    batch of the worker's own path would read."""
    budget = max(1, HEAL_EVENTS // settings.batch_size)
    return await plan.run_holds(
        conn, group=settings.group, limit=settings.batch_size, budget=budget, now=now
    )
