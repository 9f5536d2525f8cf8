"""Requeues of dead rows, one by one or in batches, after a projector is fixed.

A requeued row is pending and due now with a fresh attempt budget; an insert-only audit row
keeps what it was (status, attempts, last error, when), who did it (`actor`, default: the
operating-system user) and why. A batch goes oldest first, in chunks of their own
transactions, so a long requeue never holds many locks.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import Conflict, ValidationError
from outbox.ops.report import check_limit
from outbox.projection.known import require_recorded
from outbox.queue import repair
from outbox.queue.claim import claim_one
from outbox.queue.repair import DeadRow
from outbox.queue.settle import notify_work

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["RequeueOne", "RequeueResult", "current_actor", "requeue_dead", "requeue_one"]

REQUEUE_CHUNK = 500
# An error group's fingerprint (outbox_error_fingerprint, queue/inspect_fn.sql).
_FINGERPRINT = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class RequeueOne:
    campaign_id: str
    seq: int
    requeued: bool


@dataclass(frozen=True, slots=True)
class RequeueResult:
    """A batch requeue: how many matched, how many moved (0 in a dry run), and the rows."""

    limit: int
    dry_run: bool
    matched: int
    requeued: int
    rows: list[DeadRow]


def current_actor() -> str:
    """The operating-system user, for the audit."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


async def requeue_one(
    executor: Executor,
    campaign_id: str,
    seq: int,
    *,
    actor: str | None = None,
    reason: str | None = None,
    projector: str | None = None,
) -> RequeueOne:
    """One dead row back to pending (`projector`: only its hold on the row, S24; None: all of
    the row's); NotFound, or Conflict when not dead (for that projector) or held by a
    batch."""
    async with db.acquire(executor) as conn:
        if projector is not None:
            await require_recorded(conn, projector)
        async with conn.transaction():
            row, _ = await claim_one(conn, campaign_id, seq, park=True)
            if row.status != "dead":
                raise Conflict(f"row {campaign_id!r} seq {seq} is {row.status}, not dead")
            moved = await repair.requeue_dead(
                conn,
                limit=1,
                one=(campaign_id, seq),
                projector=projector,
                actor=actor or current_actor(),
                reason=reason,
            )
            if not moved:
                raise Conflict(
                    f"projector {projector!r} is not dead on row {campaign_id!r} seq {seq}"
                )
        await notify_work(conn)
    return RequeueOne(campaign_id, seq, requeued=True)


async def requeue_dead(
    executor: Executor,
    *,
    limit: int,
    campaign_id: str | None = None,
    event_type: str | None = None,
    fingerprint: str | None = None,
    dry_run: bool = False,
    actor: str | None = None,
    reason: str | None = None,
    progress: Callable[[int], None] | None = None,
    projector: str | None = None,
    died_by: datetime | None = None,
) -> RequeueResult:
    """Up to `limit` dead rows back to pending, oldest first, in chunks of their own
    transactions; `progress(n)` after each chunk. With `dry_run` nothing changes and the rows
    that would move come back. `campaign_id`, `event_type`, `fingerprint` (an error group's):
    only matching rows; `projector`: only rows it is dead on, and only its holds (S24);
    `died_by`: only rows that died by then (what a preview showed, not what died since)."""
    check_limit(limit)
    if fingerprint is not None and not _FINGERPRINT.fullmatch(fingerprint):
        raise ValidationError(
            "error fingerprint", f"expected 12 hex digits (outbox-failures), got {fingerprint!r}"
        )
    actor = actor or current_actor()
    done: list[DeadRow] = []
    async with db.acquire(executor) as conn:
        if projector is not None:
            await require_recorded(conn, projector)
        if dry_run:
            rows = await repair.requeue_dead(
                conn,
                limit=limit,
                campaign_id=campaign_id,
                event_type=event_type,
                fingerprint=fingerprint,
                projector=projector,
                dry_run=True,
                actor=actor,
                reason=reason,
                died_by=died_by,
            )
            return RequeueResult(limit, True, len(rows), 0, rows)
        while len(done) < limit:
            ask = min(REQUEUE_CHUNK, limit - len(done))
            async with conn.transaction():
                chunk = await repair.requeue_dead(
                    conn,
                    limit=ask,
                    campaign_id=campaign_id,
                    event_type=event_type,
                    fingerprint=fingerprint,
                    projector=projector,
                    actor=actor,
                    reason=reason,
                    died_by=died_by,
                )
            done += chunk
            if progress is not None:
                progress(len(chunk))
            if len(chunk) < ask:
                break
        if done:
            await notify_work(conn)
    return RequeueResult(limit, False, len(done), len(done), done)
