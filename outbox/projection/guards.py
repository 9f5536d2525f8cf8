"""The exactly-once guards' statements: checkpoints of ordered projectors and processed markers
of idempotent ones, each read or written for a whole group of events in one statement.

`lock_checkpoints` locks a group's checkpoints (creating missing rows when the caller does not
hold the campaigns), `reserve_markers` reserves a group's markers, `open_group`/`undo_group` are
the savepoint a careful group runs in; `applied_events` says which events count as applied
(the shadow worker, reconcile). Dispatch of events to projectors is `outbox.projection.dispatch`;
every checkpoint move is written by the batch's settle (`outbox.queue.settle`). This module owns
every other statement on `projection_checkpoints` and `processed_markers` (reads, a rebuild's
marker reset, pruning) and never opens a transaction of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from outbox import buckets, db
from outbox.model import Key, Unsubscribed
from outbox.projection.registry import Registry
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = [
    "CheckpointKey",
    "ProjectorLag",
    "applied_events",
    "checkpoints_of",
    "delete_markers",
    "lock_checkpoints",
    "open_group",
    "projector_lag",
    "prune_markers",
    "reserve_markers",
    "undo_group",
]


class GuardsQueries(Queries):
    lock_checkpoints: str
    create_checkpoints: str
    open_group: str
    undo_group: str
    reserve_markers: str
    list_checkpoints: str
    list_markers: str
    delete_markers: str
    prune_markers: str
    get_projector_lag: str


Q = GuardsQueries

CheckpointKey = tuple[str, str]  # (campaign_id, projector)


async def lock_checkpoints(
    conn: Connection,
    campaigns: Sequence[str],
    projectors: Sequence[str],
    *,
    held: bool,
    bucket: int | None = None,
) -> dict[CheckpointKey, int]:
    """Lock and read the checkpoints of `projectors` in `campaigns` (sorted: a fixed lock
    order), in one statement; a missing one reads as 0.

    `held`: the caller holds the campaigns against every other applier (an append's head, a
    campaign row). Otherwise missing rows are created first and locked, so two concurrent
    applications of a campaign's first events cannot both read "missing" and apply them twice
    (two more statements, only then). `bucket`: the batch's, when every campaign is in it."""
    found: dict[CheckpointKey, int] = {}
    by_bucket = await buckets.grouped(conn, campaigns, str, bucket=bucket, span=True)
    for in_bucket, group in by_bucket.items():
        rows = await conn.fetch(Q.lock_checkpoints, group, projectors, in_bucket)
        if not held and len(rows) < len(group) * len(projectors):
            await conn.execute(Q.create_checkpoints, group, projectors, in_bucket)
            rows = await conn.fetch(Q.lock_checkpoints, group, projectors, in_bucket)
        found.update({(r["campaign_id"], r["projector"]): r["applied_seq"] for r in rows})
    return found


async def checkpoints_of(conn: Connection, campaign_id: str) -> dict[str, int]:
    """The checkpoints of one campaign: projector -> applied seq (unlocked; a read)."""
    rows = await conn.fetch(
        Q.list_checkpoints, [campaign_id], await buckets.bucket_for(conn, campaign_id)
    )
    return {r["projector"]: r["applied_seq"] for r in sorted(rows, key=lambda r: r["projector"])}


@dataclass(frozen=True, slots=True)
class ProjectorLag:
    """How far an ordered projector stands behind the journal heads, in events of its own
    types: the campaigns with some behind, those events, the oldest one's age (None: none);
    and the journal's campaigns in all."""

    campaigns_behind: int
    events_behind: int
    oldest_unapplied_seconds: float | None
    campaigns: int


async def projector_lag(conn: Connection, projector: str, events: Iterable[str]) -> ProjectorLag:
    """The lag of ordered `projector`, subscribed to `events` (one statement)."""
    row = await conn.fetchrow(Q.get_projector_lag, projector, sorted(events))
    assert row is not None  # scalar subqueries: one row
    return ProjectorLag(*row)


async def open_group(conn: Connection) -> None:
    """The savepoint a group runs in when a failure must roll it back alone."""
    await conn.execute(Q.open_group)


async def undo_group(conn: Connection) -> None:
    """Roll the group back to its savepoint."""
    await conn.execute(Q.undo_group)


async def applied_events(
    conn: Connection,
    registry: Registry,
    events: Sequence[tuple[str, int, str]],
    *,
    unsubscribed: Unsubscribed = "retry",
    bucket: int | None = None,
) -> set[Key]:
    """Which of `(campaign_id, seq, type)` count as applied: the type is declared ignored (or
    no projector subscribes to it, under `unsubscribed="skip"`), or every projector subscribed
    to it applied the event (checkpoint at or past its seq, or its processed marker).
    Unguarded projectors cannot tell, so their events never count as applied. `bucket`: the
    batch's, when every event is in it."""
    if not events:
        return set()
    checkpoints: dict[CheckpointKey, int] = {}
    markers: set[tuple[str, int, str]] = set()
    by_bucket = await buckets.grouped(conn, events, itemgetter(0), bucket=bucket, span=True)
    for in_bucket, group in by_bucket.items():
        rows = await conn.fetch(Q.list_checkpoints, sorted({e[0] for e in group}), in_bucket)
        checkpoints.update({(r["campaign_id"], r["projector"]): r["applied_seq"] for r in rows})
        rows = await conn.fetch(
            Q.list_markers, [e[0] for e in group], [e[1] for e in group], in_bucket
        )
        markers.update((r["campaign_id"], r["seq"], r["handler"]) for r in rows)
    applied = set()
    for campaign_id, seq, event_type in events:
        subscribed = registry.subscribers(event_type)
        if not subscribed:
            if event_type in registry.ignored or unsubscribed == "skip":
                applied.add((campaign_id, seq))
            continue
        if all(
            checkpoints.get((campaign_id, p.name), 0) >= seq
            if p.ordered
            else p.idempotent and (campaign_id, seq, p.name) in markers
            for p in subscribed
        ):
            applied.add((campaign_id, seq))
    return applied


async def reserve_markers(
    conn: Connection, wanted: Sequence[tuple[str, int, str]], *, bucket: int | None = None
) -> set[tuple[str, int, str]]:
    """Reserve the processed markers (campaign_id, seq, handler) in one statement per bucket
    (`bucket`: the batch's, when every marker is in it); returns the ones reserved now (the
    others were applied before)."""
    reserved: set[tuple[str, int, str]] = set()
    by_bucket = await buckets.grouped(conn, wanted, itemgetter(0), bucket=bucket, span=True)
    for in_bucket, group in by_bucket.items():
        rows = await conn.fetch(
            Q.reserve_markers,
            [w[0] for w in group],
            [w[1] for w in group],
            [w[2] for w in group],
            in_bucket,
        )
        reserved.update((r["campaign_id"], r["seq"], r["handler"]) for r in rows)
    return reserved


async def delete_markers(conn: Connection, campaign_id: str, projector: str) -> None:
    """Forget what an idempotent projector applied in a campaign (a rebuild starts over)."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    await conn.execute(Q.delete_markers, campaign_id, projector, bucket)


async def prune_markers(
    conn: Connection, *, retention_hours: int, batch_size: int, keep: Sequence[str] = ()
) -> int:
    """Delete markers older than `retention_hours`, `batch_size` per statement, but none of
    the projectors `keep` (those catching up from the journal: their markers say what the rows
    gave them, S25); how many."""
    return await db.prune(conn, Q.prune_markers, list(keep), retention_hours, batch=batch_size)
