"""Requeues of dead rows and retries of failed ones, one by one or in batches, after a
projector is fixed.

A requeued row is pending and due now with a fresh attempt budget; a retried row is due now
with its attempts kept (the backoff is not waited out, the budget not refilled). An
insert-only audit row keeps what it was (status, attempts, last error, when), who did it
(`actor`, default: the operating-system user) and why. A batch goes oldest first, in chunks
of their own transactions, so a long requeue never holds many locks.
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
from outbox.projection.known import require_known
from outbox.queue import repair
from outbox.queue.claim import claim_one
from outbox.queue.repair import DeadRow
from outbox.queue.settle import notify_work

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = [
    "RequeueOne",
    "RequeueResult",
    "RetryOne",
    "RetryResult",
    "current_actor",
    "requeue_dead",
    "requeue_one",
    "retry_failed",
    "retry_one",
]

REQUEUE_CHUNK = 500
# An error group's fingerprint (outbox_error_fingerprint, queue/inspect_fn.sql).
_FINGERPRINT = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class RequeueOne:
    campaign_id: str
    seq: int
    requeued: bool


@dataclass(frozen=True, slots=True)
class RetryOne:
    campaign_id: str
    seq: int
    retried: bool


@dataclass(frozen=True, slots=True)
class RetryResult:
    """A batch retry: how many matched, how many were made due (0 in a dry run), the rows as
    they were."""

    limit: int
    dry_run: bool
    matched: int
    retried: int
    rows: list[DeadRow]


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
    await _one(executor, "requeue", campaign_id, seq, actor, reason, projector)
    return RequeueOne(campaign_id, seq, requeued=True)


async def retry_one(
    executor: Executor,
    campaign_id: str,
    seq: int,
    *,
    actor: str | None = None,
    reason: str | None = None,
    projector: str | None = None,
) -> RetryOne:
    """One failed row due now, its attempts kept (`projector`: only its hold on the row, S24;
    None: all of the row's failed holds); NotFound, or Conflict when not failed (for that
    projector) or held by a batch."""
    await _one(executor, "retry", campaign_id, seq, actor, reason, projector)
    return RetryOne(campaign_id, seq, retried=True)


async def _one(
    executor: Executor,
    action: repair.Action,
    campaign_id: str,
    seq: int,
    actor: str | None,
    reason: str | None,
    projector: str | None,
) -> None:
    wanted = "dead" if action == "requeue" else "failed"
    async with db.acquire(executor) as conn:
        if projector is not None:
            await require_known(conn, projector)
        async with conn.transaction():
            row, _ = await claim_one(conn, campaign_id, seq, park=True)
            if row.status != wanted:
                hint = {
                    "failed": " (maintenance outbox-retry makes it due now)",
                    "dead": " (maintenance outbox-requeue gives it fresh attempts)",
                }.get(row.status, "")
                raise Conflict(f"row {campaign_id!r} seq {seq} is {row.status}, not {wanted}{hint}")
            moved = await repair.repair(
                conn,
                action,
                limit=1,
                one=(campaign_id, seq),
                projector=projector,
                actor=actor or current_actor(),
                reason=reason,
            )
            if not moved:
                raise Conflict(
                    f"projector {projector!r} is not {wanted} on row {campaign_id!r} seq {seq}"
                )
        await notify_work(conn)


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
    rows = await _batch(
        executor,
        "requeue",
        limit=limit,
        campaign_id=campaign_id,
        event_type=event_type,
        fingerprint=fingerprint,
        dry_run=dry_run,
        actor=actor,
        reason=reason,
        progress=progress,
        projector=projector,
        died_by=died_by,
    )
    return RequeueResult(limit, dry_run, len(rows), 0 if dry_run else len(rows), rows)


async def retry_failed(
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
) -> RetryResult:
    """Up to `limit` failed rows due now, their attempts kept, oldest first, in chunks of
    their own transactions (audited as `retry`): what an operator runs after a fix rather than
    wait out the backoff. The filters are `requeue_dead`'s; `projector`: only rows it is
    failing on, and only its holds (S24)."""
    rows = await _batch(
        executor,
        "retry",
        limit=limit,
        campaign_id=campaign_id,
        event_type=event_type,
        fingerprint=fingerprint,
        dry_run=dry_run,
        actor=actor,
        reason=reason,
        progress=progress,
        projector=projector,
        died_by=None,
    )
    return RetryResult(limit, dry_run, len(rows), 0 if dry_run else len(rows), rows)


async def _batch(
    executor: Executor,
    action: repair.Action,
    *,
    limit: int,
    campaign_id: str | None,
    event_type: str | None,
    fingerprint: str | None,
    dry_run: bool,
    actor: str | None,
    reason: str | None,
    progress: Callable[[int], None] | None,
    projector: str | None,
    died_by: datetime | None,
) -> list[DeadRow]:
    check_limit(limit)
    if fingerprint is not None and not _FINGERPRINT.fullmatch(fingerprint):
        raise ValidationError(
            "error fingerprint", f"expected 12 hex digits (outbox-failures), got {fingerprint!r}"
        )
    actor = actor or current_actor()
    done: list[DeadRow] = []
    async with db.acquire(executor) as conn:
        if projector is not None:
            await require_known(conn, projector)
        while len(done) < limit:
            ask = limit if dry_run else min(REQUEUE_CHUNK, limit - len(done))
            async with conn.transaction():
                chunk = await repair.repair(
                    conn,
                    action,
                    limit=ask,
                    campaign_id=campaign_id,
                    event_type=event_type,
                    fingerprint=fingerprint,
                    projector=projector,
                    dry_run=dry_run,
                    actor=actor,
                    reason=reason,
                    died_by=died_by,
                )
            done += chunk
            if dry_run:
                return done
            if progress is not None:
                progress(len(chunk))
            if len(chunk) < ask:
                break
        if done:
            await notify_work(conn)
    return done
