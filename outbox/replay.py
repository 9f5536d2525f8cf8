"""Replay: apply one queued row now, in the foreground (`maintenance outbox-replay`).

It claims the row and its campaign without waiting (a row a running batch holds is refused),
applies it with the worker's guards in one transaction, and records the outcome like any
attempt. Rows of events with a non-transactional projector are refused: they run under a
lease (S13), which only a worker takes.
"""

from __future__ import annotations

from typing import Any

from outbox import db, queue
from outbox.apply import ApplyOutcome, Dispatch, GroupFailed
from outbox.errors import Conflict, EventUnavailable
from outbox.retry import ErrorClass, classify
from outbox.worker import Worker

__all__ = ["replay"]


async def replay(worker: Worker, campaign_id: str, seq: int) -> dict[str, Any]:
    """Apply one queued row now, in the foreground (`maintenance outbox-replay`): the outcome
    is applied, skipped (a duplicate or an ignored type) or failed with its error (recorded
    like any attempt). A row a batch holds, or one waiting behind an earlier row of its
    campaign, is refused."""
    async with db.acquire(worker.pool) as conn, conn.transaction():
        row, blocked_by = await queue.claim_one(conn, campaign_id, seq, park=worker.park)
        leased = worker.app.registry.leased_types()
        if row.status == "processing" or (row.event is not None and row.event.type in leased):
            raise Conflict(
                f"row {campaign_id!r} seq {seq} has a non-transactional projector, which runs "
                "under a lease, never in a replay: a worker takes it (requeue it first if dead)"
            )
        if worker.ordered and blocked_by is not None:
            raise Conflict(
                f"row {campaign_id!r} seq {seq} waits behind seq {blocked_by} of its "
                "campaign; replay that one first"
            )
        result: dict[str, Any] = {"campaign_id": campaign_id, "seq": seq}
        dispatch = Dispatch(conn, worker.app.registry)
        await dispatch.load([campaign_id])
        try:
            event = row.stored_event()
            async with conn.transaction():
                (outcome,) = await dispatch.apply([event])
        except (GroupFailed, EventUnavailable) as failed:
            exc = failed.cause if isinstance(failed, GroupFailed) else failed
            kind = classify(exc)
            if kind is ErrorClass.TRANSIENT:
                raise exc from None
            projector = failed.projector if isinstance(failed, GroupFailed) else None
            failure = worker.failure(row, exc, projector=projector)
            await queue.settle(conn, failures=[failure], now=worker.now())
            await queue.refresh_campaigns(conn, [campaign_id], park=worker.park)
            return {
                **result,
                "outcome": "failed",
                "error": failure.error,
                "status": "dead" if failure.dead else "failed",
                "attempt_count": failure.attempts,
            }
        await queue.settle(conn, done=[row.key], checkpoints=dispatch.moves())
        await queue.refresh_campaigns(conn, [campaign_id], park=worker.park)
        applied = outcome is ApplyOutcome.APPLIED
        return {**result, "outcome": "applied" if applied else "skipped", "error": None}
