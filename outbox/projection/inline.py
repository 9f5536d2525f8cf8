"""Inline apply: the append's new events applied inside the append's own transaction.

After the journal write, in one savepoint of the same transaction, the new events are applied
with the exactly-once guards and their work rows deleted (zero lag). On failure the savepoint
rolls back, the failing row records its attempt as the failure policy decides, and the append
commits all the same: a worker retries the row. Skipped when an earlier row of the campaign is
still outstanding (per-campaign order: the worker takes these too), when a paused projector
subscribes to one of the events (a worker applies them once it is resumed), and by the app for
events with a non-transactional projector (a worker leases them), and when an ordered projector
is behind the campaign (deployed onto its history): the append does not wait for it to catch
up from the journal, a worker does that, charged nothing. Only `Outbox.append` calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from outbox import db
from outbox.append import call
from outbox.append.api import append
from outbox.append.journal import load_events
from outbox.config import Settings
from outbox.model import AppendResult, Event, StoredEvent
from outbox.projection.dispatch import ApplyOutcome, Dispatch, GroupFailed
from outbox.projection.pauses import PausedProjectors
from outbox.projection.plan import starting_now
from outbox.projection.registry import Registry
from outbox.projection.versions import SupersededVersions
from outbox.queue.applied import outstanding_upto
from outbox.queue.settle import CampaignWrite, refresh_campaigns, settle
from outbox.retry import ErrorClass, FailurePolicy, classify, log_failure

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = ["append_inline"]


class _Behind(Exception):
    """An ordered projector is behind the campaign: leave its rows to a worker."""


async def _apply_level(dispatch: Dispatch, stored: list[StoredEvent]) -> None:
    """Apply the append's events; raise `_Behind` (rolling the savepoint back, so the rows
    stay for a worker) when an ordered projector would first need the campaign's history."""
    if ApplyOutcome.BEHIND in await dispatch.apply(stored):
        raise _Behind


async def append_inline(
    executor: Executor,
    campaign_id: str,
    events: Sequence[Event],
    *,
    registry: Registry,
    settings: Settings,
    policy: FailurePolicy,
    pauses: PausedProjectors | None = None,
    superseded: SupersededVersions | None = None,
    expected_seq: int | None = None,
    idempotency_key: str | None = None,
    raise_on_duplicate: bool = False,
) -> AppendResult:
    """Append, then apply the new events in the same transaction (see the module docstring)."""
    with call.failures(campaign_id, db.connection_lost):
        async with db.acquire(executor) as conn, conn.transaction():
            result = await append(
                conn,
                campaign_id,
                events,
                expected_seq=expected_seq,
                idempotency_key=idempotency_key,
                raise_on_duplicate=raise_on_duplicate,
                settings=settings,
            )
            if superseded is not None:  # the versions promoted past run no more (S29)
                registry = await superseded.registry(conn, registry)
            paused = await pauses.types(conn, registry) if pauses else frozenset()
            if not result.duplicate and not paused & {e.type for e in events}:
                await _apply(conn, result, registry, settings, policy)
    return result


async def _apply(
    conn: Connection,
    result: AppendResult,
    registry: Registry,
    settings: Settings,
    policy: FailurePolicy,
) -> None:
    cid = result.campaign_id
    if await outstanding_upto(conn, cid, result.first_seq - 1):
        return  # earlier work of this campaign comes first: the worker takes these too
    stored = await load_events(conn, cid, result.first_seq, result.last_seq)
    dispatch = Dispatch(conn, registry, settings.unsubscribed, heal=0)
    try:
        async with conn.transaction():
            await dispatch.load([cid], held=True)  # the append holds the head
            starts = starting_now(registry, {cid: result.first_seq}, dispatch.checkpoints)
            dispatch.use(starts, write=True)
            await _apply_level(dispatch, stored)
            # Nothing of the campaign is left outstanding, and this append holds its head:
            # its campaign row goes too. Past this append's last seq is where the settle looks
            # for later rows: there are none.
            after = result.last_seq + 1
            await settle(
                conn,
                done=[(cid, seq) for seq in result.seqs],
                campaigns=[CampaignWrite(cid, after, None, blocked=False, gone=True)],
                checkpoints=dispatch.moves(),
                notify_applied=False,  # applied before the append returns: nobody waits yet
            )
    except _Behind:
        return
    except GroupFailed as failed:
        exc, current = failed.cause, stored[failed.index or 0]
        if classify(exc) is ErrorClass.TRANSIENT:
            raise exc from None
        failure = policy.fail(cid, current.seq, 0, exc, projector=failed.projector)
        await settle(conn, failures=[failure])
        await refresh_campaigns(conn, [cid], park=settings.park)
        log_failure(failure, exc)
