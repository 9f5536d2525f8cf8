"""The work queue: every statement on the work rows (`projection_apply_outbox`) and the campaign
queue that indexes them (`projection_apply_campaigns`, sql/0003_campaign_queue.sql) lives here.

Claiming, and settling a batch (deletes, failures, campaign rows) in one statement from arrays.
It never runs projectors and decides no policy (which rows to walk, what delay, when dead, what
a campaign row becomes): the worker does, and passes the results in. Paths that change rows
without a claim call `refresh_campaigns`. Every function runs on the caller's connection,
inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
import asyncpg

from outbox import db
from outbox.errors import Conflict, EventUnavailable, NotFound
from outbox.journal import WORK_CHANNEL, StoredEvent, decode_record
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "CampaignWrite",
    "ClaimedCampaign",
    "ClaimedRow",
    "Failure",
    "Settled",
    "claim",
    "claim_one",
    "delete_rows",
    "hold_campaign",
    "lock_campaign_rows",
    "lock_heads",
    "next_due_in",
    "notify_work",
    "outstanding_upto",
    "record_observations",
    "refresh_campaigns",
    "settle",
    "unblock_campaigns",
    "wait_applied",
]


class QueueQueries(Queries, file="queue.sql"):
    claim_campaigns: str
    load_campaigns: str
    claim_due_rows: str
    delete_rows: str
    lock_heads: str
    settle: str
    refresh_campaigns: str
    unblock_campaigns: str
    next_due_in: str
    outstanding_upto: str
    claim_one: str
    hold_campaign: str
    lock_campaign_rows: str
    notify_work: str
    record_observations: str


Q = QueueQueries


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """A locked work row; `event` is None when its journal row is missing or undecodable, and
    `unavailable` then says why (raised as that row's failure, S8)."""

    campaign_id: str
    seq: int
    status: str
    attempt_count: int
    next_attempt_at: datetime
    due: bool
    event: StoredEvent | None
    unavailable: EventUnavailable | None = None
    lease_owner: str | None = None  # lease mode: who last claimed it, and that claim's epoch
    claim_epoch: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.campaign_id, self.seq)

    def stored_event(self) -> StoredEvent:
        """The event, or the row's EventUnavailable."""
        if self.event is None:
            raise self.unavailable or EventUnavailable(
                f"journal event {self.campaign_id!r} seq {self.seq} is missing"
            )
        return self.event


@dataclass(frozen=True, slots=True)
class ClaimedCampaign:
    """A campaign an ordered claim holds: its rows from the head (as far as the budget went)
    and its first and last outstanding seq (None: no row is left)."""

    campaign_id: str
    rows: list[ClaimedRow]
    first_seq: int | None
    last_seq: int | None
    checkpoints: dict[str, int]  # ordered projector -> applied_seq (missing: 0), locked


@dataclass(frozen=True, slots=True)
class CampaignWrite:
    """What a campaign row becomes when a batch settles: its head, blocked flag and due time
    (None: the failure's next attempt when the head failed in this batch, else now); or, with
    `gone` (nothing live is left up to `head_seq - 1` and the append head is held), deleted
    unless a row at or past `head_seq` exists by then, in which case it is kept due now."""

    campaign_id: str
    head_seq: int
    due_at: datetime | None
    blocked: bool
    gone: bool = False


@dataclass(frozen=True, slots=True)
class Failure:
    campaign_id: str
    seq: int
    attempts: int
    delay: float
    error: str
    dead: bool


async def claim(
    conn: Connection,
    *,
    limit: int,
    ordered: bool,
    campaigns: int | None = None,
    projectors: Sequence[str] = (),
    now: datetime | None = None,
) -> list[ClaimedCampaign]:
    """Lock up to `limit` rows: under campaign ordering, due campaigns (one statement), then
    the rows from their heads (the campaign's rows are the holder's alone) and the checkpoints
    of the ordered `projectors` (a second statement, whose snapshot sees every commit of the
    campaigns' previous holders); else due rows, each locked, one pseudo-campaign per row's
    campaign (no checkpoints read). Campaigns sorted by id, rows by seq. `campaigns`: how many
    campaigns an ordered claim takes at most (default `limit`), the rows shared among them."""
    if ordered:
        held = await conn.fetch(Q.claim_campaigns, min(campaigns or limit, limit), now)
        if not held:
            return []
        per = -(-limit // len(held))  # the budget shared among them, rounded up
        records = await conn.fetch(
            Q.load_campaigns,
            [r["campaign_id"] for r in held],
            [r["head_seq"] for r in held],
            per,
            now,
            list(projectors),
        )
    else:
        records = await conn.fetch(Q.claim_due_rows, limit, now)
    claimed: list[ClaimedCampaign] = []
    for r in records:
        if not claimed or claimed[-1].campaign_id != r["campaign_id"]:
            checkpoints = dict(zip(r["projectors"] or (), r["applied_seqs"] or (), strict=True))
            claimed.append(
                ClaimedCampaign(r["campaign_id"], [], r["first_seq"], r["last_seq"], checkpoints)
            )
        if r["seq"] is not None:
            claimed[-1].rows.append(_claimed(r))
    return claimed


def _claimed(r: asyncpg.Record) -> ClaimedRow:
    event: StoredEvent | None = None
    unavailable: EventUnavailable | None = None
    if r["event_type"] is None:
        unavailable = EventUnavailable(
            f"journal event {r['campaign_id']!r} seq {r['seq']} is missing"
        )
    else:
        try:
            event = decode_record(r)
        except EventUnavailable as exc:
            unavailable = exc
    return ClaimedRow(
        r["campaign_id"],
        r["seq"],
        r["status"],
        r["attempt_count"],
        r["next_attempt_at"],
        r["due"],
        event,
        unavailable,
        r["lease_owner"],
        r["claim_epoch"],
    )


async def claim_one(
    conn: Connection, campaign_id: str, seq: int, *, park: bool
) -> tuple[ClaimedRow, int | None]:
    """Lock one row for an operator without waiting, with the seq of the earliest earlier
    outstanding row of its campaign (None: it is the head). NotFound when there is no such row,
    Conflict when a running batch holds it."""
    try:
        r = await conn.fetchrow(Q.claim_one, campaign_id, seq, park)
    except asyncpg.LockNotAvailableError:
        raise Conflict(
            f"row {campaign_id!r} seq {seq} is held by a running batch; try again"
        ) from None
    if r is None:
        raise NotFound(f"no queued row {campaign_id!r} seq {seq}")
    return _claimed(r), r["blocked_by"]


async def record_observations(
    conn: Connection,
    keys: Sequence[tuple[str, int]],
    *,
    look_again_in: float,
    now: datetime | None = None,
) -> None:
    """A shadow sighting of each row: counts and timestamps, next look in `look_again_in` s."""
    if keys:
        await conn.execute(
            Q.record_observations, [k[0] for k in keys], [k[1] for k in keys], look_again_in, now
        )


async def notify_work(conn: Connection) -> None:
    """Wake the workers now (payload-free, like an append's NOTIFY)."""
    await conn.execute(Q.notify_work, WORK_CHANNEL)


async def hold_campaign(conn: Connection, campaign_id: str) -> None:
    """Lock the campaign's queue row until the transaction ends (first, as a batch does)."""
    await conn.execute(Q.hold_campaign, campaign_id)


async def lock_campaign_rows(conn: Connection, campaign_id: str) -> int:
    """Hold the campaign and every queued row of it until the transaction ends; returns how
    many rows."""
    locked: int = await conn.fetchval(Q.lock_campaign_rows, campaign_id)
    return locked


async def delete_rows(conn: Connection, keys: Sequence[tuple[str, int]]) -> None:
    if keys:
        await conn.execute(Q.delete_rows, [k[0] for k in keys], [k[1] for k in keys])


async def lock_heads(conn: Connection, campaigns: Sequence[str]) -> set[str]:
    """Hold the append heads of `campaigns` (no append of them runs until commit), skipping
    the ones an append holds now; returns the campaigns held. A campaign row may be deleted
    only while its head is held."""
    if not campaigns:
        return set()
    rows = await conn.fetch(Q.lock_heads, sorted(campaigns))
    return {r["campaign_id"] for r in rows}


@dataclass(frozen=True, slots=True)
class Settled:
    """What a settle reports: campaigns left due now (claim again rather than sleep), and the
    seconds each completed row waited since it was enqueued (by the database clock)."""

    due: int = 0
    ages: list[float] = field(default_factory=list)


async def settle(
    conn: Connection,
    *,
    done: Sequence[tuple[str, int]] = (),
    failures: Sequence[Failure] = (),
    campaigns: Sequence[CampaignWrite] = (),
    checkpoints: Sequence[tuple[str, str, int]] = (),
    now: datetime | None = None,
) -> Settled:
    """Delete `done`, record `failures`, write `campaigns` and move `checkpoints` (campaign,
    projector, applied_seq; sorted) in one statement."""
    if not (done or failures or campaigns or checkpoints):
        return Settled()
    row = await conn.fetchrow(
        Q.settle,
        [k[0] for k in done],
        [k[1] for k in done],
        [f.campaign_id for f in failures],
        [f.seq for f in failures],
        [f.attempts for f in failures],
        [f.delay for f in failures],
        [f.error for f in failures],
        [f.dead for f in failures],
        now,
        [c.campaign_id for c in campaigns],
        [c.head_seq for c in campaigns],
        [c.due_at for c in campaigns],
        [c.blocked for c in campaigns],
        [c.gone for c in campaigns],
        [k[0] for k in checkpoints],
        [k[1] for k in checkpoints],
        [k[2] for k in checkpoints],
    )
    if row is None:  # pragma: no cover - the statement always returns one row
        return Settled()
    return Settled(row["due"], list(row["ages"] or ()))


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
    never need the head lock. Waits for a batch that holds one of them."""
    if not campaigns:
        return
    if removable is None:
        removable = await lock_heads(conn, campaigns)
    await conn.execute(Q.refresh_campaigns, sorted(set(campaigns)), park, sorted(removable))


async def unblock_campaigns(executor: Executor) -> int:
    """dead_policy=park: no campaign is blocked; returns how many were marked."""
    async with db.acquire(executor) as conn:
        status: str = await conn.execute(Q.unblock_campaigns)
    return int(status.rsplit(" ", 1)[-1])


async def next_due_in(executor: Executor, *, ordered: bool) -> float | None:
    """Seconds until the next claimable work is due (negative: already due); None: none
    waits."""
    async with db.acquire(executor) as conn:
        value: float | None = await conn.fetchval(Q.next_due_in, not ordered)
    return value


async def outstanding_upto(conn: Connection, campaign_id: str, seq: int) -> bool:
    """Whether a work row of the campaign at or below `seq` is still outstanding."""
    found: bool = await conn.fetchval(Q.outstanding_upto, campaign_id, seq)
    return found


async def wait_applied(
    executor: Executor,
    campaign_id: str,
    seq: int,
    timeout: float,  # noqa: ASYNC109 - the public signature takes a timeout (S20)
) -> bool:
    """Read-your-writes (S20): wait until `campaign_id`'s events up to `seq` are applied (no work
    row at or below `seq` is left). True when applied, False when `timeout` seconds ran out
    (a dead row never gets applied: its campaign waits for an operator)."""
    delay = 0.005
    with anyio.move_on_after(timeout):
        while True:
            async with db.acquire(executor) as conn:
                if not await outstanding_upto(conn, campaign_id, seq):
                    return True
            await anyio.sleep(delay)  # deletions send no notification: poll, gently
            delay = min(delay * 2, 0.25)
    return False
