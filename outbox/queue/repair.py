"""Repair statements of the work queue: dead rows back to pending or discarded, failed rows
due now (a retry), each with its audit, the audit's reads, and work rows for journal events that
never got one.

Requeues keep history: the row gets a fresh attempt budget, and an insert-only audit row keeps
what it was (status, attempts, last error, when), who did it and why. A retry keeps the
attempts too: only when the row (and its failed holds) is next tried changes. Which rows an operator
means, in what chunks, and whether an event counts as applied are the callers' (`outbox.ops`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Literal

from outbox import buckets, db
from outbox.queries import Queries
from outbox.queue.holds import RowHold, refresh_held_rows
from outbox.queue.settle import refresh_campaigns

if TYPE_CHECKING:
    from outbox.db import Connection, Record

__all__ = [
    "START",
    "AuditEntry",
    "Cursor",
    "DeadRow",
    "audit_hold_discard",
    "database_time",
    "discard_dead_row",
    "enqueue",
    "list_audit",
    "list_unqueued_campaigns",
    "list_unqueued_events",
    "repair",
]

# What a repair does: `requeue` dead rows (fresh attempts) or `retry` failed ones (due now).
Action = Literal["requeue", "retry"]
_STATUS: dict[Action, str] = {"requeue": "dead", "retry": "failed"}


class RepairQueries(Queries):
    list_repair_rows: str
    get_database_time: str
    repair_rows: str
    repair_holds: str
    repair_group_holds: str
    list_repair_group_holds: str
    insert_requeue_audit: str
    list_unqueued_events: str
    lock_heads_exclusively: str
    hold_campaigns: str
    insert_work_rows: str
    list_unqueued_campaigns: str
    list_audit: str
    discard_dead_row: str


Q = RepairQueries


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A dead row as it was before a repair: requeued (or, in a dry run, one that would be) or
    discarded."""

    campaign_id: str
    seq: int
    event_type: str
    attempt_count: int
    last_error: str | None
    next_attempt_at: datetime


async def repair(
    conn: Connection,
    action: Action,
    *,
    limit: int,
    campaign_id: str | None = None,
    event_type: str | None = None,
    fingerprint: str | None = None,
    one: tuple[str, int] | None = None,
    projector: str | None = None,
    dry_run: bool = False,
    actor: str,
    reason: str | None,
    died_by: datetime | None = None,
) -> list[DeadRow]:
    """Up to `limit` rows (or the one row `one`), oldest first, each with its audit row; rows
    other transactions hold are skipped. `requeue`: dead rows back to pending with a fresh
    attempt budget; `retry`: failed rows due now, their attempts kept. `fingerprint`: only rows
    of that error group (`inspect.failure_groups`). `projector`: only rows it is dead (failed)
    on, and only its holds move (S24; None: every holder's). `died_by`: only rows that took
    their status by then (a preview's `database_time`). `dry_run`: change nothing."""
    status = _STATUS[action]
    named = one[0] if one else campaign_id
    arguments = (
        limit,
        campaign_id,
        event_type,
        one[0] if one else None,
        one[1] if one else None,
        fingerprint,
        await buckets.filter_bucket(conn, named),
        projector,
        died_by,
        status,
    )
    listed = await conn.fetch(Q.list_repair_rows, *arguments)
    listed += await conn.fetch(Q.list_repair_group_holds, *arguments)  # S35: no work row
    listed = sorted(listed, key=itemgetter("next_attempt_at", "seq"))[:limit]
    if dry_run:
        return [_dead(r) for r in listed]
    rows: list[db.Record] = []
    held: list[db.Record] = []  # work rows, whose campaigns' rows are refreshed
    # The locking statement stays in one bucket: one per bucket the listed rows are in.
    by_bucket = itemgetter("bucket")
    for bucket, part in itertools.groupby(sorted(listed, key=by_bucket), key=by_bucket):
        keys = list(part)
        grouped = [k for k in keys if k["grouped"]]  # a worker group's holds (S35): no row
        if grouped:
            rows += await conn.fetch(
                Q.repair_group_holds,
                bucket,
                [k["campaign_id"] for k in grouped],
                [k["seq"] for k in grouped],
                projector,
                status,
            )
            keys = [k for k in keys if not k["grouped"]]
        moved = await conn.fetch(
            Q.repair_rows,
            bucket,
            [k["campaign_id"] for k in keys],
            [k["seq"] for k in keys],
            status,
        )
        cids, seqs = [r["campaign_id"] for r in moved], [r["seq"] for r in moved]
        await conn.execute(Q.repair_holds, bucket, cids, seqs, projector, status)
        await refresh_held_rows(conn, bucket, cids, seqs)
        rows += moved
        held += moved
    if rows:
        columns = ("campaign_id", "seq", "status", "attempt_count", "last_error", "next_attempt_at")
        await conn.execute(
            Q.insert_requeue_audit,
            actor,
            reason,
            *([r[c] for r in rows] for c in columns),
            projector,
            None if action == "requeue" else action,
        )
    # Live again: their campaigns are claimable at once. The dead policy is the workers' to
    # know; never marking a campaign blocked is the safe side (a block worker's next claim of
    # it marks it again if a dead row still precedes).
    await refresh_campaigns(conn, sorted({r["campaign_id"] for r in held}), park=True, removable=())
    return sorted(map(_dead, rows), key=attrgetter("next_attempt_at", "seq"))


async def database_time(conn: Connection) -> datetime:
    """The database's clock now."""
    at: datetime = await conn.fetchval(Q.get_database_time)
    return at


def _dead(r: Record) -> DeadRow:
    return DeadRow(
        r["campaign_id"],
        r["seq"],
        r["event_type"],
        r["attempt_count"],
        r["last_error"],
        r["next_attempt_at"],
    )


async def discard_dead_row(
    conn: Connection, campaign_id: str, seq: int, *, actor: str, reason: str
) -> DeadRow | None:
    """Delete one dead row (held by the caller) with its audit row; the row as it was, or None
    when it is not there or not dead. The event stays in the journal."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    r = await conn.fetchrow(Q.discard_dead_row, campaign_id, seq, actor, reason, bucket)
    return None if r is None else DeadRow(*r)


async def audit_hold_discard(
    conn: Connection,
    campaign_id: str,
    holds: Sequence[RowHold],
    *,
    actor: str,
    reason: str,
) -> None:
    """The audit rows of discarded holds of one row (S24), one per projector."""
    for h in holds:
        await conn.execute(
            Q.insert_requeue_audit,
            actor,
            reason,
            [campaign_id],
            [h.seq],
            [h.status],
            [h.attempt_count],
            [h.last_error],
            [h.next_attempt_at],
            h.projector,
            "discard",
        )


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audited action of an operator on a work row, with the row as it was before."""

    action: str
    at: datetime
    campaign_id: str
    seq: int
    actor: str
    reason: str | None
    previous_status: str
    previous_attempt_count: int
    previous_last_error: str | None
    projector: str | None = None  # the projector whose hold it was (S24; None: the row's)
    audit_id: int | None = None

    @property
    def cursor(self) -> str:
        """Where the page after this entry starts (`list_audit`'s `before`)."""
        return f"{self.at.isoformat()}/{self.audit_id}"


async def list_audit(
    conn: Connection,
    campaign_id: str | None,
    *,
    limit: int,
    before: tuple[datetime, int] | None = None,
) -> list[AuditEntry]:
    """The audit, newest first: one campaign or all, at most `limit` entries, older than
    `before` (an entry's time and id) when given."""
    at, audit_id = before if before else (None, None)
    rows = await conn.fetch(Q.list_audit, campaign_id, limit, at, audit_id)
    return [AuditEntry(*r) for r in rows]


Cursor = tuple[int, str, int]  # (bucket, campaign_id, seq): the journal's key order


async def list_unqueued_events(
    conn: Connection, campaign_id: str | None, after: Cursor, limit: int
) -> tuple[list[tuple[str, int, str]], Cursor]:
    """Journal events with no work row after the keyset cursor `after` (start: `START`), one
    campaign or all, in key order: (campaign_id, seq, event_type), and the cursor past them."""
    bucket, after_campaign, after_seq = after
    rows = await conn.fetch(
        Q.list_unqueued_events, campaign_id, after_campaign, after_seq, limit, bucket
    )
    if rows:
        after = (rows[-1]["bucket"], rows[-1]["campaign_id"], rows[-1]["seq"])
    return [(r["campaign_id"], r["seq"], r["event_type"]) for r in rows], after


START: Cursor = (-1, "", 0)


async def list_unqueued_campaigns(conn: Connection, campaign_id: str | None) -> list[str]:
    """Campaigns with live work rows but no campaign row (rows written around the append)."""
    return [r["campaign_id"] for r in await conn.fetch(Q.list_unqueued_campaigns, campaign_id)]


async def enqueue(conn: Connection, events: Sequence[tuple[str, int, str]]) -> None:
    """Work rows for `events` (an existing row wins), their campaigns made claimable."""
    for bucket, group in (await buckets.grouped(conn, events, itemgetter(0))).items():
        campaigns = sorted({e[0] for e in group})
        await conn.execute(Q.lock_heads_exclusively, campaigns, bucket)
        await conn.execute(Q.hold_campaigns, campaigns, bucket)
        await conn.execute(
            Q.insert_work_rows,
            [e[0] for e in group],
            [e[1] for e in group],
            [e[2] for e in group],
            bucket,
        )
    # Queue their campaigns (an existing campaign row moves back to a row enqueued before its
    # head). Never blocked: see requeue_dead.
    await refresh_campaigns(conn, sorted({e[0] for e in events}), park=True, removable=())
