"""The `Outbox` app: settings, the projector registry, and the append with inline apply (S5).

Applications build one `Outbox`, register projectors with `@app.projector(...)`, and append
with `app.append(...)`. The worker (`outbox.worker`) and the operators' tools take the app;
dispatch lives in `outbox.apply`, rebuilds in `outbox.rebuild`.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from outbox import db, queue
from outbox.apply import Dispatch, GroupFailed
from outbox.config import Settings
from outbox.errors import ConfigError
from outbox.journal import (
    AppendResult,
    Event,
    append,
    load_events,
    outcome_unknown_on_connection_loss,
)
from outbox.queue import CampaignWrite, Failure
from outbox.registry import Projector, Registry, ResetFn
from outbox.retry import ErrorClass, after_failure, classify

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = ["Outbox"]

F = TypeVar("F", bound=Callable[..., Awaitable[None]])


class Outbox:
    """The app object: settings plus the projector registry.

    app = Outbox()

    @app.projector("roster", events=["character.joined"])
    async def roster(tx, event): ...
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self.registry = Registry()

    def projector(
        self,
        name: str,
        *,
        events: Sequence[str],
        ordered: bool | None = None,
        idempotent: bool = False,
        reset: ResetFn | None = None,
        batch: bool = False,
        transactional: bool = True,
    ) -> Callable[[F], F]:
        """Register a projector of `events` (a list of types) under `name`.

        - `name`: the projector's identity; its checkpoints and markers are keyed by it, so a
          rename starts it afresh (docs/idempotency.md, hazards).
        - `events`: the event types it receives; `fn(tx, event)` gets each as a StoredEvent
          (campaign_id, seq, type, payload, metadata, recorded_at; docs/projections.md).
        - `ordered` (default True): a checkpoint per campaign (S17); duplicates are skipped,
          a gap is refused. `ordered=False, idempotent=True`: a processed marker per event
          (S18). `ordered=False` alone: no guard (only the queue's transaction).
        - `batch=True`: `fn(tx, events)` is called once per claimed batch with the events it
          subscribes to that its guard lets through, in (campaign_id, seq) order; otherwise
          `fn(tx, event)` once per event. See docs/worker.md for the batch contract.
        - `reset(tx, campaign_id)`: clears one campaign's projection, for rebuilds (S19).
        - `transactional=False`: for projectors that write outside the database or run long
          (lease mode, S13). `fn(pool, event)` runs outside any queue transaction while a
          heartbeat extends the row's lease; delivery is at-least-once, so the projector must
          be idempotent towards its target (docs/worker.md, docs/idempotency.md). Per-campaign
          order still holds. It takes no guard: `ordered` defaults to False for it.
        """
        if isinstance(events, str):
            raise ConfigError(f"projector {name!r}: events must be a list of types, not a string")
        guarded = transactional if ordered is None else ordered

        def register(fn: F) -> F:
            self.registry.add(
                Projector(
                    name, frozenset(events), fn, guarded, idempotent, reset, batch, transactional
                )
            )
            return fn

        return register

    def ignore(self, types: Sequence[str]) -> None:
        """Declare event types that need no projection: completed and counted as skipped."""
        self.registry.ignore(types)

    def validate(self) -> None:
        self.registry.validate(self.settings)

    async def append(
        self,
        executor: Executor,
        campaign_id: str,
        events: Sequence[Event],
        *,
        apply_inline: bool | None = None,
        **options: Any,
    ) -> AppendResult:
        """`outbox.append` with this app's settings, and the inline fast path (S5) when
        `apply_inline` (default: OUTBOX_INLINE_APPLY) and enqueueing are on.

        After the inserts, in one savepoint of the append's transaction, the new events are
        applied and their work rows deleted (zero lag). On failure the savepoint rolls back,
        the failing row records attempt 1 and its error, and the append commits all the same.
        Skipped when an earlier row of the campaign is still outstanding (ordering, S9), and
        when an event has a non-transactional projector (a worker leases it, S13).
        """
        inline = self.settings.inline_apply if apply_inline is None else apply_inline
        leased = self.registry.leased_types()
        if leased and any(getattr(e, "type", None) in leased for e in events):
            inline = False
        if not (inline and self.settings.enabled):
            return await append(executor, campaign_id, events, settings=self.settings, **options)
        with outcome_unknown_on_connection_loss(campaign_id):
            async with db.acquire(executor) as conn, conn.transaction():
                result = await append(conn, campaign_id, events, settings=self.settings, **options)
                if not result.duplicate:
                    await self._apply_inline(conn, result)
        return result

    async def _apply_inline(self, conn: Connection, result: AppendResult) -> None:
        cid = result.campaign_id
        if await queue.outstanding_upto(conn, cid, result.first_seq - 1):
            return  # earlier work of this campaign comes first: the worker takes these too
        stored = await load_events(conn, cid, result.first_seq, result.last_seq)
        dispatch = Dispatch(conn, self.registry)
        try:
            async with conn.transaction():
                await dispatch.load([cid], held=True)  # the append holds the head
                await dispatch.apply(stored)
                # Nothing of the campaign is left outstanding, and this append holds its head:
                # its campaign row goes too (sql/0003_campaign_queue.sql). Past this append's
                # last seq is where the settle looks for later rows: there are none.
                after = result.last_seq + 1
                await queue.settle(
                    conn,
                    done=[(cid, seq) for seq in result.seqs],
                    campaigns=[CampaignWrite(cid, after, None, blocked=False, gone=True)],
                    checkpoints=dispatch.moves(),
                )
        except GroupFailed as failed:
            exc, current = failed.cause, stored[failed.index or 0]
            kind = classify(exc)
            if kind is ErrorClass.TRANSIENT:
                raise exc from None
            s = self.settings
            dead, delay = after_failure(
                1,
                permanent=kind is ErrorClass.PERMANENT,
                max_attempts=s.max_attempts,
                base=s.backoff_base,
                cap=s.backoff_cap,
                rand=random.random,
            )
            failure = Failure(cid, current.seq, 1, delay, failed.describe(), dead)
            await queue.settle(conn, failures=[failure])
            await queue.refresh_campaigns(conn, [cid], park=s.dead_policy == "park")
