"""Lease mode: projectors that cannot share the queue's transaction.

An event with a non-transactional subscriber (`@app.projector(..., transactional=False)`) is
not applied inside the batch that claims it. The batch leases its row (`outbox.queue.lease`
runs the statements): status `processing`, owner = the worker's id, a claim epoch incremented
on every claim, an expiry from the database clock, all committed with the batch. Then,
outside any queue transaction, `LeaseRunner.run` calls the non-transactional projectors with
the worker's pool while one heartbeat extends every running lease each third of the lease.
The end is one transaction, compare-and-set on owner, epoch and status: on success the row is
deleted and the event's transactional projectors run with their guards; on failure the
attempt is recorded; on shutdown the lease is handed back without counting an attempt. A
worker whose lease was taken over changes nothing and logs one line (`lease.fenced`).

An expired lease is taken back by the ordinary claim (a processing row is due at its expiry)
and counts as an attempt. Per-campaign order holds: the campaign waits behind its leased head
like behind any head that is not due. Delivery is at-least-once for the non-transactional
projectors, exactly-once for the event's transactional ones.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Protocol

import anyio

from outbox import db
from outbox.model import Failure, Key, StoredEvent
from outbox.obs import log, tracing
from outbox.obs.metrics import Metrics
from outbox.projection.dispatch import Dispatch, GroupFailed
from outbox.projection.plan import Skips
from outbox.projection.registry import Registry
from outbox.queue import lease as statements
from outbox.queue.claim import hold_campaign
from outbox.queue.holds import HoldWrite, row_holds
from outbox.queue.lease import Lease, settle_lease
from outbox.queue.settle import applied_channel, notify_work, refresh_campaigns, settle
from outbox.retry import (
    ErrorClass,
    FailurePolicy,
    backoff_delay,
    classify,
    describe_error,
    log_failure,
)

if TYPE_CHECKING:
    from outbox.config import Settings
    from outbox.db import Connection, Executor, Pool

__all__ = ["LeaseRunner"]

_logger = log.get_logger("outbox.lease")

# Retries of a lease's final transaction after a transient database error (the heartbeat keeps
# the lease meanwhile); past them the lease expires and the row is claimed again.
END_RETRIES = 8


class Counts(Protocol):
    applied: int
    failed: int
    dead: int
    fenced: int


# The leases of a batch still running, and the cancel scope of each one's projectors.
Live = dict[Key, tuple[Lease, anyio.CancelScope]]


@dataclass
class LeaseRunner:
    """Runs one batch's leases to their end (see the module docstring)."""

    pool: Pool
    registry: Registry
    settings: Settings
    owner: str
    policy: FailurePolicy  # attempts, backoff and death of a failed lease
    metrics: Metrics | None = None  # per-projector figures, recorded after each end commits
    # (projector, outcome) -> events: the worker's running tally, for its registry row.
    tally: Counter[tuple[str, str]] | None = None

    async def run(self, leases: list[Lease], counts: Counts) -> None:
        live: Live = {lease.key: (lease, anyio.CancelScope()) for lease in leases}
        async with db.acquire(self.pool, session=self.settings.worker_session()) as conn:
            heartbeat = _Heartbeat(conn, self.pool, self.owner, self.settings.lease_seconds, live)
            await heartbeat.beat()  # ready (connected, statement prepared) before any projector
            async with anyio.create_task_group() as beat:
                beat.start_soon(heartbeat.run)
                async with anyio.create_task_group() as tg:
                    for lease in leases:
                        tg.start_soon(self._one, lease, live, counts)
                beat.cancel_scope.cancel()

    async def _one(
        self,
        lease: Lease,
        live: Live,
        counts: Counts,
    ) -> None:
        event, scope = lease.row.stored_event(), live[lease.key][1]
        try:
            failed: GroupFailed | None = None
            ran: list[str] = []
            with scope:
                failed = await self._project(event, lease.holders, ran)
            if scope.cancelled_caught:  # the heartbeat found the lease taken over
                self._fenced(lease, "heartbeat", counts)
                return
            if failed is None:
                failed = await self._complete(lease, event, counts)
            if failed is not None:
                await self._fail(lease, failed, ran, counts)
        except anyio.get_cancelled_exc_class():
            # The worker is stopping: hand the lease back, no attempt counted.
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._release(lease)
            raise
        finally:
            live.pop(lease.key, None)

    async def _project(
        self, event: StoredEvent, holders: frozenset[str] | None, ran: list[str]
    ) -> GroupFailed | None:
        """Run the event's non-transactional projectors (those among `holders` on a retry) in
        name order, each that went through added to `ran`; the first failure."""
        for projector in self.registry.subscribers(event.type):
            if projector.transactional or (holders is not None and projector.name not in holders):
                continue
            started = perf_counter()
            attributes = {"outbox.projector": projector.name, "outbox.events": 1}
            try:
                with tracing.span("outbox.project", attributes=attributes, events=[event]):
                    # run(): upcast as every path does, `running_projector()` set
                    await projector.run(self.pool, [event])  # type: ignore[arg-type]
            except Exception as exc:
                self._record({(projector.name, "failed"): 1}, projector.name, started)
                return GroupFailed(exc, 0, projector.name)
            self._record({(projector.name, "applied"): 1}, projector.name, started)
            ran.append(projector.name)
        return None

    def _record(self, tally: dict[tuple[str, str], int], projector: str, started: float) -> None:
        if self.tally is not None:
            self.tally.update(tally)
        if self.metrics is not None:
            self.metrics.record_apply(tally, [(projector, perf_counter() - started)], ())

    async def _complete(
        self, lease: Lease, event: StoredEvent, counts: Counts
    ) -> GroupFailed | None:
        """Delete the row, fenced, and run the event's transactional projectors in the same
        transaction; a projector's failure comes back to be recorded. A retry (`holders`) runs
        the transactional holders alone, releases the holds it ran for, and deletes the row
        only when no other hold stands for it."""
        cid = lease.row.campaign_id
        for attempt in range(1, END_RETRIES + 1):
            try:
                async with (
                    db.acquire(self.pool, session=self.settings.worker_session()) as conn,
                    conn.transaction(),
                ):
                    await hold_campaign(conn, cid)
                    end = statements.complete_lease if lease.holders is None else settle_lease
                    age = await end(conn, lease, self.owner)
                    if age is None:
                        self._fenced(lease, "completion", counts)
                        return None
                    dispatch = Dispatch(conn, self.registry, self.settings.unsubscribed, heal=None)
                    await dispatch.load([cid])
                    await dispatch.apply([event], self._share(lease))
                    if lease.holders is None:
                        await settle(conn, checkpoints=dispatch.moves())
                    else:
                        held = {h.projector for h in await row_holds(conn, *lease.key)}
                        await settle(
                            conn,
                            done=[] if held - lease.holders else [lease.key],
                            released={(cid, n, lease.row.seq) for n in held & lease.holders},
                            checkpoints=dispatch.moves(),
                        )
                    await self._requeue(conn, cid)
                    await notify_work(conn, applied_channel())
            except GroupFailed as failed:
                if classify(failed.cause) is not ErrorClass.TRANSIENT:
                    return failed
                await self._retry_later(lease, "completion", failed.cause, attempt)
            except Exception as exc:
                if classify(exc) is not ErrorClass.TRANSIENT:
                    raise
                await self._retry_later(lease, "completion", exc, attempt)
            else:
                counts.applied += 1
                if self.metrics is not None:
                    self.metrics.record_apply(dispatch.tally, dispatch.durations, [age])
                return None
        return None  # the lease runs out and the row is claimed again

    def _share(self, lease: Lease) -> Skips | None:
        """What a retry's end keeps from the event's transactional projectors that do not hold
        the row (they applied it, or wait for it elsewhere); None: a first run, all of them."""
        if lease.holders is None:
            return None
        cid, seq = lease.key
        skips = Skips()
        for p in self.registry.subscribers(lease.row.event_type or ""):
            if p.transactional and p.name not in lease.holders:
                if p.ordered:
                    skips.stop(cid, p.name, seq)
                else:
                    skips.held.add((cid, seq, p.name))
        return skips

    async def _fail(
        self, lease: Lease, failed: GroupFailed, ran: list[str], counts: Counts
    ) -> None:
        """The lease ends with the row held (S24): a lease-mode projector that failed holds
        the event alone (attempts, backoff, dead after the last), and the rest of the event's
        share (its lease-mode projectors not yet run, its transactional ones) waits in holds
        due now, for the batches to take on; those that went through are done with it. A
        transactional projector failing at the end charges no attempt here: its share goes
        back to the batches, which isolate it."""
        for attempt in range(1, END_RETRIES + 1):
            try:
                async with (
                    db.acquire(self.pool, session=self.settings.worker_session()) as conn,
                    conn.transaction(),
                ):
                    await hold_campaign(conn, lease.row.campaign_id)
                    if await settle_lease(conn, lease, self.owner) is None:
                        self._fenced(lease, "failure", counts)
                        return
                    failure = await self._hold(conn, lease, failed, ran)
                    await self._requeue(conn, lease.row.campaign_id)
            except Exception as error:
                if classify(error) is not ErrorClass.TRANSIENT:
                    raise
                await self._retry_later(lease, "failure", error, attempt)
                continue
            if failure is not None:
                counts.dead += failure.dead
                counts.failed += not failure.dead
                log_failure(failure, failed.cause, lease_epoch=lease.epoch)
            return

    async def _hold(
        self, conn: Connection, lease: Lease, failed: GroupFailed, ran: list[str]
    ) -> Failure | None:
        """Place the holds of a failed lease's row (see `_fail`); the lease-mode projector's
        failure, if one failed."""
        cid, seq = lease.key
        held = {h.projector: h for h in await row_holds(conn, cid, seq)}
        owed = [
            p
            for p in self.registry.subscribers(lease.row.event_type or "")
            if lease.holders is None or p.name in lease.holders
        ]
        failure: Failure | None = None
        holds: dict[str, HoldWrite] = {}
        name = failed.projector
        if name is not None and any(p.name == name and not p.transactional for p in owed):
            before = held[name].attempt_count if name in held else lease.attempt_count
            failure = self.policy.fail(cid, seq, before, failed.cause, projector=name)
            status = "dead" if failure.dead else "failed"
            holds[name] = HoldWrite(
                cid, name, seq, status, failure.attempts, failure.delay, failure.error, True
            )
        for p in owed:
            if p.name in ran or p.name in holds:
                continue
            h = held.get(p.name)
            status, attempts = (h.status, h.attempt_count) if h is not None else ("pending", 0)
            holds[p.name] = HoldWrite(cid, p.name, seq, status, attempts, 0.0, None, True)
        await settle(
            conn,
            holds=list(holds.values()),
            released={(cid, n, seq) for n in ran if n in held},
        )
        return failure

    async def _release(self, lease: Lease) -> bool:
        """Hand the lease back unfinished (no attempt counted) and refresh its campaign row."""
        async with (
            db.acquire(self.pool, session=self.settings.worker_session()) as conn,
            conn.transaction(),
        ):
            await hold_campaign(conn, lease.row.campaign_id)
            released = await statements.release_lease(conn, lease, self.owner)
            if released:
                await self._requeue(conn, lease.row.campaign_id)
        return released

    async def _requeue(self, conn: Connection, campaign_id: str) -> None:
        """The campaign's next row is its head now: due at once, and the workers woken."""
        await refresh_campaigns(conn, [campaign_id], park=self.settings.park)
        await notify_work(conn)

    async def _retry_later(
        self, lease: Lease, stage: str, exc: BaseException, attempt: int
    ) -> None:
        delay = backoff_delay(attempt, base=0.1, cap=2.0, rand=lambda: 1.0)
        _logger.warning(
            "lease.retry",
            extra={
                "campaign_id": lease.row.campaign_id,
                "seq": lease.row.seq,
                "stage": stage,
                "error": describe_error(exc),
                "retry_in": delay,
            },
        )
        await anyio.sleep(delay)

    def _fenced(self, lease: Lease, stage: str, counts: Counts) -> None:
        counts.fenced += 1
        _logger.warning(
            "lease.fenced",
            extra={
                "campaign_id": lease.row.campaign_id,
                "seq": lease.row.seq,
                "owner": self.owner,
                "epoch": lease.epoch,
                "stage": stage,
            },
        )


@dataclass
class _Heartbeat:
    """Extends a batch's running leases every third of the lease on a connection of its own,
    ready before any projector starts: a beat is one round trip of a prepared statement, sent
    as soon as its timer fires, so a projector that blocks the event loop a second at a time
    delays a beat's answer, not the extension. A projector whose lease was taken over is
    cancelled (its end would be fenced anyway)."""

    executor: Executor
    pool: Pool
    owner: str
    seconds: float
    live: Live

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.seconds / 3)
            await self.beat()

    async def beat(self) -> None:
        leases = sorted((lease for lease, _ in self.live.values()), key=lambda lease: lease.key)
        if not leases:
            return
        try:
            held = await statements.extend_leases(
                self.executor, self.owner, leases, seconds=self.seconds
            )
        except Exception as exc:  # the next beat tries again; the lease has two more
            _logger.warning("lease.heartbeat_failed", extra={"error": describe_error(exc)})
            if db.connection_lost(exc):
                self.executor = self.pool  # a fresh connection per beat from now on
            return
        for lease in leases:
            if lease.key not in held and lease.key in self.live:
                self.live[lease.key][1].cancel()
