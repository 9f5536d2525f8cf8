"""The work queue (`projection_apply_outbox`): every statement on the outbox table lives here.

Claiming, completing and failing rows, each one statement from arrays. It never runs projectors
and decides no policy (which rows to walk, what delay, when dead): the worker does, and passes
the results in. Every function runs on the caller's connection, inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    "ClaimedRow",
    "Failure",
    "claim",
    "claim_one",
    "delete_rows",
    "lock_campaign_rows",
    "next_due_in",
    "notify_work",
    "outstanding_upto",
    "record_failures",
    "record_observations",
    "wait_applied",
]


class QueueQueries(Queries, file="queue.sql"):
    claim_campaign_heads: str
    claim_due_rows: str
    delete_rows: str
    record_failures: str
    next_due_in: str
    outstanding_upto: str
    claim_one: str
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
    due: bool
    event: StoredEvent | None
    unavailable: EventUnavailable | None = None

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
    park: bool,
    now: datetime | None = None,
) -> list[ClaimedRow]:
    """Lock up to `limit` due rows (heads and their followers under campaign ordering)."""
    if ordered:
        rows = await conn.fetch(Q.claim_campaign_heads, limit, now, park)
    else:
        rows = await conn.fetch(Q.claim_due_rows, limit, now)
    return [_claimed(r) for r in rows]


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
        r["campaign_id"], r["seq"], r["status"], r["attempt_count"], r["due"], event, unavailable
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


async def lock_campaign_rows(conn: Connection, campaign_id: str) -> int:
    """Hold every queued row of the campaign until the transaction ends; returns how many."""
    locked: int = await conn.fetchval(Q.lock_campaign_rows, campaign_id)
    return locked


async def delete_rows(conn: Connection, keys: Sequence[tuple[str, int]]) -> None:
    if keys:
        await conn.execute(Q.delete_rows, [k[0] for k in keys], [k[1] for k in keys])


async def record_failures(
    conn: Connection, failures: Sequence[Failure], now: datetime | None = None
) -> None:
    if not failures:
        return
    await conn.execute(
        Q.record_failures,
        [f.campaign_id for f in failures],
        [f.seq for f in failures],
        [f.attempts for f in failures],
        [f.delay for f in failures],
        [f.error for f in failures],
        now,
        [f.dead for f in failures],
    )


async def next_due_in(executor: Executor, *, ordered: bool, park: bool) -> float | None:
    """Seconds until the next claimable row is due (negative: already due); None: none waits."""
    async with db.acquire(executor) as conn:
        value: float | None = await conn.fetchval(Q.next_due_in, park, not ordered)
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
