"""Replay: apply one queued row now, in the foreground (`maintenance outbox-replay`).

It claims the row and its campaign without waiting (a row a running batch holds is refused),
applies it with the worker's guards in one transaction, and records a failure like any attempt
(the failure policy of `outbox.retry`); the outcome is its report, so it logs nothing. Rows of
events with a non-transactional projector are refused: they run under a lease, which only a
worker takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import Conflict, EventUnavailable
from outbox.projection.dispatch import ApplyOutcome, Dispatch, GroupFailed
from outbox.queue.claim import claim_one
from outbox.queue.holds import row_holds
from outbox.queue.settle import refresh_campaigns, settle
from outbox.retry import ErrorClass, classify

if TYPE_CHECKING:
    from collections.abc import Callable

    from outbox.db import Executor
    from outbox.projection.app import Outbox

__all__ = ["Replayed", "replay"]


@dataclass(frozen=True, slots=True)
class Replayed:
    """The outcome: applied, skipped (a duplicate or an ignored type) or failed, with the error
    and, when failed, the row's status and attempts now."""

    campaign_id: str
    seq: int
    outcome: str
    error: str | None
    status: str | None = None
    attempt_count: int | None = None


async def replay(
    app: Outbox,
    executor: Executor,
    campaign_id: str,
    seq: int,
    *,
    now: Callable[[], datetime | None] = lambda: None,
) -> Replayed:
    """Apply one queued row now. A row a batch holds, one waiting behind an earlier row of its
    campaign, or one that projectors' holds stand for (S24: its other projectors applied it)
    is refused (Conflict)."""
    settings = app.settings
    async with db.acquire(executor) as conn, conn.transaction():
        row, blocked_by = await claim_one(conn, campaign_id, seq, park=settings.park)
        leased = app.registry.leased_types()
        if row.status == "processing" or row.event_type in leased:
            raise Conflict(
                f"row {campaign_id!r} seq {seq} has a non-transactional projector, which runs "
                "under a lease, never in a replay: a worker takes it (requeue it first if dead)"
            )
        if held := await row_holds(conn, campaign_id, seq):
            names = ", ".join(h.projector for h in held)
            raise Conflict(
                f"row {campaign_id!r} seq {seq} waits for {names} alone (its other projectors "
                "applied it): requeue it for them (outbox-requeue --projector), not a replay"
            )
        if settings.ordered and blocked_by is not None:
            raise Conflict(
                f"row {campaign_id!r} seq {seq} waits behind seq {blocked_by} of its "
                "campaign; replay that one first"
            )
        dispatch = Dispatch(conn, app.registry, settings.unsubscribed, heal=None)
        await dispatch.load([campaign_id])
        try:
            event = row.stored_event()
            async with conn.transaction():
                (outcome,) = await dispatch.apply([event])
        except (GroupFailed, EventUnavailable) as failed:
            exc = failed.cause if isinstance(failed, GroupFailed) else failed
            if classify(exc) is ErrorClass.TRANSIENT:
                raise exc from None
            projector = failed.projector if isinstance(failed, GroupFailed) else None
            failure = app.failure_policy().fail(
                campaign_id, seq, row.attempt_count, exc, projector=projector
            )
            await settle(conn, failures=[failure], now=now())
            await refresh_campaigns(conn, [campaign_id], park=settings.park)
            status = "dead" if failure.dead else "failed"
            return Replayed(campaign_id, seq, "failed", failure.error, status, failure.attempts)
        await settle(conn, done=[row.key], checkpoints=dispatch.moves())
        await refresh_campaigns(conn, [campaign_id], park=settings.park)
        applied = outcome is ApplyOutcome.APPLIED
        return Replayed(campaign_id, seq, "applied" if applied else "skipped", None)
