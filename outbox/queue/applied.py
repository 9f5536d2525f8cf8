"""Read-your-writes: wait until a campaign's events up to a seq are applied, or say what holds
them (`wait_applied`), and the statements it and inline apply ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

import anyio

from outbox import buckets, db
from outbox.queries import Queries
from outbox.queue.settle import applied_channel

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = ["RECHECK", "Applied", "first_outstanding", "outstanding_upto", "wait_applied"]

# Seconds between looks of a `wait_applied` that listens and hears nothing.
RECHECK = 1.0


class AppliedQueries(Queries):
    get_outstanding_upto: str
    get_first_outstanding: str


Q = AppliedQueries


async def outstanding_upto(conn: Connection, campaign_id: str, seq: int) -> bool:
    """Whether a work row of the campaign at or below `seq` is still outstanding."""
    bucket = await buckets.bucket_for(conn, campaign_id)
    found: bool = await conn.fetchval(Q.get_outstanding_upto, campaign_id, seq, bucket)
    return found


@dataclass(frozen=True, slots=True)
class Applied:
    """What `wait_applied` found for a campaign's events up to a seq: `applied`, or what holds
    them, the first row still outstanding (`seq`, its `attempts`, `last_error` and
    `next_attempt_at`): `pending` or `processing` (a worker has it, or will), `failed` (waiting
    for a retry) or `dead` (blocked until an operator requeues it). True only when applied."""

    state: Literal["applied", "pending", "processing", "failed", "dead"]
    campaign_id: str
    seq: int | None = None
    attempts: int = 0
    last_error: str | None = None
    next_attempt_at: datetime | None = None

    def __bool__(self) -> bool:
        return self.state == "applied"

    @property
    def blocked(self) -> bool:
        """A failed or dead row holds the campaign: waiting longer may not help."""
        return self.state in ("failed", "dead")


async def first_outstanding(
    conn: Connection, campaign_id: str, seq: int
) -> tuple[Applied, float | None]:
    """Where the campaign's events up to `seq` stand, and the seconds until the holding row's
    next attempt (None when all are applied)."""
    r = await conn.fetchrow(
        Q.get_first_outstanding, campaign_id, seq, await buckets.bucket_for(conn, campaign_id)
    )
    if r is None:
        return Applied("applied", campaign_id), None
    found = Applied(
        r["status"],
        campaign_id,
        r["seq"],
        r["attempt_count"],
        r["last_error"],
        r["next_attempt_at"],
    )
    return found, r["due_in"]


async def wait_applied(
    executor: Executor,
    campaign_id: str,
    seq: int,
    timeout: float,  # noqa: ASYNC109 - the public signature takes a timeout
) -> Applied:
    """Read-your-writes: wait until `campaign_id`'s events up to `seq` are applied. Returns an
    `Applied`, true when they are; otherwise it says what holds them. It returns early when
    waiting cannot help: a dead row, or a failed one whose retry falls due after the timeout.

    It LISTENs for the workers' applied notification (sent when a batch deletes rows) and looks
    again on each, so it returns within a round trip of the projection's commit. On a connection
    inside a transaction (where notifications wait for the transaction's end) it polls. It needs
    asyncpg's (a TypeError says what to pass otherwise)."""
    db.require_asyncpg(executor, "wait_applied")
    channel = applied_channel()
    async with db.acquire(executor) as conn:
        listening = not db.in_transaction(conn)
        woken = [anyio.Event()]

        def ring(*_: object) -> None:
            woken[0].set()

        if listening:
            await conn.add_listener(channel, ring)
        try:
            deadline = anyio.current_time() + timeout
            poll = 0.005
            while True:
                found, due_in = await first_outstanding(conn, campaign_id, seq)
                left = deadline - anyio.current_time()
                if found.state in ("applied", "dead") or left <= 0:
                    return found
                if found.state == "failed" and due_in is not None and due_in > left:
                    return found  # its retry falls due after the timeout
                # Listening, a look now and then still covers workers that send no notification
                # (an older release mid-upgrade); inside a transaction, polling is all there is.
                with anyio.move_on_after(min(left, RECHECK if listening else poll)):
                    await woken[0].wait()
                woken[0] = anyio.Event()
                poll = min(poll * 2, 0.25)
        finally:
            if listening:
                await conn.remove_listener(channel, ring)
