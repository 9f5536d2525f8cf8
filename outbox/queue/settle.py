"""The end of a batch, and the campaign queue kept in line with the work rows.

`settle()` ends a batch in one call (the server-side `outbox_settle`): the append heads of
campaigns the batch emptied held, completed rows deleted, failures recorded (as the failure
policy decided them), each held campaign's row rewritten (as the walk decided it), and the
moved checkpoints written. It is the one statement that writes a checkpoint's value.
`refresh_campaigns()` brings campaign rows back in line for paths that change work rows without
a claim (requeue, reconcile, replay, inline apply, lease ends). Nothing here decides a policy:
what to delete, what delay, when dead or what a campaign row becomes all come in as arguments.
Every function runs on the caller's connection, inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING

import orjson

from outbox import buckets, db
from outbox.model import Failure, Key
from outbox.queries import Queries, current_schema
from outbox.queue.claim import lock_heads
from outbox.queue.holds import HoldKey, HoldWrite

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "CampaignWrite",
    "Settled",
    "applied_channel",
    "defer",
    "group_channel",
    "notify_work",
    "record_observations",
    "refresh_campaigns",
    "settle",
    "unblock_campaigns",
    "work_channel",
]


def work_channel() -> str:
    """The LISTEN/NOTIFY channel that wakes the install's workers: its payload is the bucket
    that got work ('': look at every bucket), sent by the append function when a campaign gets
    queued work (`call_fn.sql`). Each install's channels carry its schema's name, so two
    installs in one database never wake each other."""
    return f"{current_schema()}.outbox_work"


def group_channel() -> str:
    """The channel that wakes a worker group's workers (S35): its payload is the group whose
    projectors the append gave holds (`call_fn.sql`)."""
    return f"{current_schema()}.outbox_group"


def applied_channel() -> str:
    """The channel that wakes readers waiting for their writes (`wait_applied`), sent when a
    batch (or a lease's end) deleted work rows (the payload, a bucket, is not read)."""
    return f"{current_schema()}.outbox_applied"


class SettleQueries(Queries):
    settle_batch: str
    refresh_campaigns: str
    unblock_campaigns: str
    notify_work: str
    record_observations: str
    defer_campaigns: str
    defer_rows: str


Q = SettleQueries


@dataclass(frozen=True, slots=True)
class CampaignWrite:
    """What a campaign row becomes when a batch settles: its head, blocked flag and due time,
    the earliest of `due_at` and `delay` seconds from the settle's instant (neither: now; a
    row past `seen`, the last seq the claim read, makes it due now and not blocked whatever it
    would be); or, with `gone` (nothing live is left up to `head_seq - 1`), deleted if the
    settle holds the campaign's append head and no row at or past `head_seq` exists by then;
    else kept due now."""

    campaign_id: str
    head_seq: int
    due_at: datetime | None
    blocked: bool
    gone: bool = False
    delay: float | None = None
    seen: int | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """What a settle reports: campaigns left due now (claim again rather than sleep), and the
    seconds each completed row waited since it was enqueued (by the database clock)."""

    due: int = 0
    ages: list[float] = field(default_factory=list)


async def settle(
    conn: Connection,
    *,
    bucket: int | None = None,
    done: Sequence[Key] = (),
    failures: Sequence[Failure] = (),
    campaigns: Sequence[CampaignWrite] = (),
    checkpoints: Sequence[tuple[str, str, int]] = (),
    holds: Sequence[HoldWrite] = (),
    released: Collection[HoldKey] = (),
    projectors: Collection[str] | None = None,
    now: datetime | None = None,
    notify_applied: bool = True,
    group: str | None = None,
    upto: Mapping[tuple[str, str], int] | None = None,
) -> Settled:
    """Delete `done`, record `failures`, place `holds` and delete the `released` ones, write
    `campaigns` and move `checkpoints` (campaign, projector, applied_seq; sorted) in one call
    per bucket: `bucket`, when the caller knows every campaign is in it (a worker's batch; one
    call for a batch across buckets, `buckets.SPAN`), else each campaign's, worked out here
    once. The rows a placed or released hold stands for
    (and that stay) take their columns from their holds. With `notify_applied` and rows
    deleted, wake the readers waiting for their writes (inline apply needs not: its append
    has not returned yet). `projectors`: those the batch knew (ran, or left holds for); a
    projector the database records beyond them fails the call (`db.PROJECTORS_CHANGED`,
    transient); `group`: the batch's worker group, whose recorded projectors alone it must
    know (S35). `upto`: a worker group's batch, (campaign, projector) -> the checkpoint it left
    for each released hold, which goes only when nothing is journaled past it (else it stays,
    due now)."""
    if not (done or failures or campaigns or checkpoints or holds or released):
        return Settled()
    parts: dict[int, _Part] = {}
    where = await buckets.locator(conn, bucket, span=True)
    for key in done:
        parts.setdefault(where(key[0]), _Part()).done.append({"campaign_id": key[0], "seq": key[1]})
    for f in failures:
        parts.setdefault(where(f.campaign_id), _Part()).failed.append(
            {
                "campaign_id": f.campaign_id,
                "seq": f.seq,
                "attempts": f.attempts,
                "delay": f.delay,
                "error": f.error,
                "dead": f.dead,
            }
        )
    for c in campaigns:
        parts.setdefault(where(c.campaign_id), _Part()).campaigns.append(
            {
                "campaign_id": c.campaign_id,
                "head_seq": c.head_seq,
                "due_at": c.due_at,
                "delay": c.delay,
                "seen": c.seen,
                "blocked": c.blocked,
                "gone": c.gone,
            }
        )
    finished = set(done)
    touched: set[Key] = set()
    for h in holds:
        part = parts.setdefault(where(h.campaign_id), _Part())
        part.holds.append(
            {
                "campaign_id": h.campaign_id,
                "projector": h.projector,
                "seq": h.seq,
                "status": h.status,
                "attempts": h.attempts,
                "delay": h.delay,
                "error": h.error,
                "event_type": h.event_type,
                **({} if h.from_seq is None else {"from": h.from_seq}),
            }
        )
        if h.row:
            touched.add((h.campaign_id, h.seq))
    for cid, projector, seq in sorted(released):
        left = None if upto is None else upto.get((cid, projector))
        parts.setdefault(where(cid), _Part()).released.append(
            {"campaign_id": cid, "projector": projector, "seq": seq}
            | ({} if left is None else {"upto": left})
        )
        if seq:
            touched.add((cid, seq))
    for cid, seq in sorted(touched - finished):
        parts.setdefault(where(cid), _Part()).touched.append({"campaign_id": cid, "seq": seq})
    for campaign_id, projector, seq in checkpoints:
        parts.setdefault(where(campaign_id), _Part()).checkpoints.append(
            {"campaign_id": campaign_id, "projector": projector, "applied_seq": seq}
        )
    due, ages = 0, list[float]()
    channel = applied_channel()
    for in_bucket, part in sorted(parts.items()):
        document = orjson.dumps(
            {
                "done": part.done,
                "failed": part.failed,
                "campaigns": part.campaigns,
                "checkpoints": part.checkpoints,
                "holds": part.holds,
                "released": part.released,
                "touched": part.touched,
                **({} if projectors is None else {"projectors": sorted(projectors)}),
                **({} if group is None else {"group": group}),
                "now": now,
                "notify": notify_applied,
                "channel": channel,
            }
        ).decode()
        row = await conn.fetchrow(Q.settle_batch, in_bucket, document)
        if row is not None:  # the statement always returns one row
            due += row["due"]
            ages += row["ages"] or ()
    return Settled(due, ages)


@dataclass(slots=True)
class _Part:
    """One bucket's share of a settle, as the settle function's document holds it."""

    done: list[dict[str, object]] = field(default_factory=list)
    failed: list[dict[str, object]] = field(default_factory=list)
    campaigns: list[dict[str, object]] = field(default_factory=list)
    checkpoints: list[dict[str, object]] = field(default_factory=list)
    holds: list[dict[str, object]] = field(default_factory=list)
    released: list[dict[str, object]] = field(default_factory=list)
    touched: list[dict[str, object]] = field(default_factory=list)


async def refresh_campaigns(
    conn: Connection,
    campaigns: Sequence[str],
    *,
    park: bool,
    removable: Collection[str] | None = None,
) -> None:
    """Bring the campaign rows of `campaigns` in line with their work rows, for paths that
    change rows without a claim (requeue, reconcile, replay, inline apply). A campaign left
    with nothing live is deleted when its append head is in `removable` (held with
    `lock_heads`); None: lock the heads here. Paths that only make rows live pass `()`: they
    never need the head lock. Waits for a batch that holds one of them. One statement per
    bucket."""
    if not campaigns:
        return
    if removable is None:
        removable = await lock_heads(conn, campaigns)
    held = set(removable)
    for bucket, group in (await buckets.grouped(conn, sorted(set(campaigns)), str)).items():
        gone = [c for c in group if c in held]
        await conn.execute(Q.refresh_campaigns, group, park, gone, bucket)


async def unblock_campaigns(executor: Executor) -> int:
    """dead_policy=park: no campaign is blocked; returns how many were marked."""
    async with db.acquire(executor) as conn:
        return db.affected(await conn.execute(Q.unblock_campaigns))


async def notify_work(
    conn: Connection, channel: str | None = None, *, bucket: int | None = None
) -> None:
    """Wake the workers now (naming `bucket`, like an append's NOTIFY; None: every bucket),
    or those listening on `channel`."""
    target = channel if channel is not None else work_channel()
    await conn.execute(Q.notify_work, target, "" if bucket is None else str(bucket))


async def record_observations(
    conn: Connection,
    keys: Sequence[Key],
    *,
    look_again_in: float,
    now: datetime | None = None,
    bucket: int | None = None,
) -> None:
    """A shadow sighting of each row: counts and timestamps, next look in `look_again_in` s
    (`bucket`: the batch's, when every row is in it)."""
    by_bucket = await buckets.grouped(conn, keys, itemgetter(0), bucket=bucket)
    for in_bucket, group in by_bucket.items():
        await conn.execute(
            Q.record_observations,
            [k[0] for k in group],
            [k[1] for k in group],
            look_again_in,
            now,
            in_bucket,
        )


async def defer(
    conn: Connection,
    *,
    campaigns: Sequence[str] = (),
    rows: Sequence[Key] = (),
    seconds: float,
    bucket: int | None = None,
) -> None:
    """Make held campaigns (ordering `campaign`) or claimed rows (ordering `none`) due again in
    `seconds` by the database clock, consuming no attempt: what waits for a paused projector.
    `bucket`: the batch's, when every campaign is in it."""
    held = await buckets.grouped(conn, sorted(campaigns), str, bucket=bucket)
    for in_bucket, group in held.items():
        await conn.execute(Q.defer_campaigns, group, seconds, in_bucket)
    claimed = await buckets.grouped(conn, sorted(rows), itemgetter(0), bucket=bucket)
    for in_bucket, keys in claimed.items():
        await conn.execute(
            Q.defer_rows, [k[0] for k in keys], [k[1] for k in keys], seconds, in_bucket
        )
