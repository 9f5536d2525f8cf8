"""The apply worker (S6-S12): claim a batch, apply each event in its own savepoint, settle.

`Worker.run_once()` is one batch in one transaction and returns its counts; `drain()` repeats
it until nothing is due. A batch that meets a transient database error is rolled back whole:
no row changes and no attempt is consumed (S7, S16). The worker never decides what a projector
does; it only dispatches (`projectors.apply_event`) and does the bookkeeping (`queue`).
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
from anyio.abc import TaskStatus

from outbox import db, log, queue
from outbox.errors import Conflict, DatabaseUnavailable
from outbox.journal import WORK_CHANNEL
from outbox.metrics import REFRESH_INTERVAL, Metrics
from outbox.projectors import ApplyOutcome, Outbox, applied_events, apply_event
from outbox.queue import ClaimedRow, Failure
from outbox.retry import ErrorClass, after_failure, backoff_delay, classify, describe_error
from outbox.workers import HEARTBEAT_INTERVAL, Registration, new_worker_id

if TYPE_CHECKING:
    from outbox.db import Connection, Pool

__all__ = [
    "SESSION_SETTINGS",
    "BatchCounts",
    "Doorbell",
    "Service",
    "ShadowWorker",
    "TransientBatchError",
    "Worker",
    "drain",
    "serve",
    "walk",
]

_logger = log.get_logger("outbox.worker")


@dataclass
class BatchCounts:
    claimed: int = 0
    applied: int = 0
    skipped: int = 0
    failed: int = 0
    dead: int = 0
    observed: int = 0  # shadow mode: rows seen and left for the apply worker

    def add(self, other: BatchCounts) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


class TransientBatchError(Exception):
    """A transient database error rolled the batch back; nothing changed, retry later."""


def walk(rows: list[ClaimedRow], *, limit: int, park: bool) -> list[ClaimedRow]:
    """The rows to process, per campaign in seq order: stop a campaign at its first row that is
    not due (a dead row is stepped over under `park`), and take at most `limit` in all."""
    chosen: list[ClaimedRow] = []
    stopped: set[str] = set()
    for row in rows:  # sorted by campaign_id, seq
        if row.campaign_id in stopped or len(chosen) >= limit:
            continue
        if not row.due:
            if not (park and row.status == "dead"):
                stopped.add(row.campaign_id)
            continue
        chosen.append(row)
    return chosen


def _transient_in(exc: BaseException) -> TransientBatchError | None:
    """The transient failure behind `exc`: a dead connection often surfaces as a second error
    (e.g. the transaction's exit on a closed connection) raised while handling the first."""
    found: TransientBatchError | None = None
    seen: BaseException | None = exc
    while seen is not None:  # report the root: the deepest transient error in the chain
        if isinstance(seen, TransientBatchError):
            found = seen
        elif classify(seen) is ErrorClass.TRANSIENT:
            found = TransientBatchError(describe_error(seen))
        seen = seen.__cause__ or seen.__context__
    return found


@dataclass
class Worker:
    app: Outbox
    pool: Pool
    # Jitter only spreads retries; it needs no cryptographic randomness.
    rand: Callable[[], float] = field(default_factory=lambda: random.Random().random)  # noqa: S311
    # Tests inject `now` to move time forward; None means the database clock.
    now: Callable[[], datetime | None] = lambda: None

    @property
    def ordered(self) -> bool:
        return self.app.settings.ordering == "campaign"

    @property
    def park(self) -> bool:
        return self.app.settings.dead_policy == "park"

    def _failure(self, row: ClaimedRow, exc: BaseException, *, permanent: bool) -> Failure:
        s = self.app.settings
        attempts = row.attempt_count + 1
        dead, delay = after_failure(
            attempts,
            permanent=permanent,
            max_attempts=s.max_attempts,
            base=s.backoff_base,
            cap=s.backoff_cap,
            rand=self.rand,
        )
        return Failure(row.campaign_id, row.seq, attempts, delay, describe_error(exc), dead)

    async def _apply_one(self, conn: Connection, row: ClaimedRow) -> ApplyOutcome:
        """All projectors of one event in one savepoint: a failure undoes only this event."""
        if row.event is None:
            raise LookupError(f"journal event {row.campaign_id!r} seq {row.seq} is missing")
        async with conn.transaction():
            return await apply_event(conn, self.app.registry, row.event)

    async def run_once(self) -> BatchCounts:
        """Claim, apply and settle one batch in one transaction; return its counts.

        Raises TransientBatchError when the database failed transiently: the transaction is
        gone, so every row is as it was and no attempt was consumed.
        """
        try:
            return await self._batch()
        except Exception as exc:
            transient = _transient_in(exc)
            if transient is None:
                raise
            raise transient from exc

    async def _batch(self) -> BatchCounts:
        """One transaction: claim, hand the rows to `_handle`, commit."""
        now = self.now()
        async with self.pool.acquire() as conn, conn.transaction():
            ordered, park = self._claim_mode()
            rows = await queue.claim(
                conn, limit=self.app.settings.batch_size, ordered=ordered, park=park, now=now
            )
            return await self._handle(conn, rows, now)

    def _claim_mode(self) -> tuple[bool, bool]:
        """(ordered, park) for the claim: the apply worker follows the settings."""
        return self.ordered, self.park

    async def _handle(
        self, conn: Connection, rows: list[ClaimedRow], now: datetime | None
    ) -> BatchCounts:
        """Apply the claimed rows each in its savepoint; delete successes, record failures."""
        settings = self.app.settings
        counts = BatchCounts()
        work = walk(rows, limit=settings.batch_size, park=self.park)
        counts.claimed = len(work)
        done: list[tuple[str, int]] = []
        failures: list[Failure] = []
        blocked: set[str] = set()
        for row in work:
            if row.campaign_id in blocked:
                continue  # an earlier row of this campaign failed in this batch
            try:
                outcome = await self._apply_one(conn, row)
            except Exception as exc:
                kind = classify(exc)
                if kind is ErrorClass.TRANSIENT:
                    raise TransientBatchError(describe_error(exc)) from exc
                failure = self._failure(row, exc, permanent=kind is ErrorClass.PERMANENT)
                failures.append(failure)
                counts.dead += failure.dead
                counts.failed += not failure.dead
                if self.ordered:
                    blocked.add(row.campaign_id)
                _logger.warning(
                    "apply.failed",
                    extra={
                        "campaign_id": row.campaign_id,
                        "seq": row.seq,
                        "attempt": failure.attempts,
                        "dead": failure.dead,
                        "error": failure.error,
                    },
                )
                continue
            done.append(row.key)
            if outcome is ApplyOutcome.APPLIED:
                counts.applied += 1
            else:
                counts.skipped += 1
        await queue.delete_rows(conn, done)
        await queue.record_failures(conn, failures, now)
        return counts

    async def replay(self, campaign_id: str, seq: int) -> dict[str, Any]:
        """Apply one queued row now, in the foreground (`maintenance outbox-replay`): the outcome
        is applied, skipped (a duplicate or an ignored type) or failed with its error (recorded
        like any attempt). A row a batch holds, or one waiting behind an earlier row of its
        campaign, is refused."""
        async with self.pool.acquire() as conn, conn.transaction():
            row, blocked_by = await queue.claim_one(conn, campaign_id, seq, park=self.park)
            if self.ordered and blocked_by is not None:
                raise Conflict(
                    f"row {campaign_id!r} seq {seq} waits behind seq {blocked_by} of its "
                    "campaign; replay that one first"
                )
            result: dict[str, Any] = {"campaign_id": campaign_id, "seq": seq}
            try:
                outcome = await self._apply_one(conn, row)
            except Exception as exc:
                kind = classify(exc)
                if kind is ErrorClass.TRANSIENT:
                    raise
                failure = self._failure(row, exc, permanent=kind is ErrorClass.PERMANENT)
                await queue.record_failures(conn, [failure], self.now())
                return {
                    **result,
                    "outcome": "failed",
                    "error": failure.error,
                    "status": "dead" if failure.dead else "failed",
                    "attempt_count": failure.attempts,
                }
            await queue.delete_rows(conn, [row.key])
            applied = outcome is ApplyOutcome.APPLIED
            return {**result, "outcome": "applied" if applied else "skipped", "error": None}

    async def drain(self) -> BatchCounts:
        """Run batches until one claims nothing (no row is due); return the totals."""
        total = BatchCounts()
        while True:
            counts = await self.run_once()
            total.add(counts)
            if counts.claimed == 0:
                return total


class ShadowWorker(Worker):
    """The shadow worker (S14): claims due rows like the apply worker and loads their events,
    but runs no projector. It records a sighting (count, first and last seen) and looks again a
    poll interval later; it never consumes an attempt and never makes a row dead. Rows whose
    event already counts as applied (inline, checkpoint, marker, or an ignored type) are
    completed, so the queue stays bounded."""

    def _claim_mode(self) -> tuple[bool, bool]:
        return False, True  # every due row, in any order: nothing is applied

    async def _handle(
        self, conn: Connection, rows: list[ClaimedRow], now: datetime | None
    ) -> BatchCounts:
        events = [(r.campaign_id, r.seq, r.event.type) for r in rows if r.event is not None]
        done = await applied_events(conn, self.app.registry, events)
        seen = [r.key for r in rows if r.key not in done]
        await queue.delete_rows(conn, sorted(done))
        await queue.record_observations(
            conn, seen, look_again_in=self.app.settings.poll_interval, now=now
        )
        return BatchCounts(claimed=len(rows), skipped=len(done), observed=len(seen))


# --- the long-running service -------------------------------------------------------------

# Worker sessions: a frozen worker releases its rows; the claim keeps a custom plan (a generic
# plan for `LIMIT $1` can scan the whole backlog after a few executions).
SESSION_SETTINGS = {
    "statement_timeout": "30000",
    "lock_timeout": "5000",
    "idle_in_transaction_session_timeout": "60000",
    "plan_cache_mode": "force_custom_plan",
    "application_name": "outbox-worker",
}
LISTENER_SETTINGS = {**SESSION_SETTINGS, "application_name": "outbox-listener"}
RECONNECT_BASE = 0.5
RECONNECT_CAP = 30.0


class Doorbell:
    """Wakes every waiting claim loop: NOTIFY rings it; `close()` wakes them for good."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self.closed = False

    def ring(self) -> None:
        self._event.set()

    def close(self) -> None:
        self.closed = True
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        if not self.closed:
            self._event = anyio.Event()


@dataclass
class Service:
    """Claim loops, the LISTEN connection and shutdown for one worker process (S10-S12)."""

    worker: Worker
    dsn: str
    concurrency: int = 1
    doorbell: Doorbell = field(default_factory=Doorbell)
    stopping: anyio.Event = field(default_factory=anyio.Event)
    listener_connected: bool = False
    totals: BatchCounts = field(default_factory=BatchCounts)
    worker_id: str = field(default_factory=new_worker_id)
    mode: str = "apply"
    metrics: Metrics = field(default_factory=Metrics)
    metrics_port: int | None = None  # serve /metrics (and refresh the queue gauges) when set

    def stop(self) -> None:
        self.stopping.set()
        self.doorbell.close()

    async def _pause(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self.doorbell.wait()

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, base=RECONNECT_BASE, cap=RECONNECT_CAP, rand=self.worker.rand)

    async def claim_loop(self) -> None:
        settings = self.worker.app.settings
        failures = 0
        while not self.stopping.is_set():
            try:
                counts = await self.worker.run_once()
            except TransientBatchError as exc:
                failures += 1
                delay = self._backoff(failures)
                _logger.warning("batch.transient", extra={"error": str(exc), "retry_in": delay})
                await self._pause(delay)
                continue
            failures = 0
            self.totals.add(counts)
            self.metrics.record_batch(counts)
            if counts.claimed:
                _logger.info("batch.done", extra=vars(counts))
            if counts.claimed < settings.batch_size:  # a full batch: more is probably due
                await self._pause(await self._idle_time())

    async def _idle_time(self) -> float:
        """Until the next row is due (a retry in backoff), at most the poll interval (S10)."""
        poll = self.worker.app.settings.poll_interval
        try:
            due_in = await queue.next_due_in(
                self.worker.pool, ordered=self.worker.ordered, park=self.worker.park
            )
        except Exception as exc:
            if _transient_in(exc) is None:
                raise
            return poll
        if due_in is None:
            return poll
        return min(poll, max(due_in, 0.0) + 0.01)

    async def listen(self) -> None:
        """Keep a LISTEN connection, reconnecting with backoff; never needed for correctness,
        the poll interval bounds every wait (S10)."""
        attempt = 0
        while True:
            try:
                conn = await db.connect(self.dsn, server_settings=LISTENER_SETTINGS, codecs=False)
            except DatabaseUnavailable as exc:
                attempt += 1
                _logger.warning("listener.connect_failed", extra={"error": str(exc)})
                await anyio.sleep(self._backoff(attempt))
                continue
            try:
                lost = anyio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(WORK_CHANNEL, lambda *_: self.doorbell.ring())
                self.listener_connected, attempt = True, 0
                self.metrics.listener_connected.set(1)
                _logger.info("listener.connected")
                self.doorbell.ring()  # whatever was appended while we were away
                await self._watch(conn, lost)
            finally:
                self.listener_connected = False
                self.metrics.listener_connected.set(0)
                conn.terminate()
            _logger.warning("listener.lost")

    async def _watch(self, conn: asyncpg.Connection[asyncpg.Record], lost: anyio.Event) -> None:
        # A dead socket is not always reported at once; a cheap query now and then finds out.
        while True:
            with anyio.move_on_after(max(1.0, self.worker.app.settings.poll_interval)):
                await lost.wait()
                return
            try:
                with anyio.fail_after(10):
                    await conn.fetchval("SELECT 1")
            except Exception:  # any failure here means the connection is gone
                return

    async def heartbeat(self, registration: Registration) -> None:
        while True:
            await anyio.sleep(HEARTBEAT_INTERVAL)
            try:
                await registration.heartbeat(vars(self.totals))
            except Exception as exc:  # the registry serves the report, never the work
                _logger.warning("registry.heartbeat_failed", extra={"error": describe_error(exc)})

    async def refresh_metrics(self) -> None:
        """Queue gauges from the database; only while /metrics is served (they scan the queue)."""
        while True:
            try:
                await self.metrics.refresh(self.worker.pool, park=self.worker.park)
            except Exception as exc:  # metrics never stop the work
                _logger.warning("metrics.refresh_failed", extra={"error": describe_error(exc)})
            await anyio.sleep(REFRESH_INTERVAL)

    async def run(self, *, shutdown_timeout: float, task_status: TaskStatus[None]) -> None:
        registration = Registration(self.worker.pool, self.worker_id, self.mode, self.concurrency)
        await registration.register()
        _logger.info(
            "worker.registered",
            extra={"worker_id": self.worker_id, "mode": self.mode, "concurrency": self.concurrency},
        )
        try:
            await self._run(shutdown_timeout, task_status, registration)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await registration.stop(vars(self.totals))

    async def _run(
        self, shutdown_timeout: float, task_status: TaskStatus[None], registration: Registration
    ) -> None:
        async with anyio.create_task_group() as service:
            service.start_soon(self.listen)
            service.start_soon(self.heartbeat, registration)
            if self.metrics_port is not None:
                bound = self.metrics.serve(self.metrics_port)
                _logger.info("metrics.serving", extra={"port": bound})
                service.start_soon(self.refresh_metrics)
            async with anyio.create_task_group() as loops:
                for _ in range(self.concurrency):
                    loops.start_soon(self.claim_loop)
                task_status.started()
                await self.stopping.wait()
                # Loops finish their batch; past the deadline the batch is cancelled, and its
                # transaction, never committed, leaves every row as it was (S12, S7).
                loops.cancel_scope.deadline = anyio.current_time() + shutdown_timeout
            service.cancel_scope.cancel()


async def serve(
    worker: Worker,
    dsn: str,
    *,
    concurrency: int,
    shutdown_timeout: float,
    mode: str = "apply",
    metrics_port: int | None = None,
) -> BatchCounts:
    """Run until SIGTERM/SIGINT, then shut down within `shutdown_timeout` seconds."""
    service = Service(worker, dsn, concurrency, mode=mode, metrics_port=metrics_port)
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=shutdown_timeout))
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                _logger.info("worker.stopping", extra={"signal": signal.Signals(signum).name})
                service.stop()
                break
    return service.totals


async def drain(worker: Worker, *, concurrency: int) -> BatchCounts:
    """Run `concurrency` loops until no row is due; return the totals."""
    total = BatchCounts()

    async def one() -> None:
        total.add(await worker.drain())

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(one)
    return total
