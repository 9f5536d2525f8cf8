"""The long-running worker service: claim loops, LISTEN, heartbeat, metrics, shutdown.

`Service.run()` owns one task group: N claim loops around `Worker.run_once()`, the LISTEN
connection that rings them (naming the bucket that got work), the registry heartbeat and the
metrics refresh. Nothing the database does ends it: a lost connection anywhere or any other
failure of a batch is logged, backed off and retried; the broken connection is discarded.
Only `stop()` (a signal, the end of an embedding block), the end of a drain or a failure at
start-up ends the service. `database.lost` and `database.restored` mark the link's changes.

`Service.signals` says what happened, for tests and embedding code to wait on instead of
polling: the LISTEN connection is up (`listening`), a batch ended (`batch_done`), a claim loop
found nothing due (`idle`). Building a service from settings is `runtime`'s job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from outbox import db
from outbox.errors import TransientBatchError
from outbox.model import BatchCounts, WorkerMode
from outbox.obs import log
from outbox.obs.metrics import REFRESH_INTERVAL, Metrics
from outbox.queue import inspect
from outbox.queue.settle import unblock_campaigns, work_channel
from outbox.retry import backoff_delay, describe_error
from outbox.worker.batch import Worker
from outbox.worker.registration import HEARTBEAT_INTERVAL, Registration, registry_counters
from outbox.worker.signals import Doorbell, Signals

__all__ = ["Link", "Service", "refresh_gauges", "serve"]

_logger = log.get_logger("outbox.worker")

# Plans are left to the server (plan_cache_mode auto): the claims are plan-stable (tests check
# generic and custom plans over deep backlogs); forcing custom plans re-planned every statement.
RECONNECT_BASE = 0.5
RECONNECT_CAP = 30.0
RECHECK_DELAY = 0.01  # a claim that found a campaign due but nothing in it looks again


async def refresh_gauges(metrics: Metrics, executor: db.Executor, *, park: bool) -> None:
    """Set the queue gauges from the report's reads (rows by status, oldest head, blocked)."""
    async with db.acquire(executor) as conn:
        counts = await inspect.count_rows(conn)
        oldest = await inspect.oldest_claimable(conn, park=park)
        _, blocked = await inspect.blocked_campaigns(conn, park=park, limit=1)
        shadow = await inspect.shadow_observations(conn)
    metrics.set_queue(
        dataclasses.asdict(counts),
        oldest_age=oldest.age_seconds if oldest else None,
        blocked=blocked,
        shadow_max_lag=shadow.max_lag_seconds,
    )


@dataclass
class Link:
    """The state of the database link as the claim loops see it: one log line per transition,
    however many loops (and batches) meet the same outage."""

    up: bool = True

    def lost(self, error: str) -> None:
        if self.up:
            self.up = False
            _logger.warning("database.lost", extra={"error": error})

    def restored(self) -> None:
        if not self.up:
            self.up = True
            _logger.info("database.restored")


@dataclass
class Service:
    """Claim loops, the LISTEN connection and shutdown for one worker process.
    With `until_idle` (a drain) the loops end once a batch finds nothing due (not one that took
    all the campaigns it asked for, all emptied: more may wait), and no LISTEN, heartbeat or
    registry row is kept."""

    worker: Worker
    dsn: str
    concurrency: int = 1
    doorbell: Doorbell = field(default_factory=Doorbell)
    stopping: anyio.Event = field(default_factory=anyio.Event)
    listener_connected: bool = False
    totals: BatchCounts = field(default_factory=BatchCounts)
    mode: WorkerMode = "apply"
    shutdown_timeout: float = 30.0  # seconds the loops get to finish their batch on stop()
    signals: Signals = field(default_factory=Signals)
    metrics: Metrics = field(default_factory=Metrics)
    metrics_port: int | None = None  # serve /metrics (and refresh the queue gauges) when set
    metrics_host: str = "127.0.0.1"  # the address /metrics binds to
    metrics_address: tuple[str, int] | None = None  # where it serves, once it does
    until_idle: bool = False
    # With until_idle: wait out backoffs (and leases held elsewhere) until nothing outstanding
    # will come due, instead of ending at the first claim that finds nothing due now.
    wait_out_backoff: bool = False
    link: Link = field(default_factory=Link)
    # LISTEN for wake-ups; without it the poll interval alone bounds every wait, e.g.
    # behind a pooler in transaction mode, where LISTEN does not work.
    notifications: bool = True

    def __post_init__(self) -> None:
        self.worker.metrics = self.metrics  # per-projector figures after each commit
        self.metrics.register_projectors(self.worker.app.registry.projectors)

    @property
    def worker_id(self) -> str:
        """The registry's id of this process, also the owner of its leases."""
        return self.worker.worker_id

    def stop(self) -> None:
        self.stopping.set()
        self.doorbell.close()

    async def _pause(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self.doorbell.wait()

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(
            attempt, base=RECONNECT_BASE, cap=RECONNECT_CAP, rand=self.worker.policy.rand
        )

    async def claim_loop(self) -> None:
        settings = self.worker.app.settings
        failures = 0
        while not self.stopping.is_set():
            try:
                counts = await self.worker.run_once()
            except TransientBatchError as exc:
                failures += 1
                delay = self._backoff(failures)
                state = exc.sqlstate or ("connection" if exc.connection_lost else "unknown")
                self.metrics.transient_errors.labels(state).inc()
                if exc.connection_lost:
                    self.link.lost(str(exc))
                    _logger.debug("batch.transient", extra={"error": str(exc), "retry_in": delay})
                else:  # a deadlock, a lock or statement timeout: the database is up
                    _logger.warning("batch.transient", extra={"error": str(exc), "retry_in": delay})
                await self._pause(delay)
                continue
            except Exception as exc:
                # Not a projector's failure (those are recorded on their rows): the batch's own
                # bookkeeping failed. Its transaction rolled back; back off, never exit.
                failures += 1
                delay = self._backoff(failures)
                _logger.exception(
                    "batch.error", extra={"error": describe_error(exc), "retry_in": delay}
                )
                await self._pause(delay)
                continue
            failures = 0
            self.link.restored()
            self.totals.add(counts)
            self.metrics.record_batch(counts)
            self.signals.batch_done.fire()
            if counts.claimed:
                _logger.debug("batch.done", extra=vars(counts))
            if not counts.more_due and counts.claimed < settings.batch_size:
                self.signals.idle.fire()  # nothing is due now: the loop waits or ends
            if not (counts.claimed or counts.more_due) and self.worker.took_all and self.until_idle:
                if not self.wait_out_backoff or counts.paused:  # paused: never due by itself
                    return
                wait = await self._due_in()
                if wait is None:
                    return  # what is left never comes due by itself: dead or blocked rows
                await self._pause(wait)
                continue
            if counts.claimed >= settings.batch_size or not self.worker.took_all:
                continue  # a full batch, or a claim that met its campaign limit: more is due
            if counts.more_due:
                # Campaigns left due: claim again, at once when this batch did work. One that
                # yielded nothing waits for an append still in flight: look again shortly.
                await self._pause(0 if counts.claimed else RECHECK_DELAY)
                continue
            if not self.until_idle:  # a drain ends at the next claim that finds nothing
                await self._pause(await self._idle_time(counts))

    async def _due_in(self, *, later: bool = False) -> float | None:
        """Until the next outstanding work is due (`later`: work not due yet), at most the poll
        interval; None when no claimable work is left (a failed lookup counts as "look again
        after a poll")."""
        poll = self.worker.app.settings.poll_interval
        try:
            due_in = await inspect.next_due_in(
                self.worker.pool, ordered=self.worker.ordered, later=later
            )
        except Exception as exc:  # the next batch meets the same problem and reports it
            _logger.debug("idle.lookup_failed", extra={"error": describe_error(exc)})
            return poll
        return None if due_in is None else min(poll, max(due_in, 0.0) + 0.01)

    async def _idle_time(self, counts: BatchCounts) -> float:
        """How long a loop whose claim took all it could waits for a NOTIFY: until work falls
        due by time (a retry, a lease's expiry), at most the poll interval. What is due now and
        was left is another batch's, or came due since (its NOTIFY rings); a batch that
        scheduled no retry and leased nothing has none of its own to wait for: no lookup."""
        poll = self.worker.app.settings.poll_interval
        if counts.claimed and not (counts.failed or counts.leased):
            return poll
        due_in = await self._due_in(later=True)
        return poll if due_in is None else due_in

    @asynccontextmanager
    async def _listener_connection(self) -> AsyncIterator[db.Connection]:
        """A connection of its own for LISTEN: from the DSN when one is known (the CLI), else
        one held from the worker's pool (an application's `running_worker`)."""
        settings = self.worker.app.settings
        if not self.dsn:
            session = settings.worker_session("outbox-listener")
            async with db.acquire(self.worker.pool, session=session) as conn:
                yield conn
            return
        sent, _ = settings.session_settings("outbox-listener")
        conn = await db.connect(self.dsn, server_settings=sent, codecs=False)
        try:
            yield conn
        finally:
            conn.terminate()

    async def listen(self) -> None:
        """Keep a LISTEN connection, reconnecting with backoff; never needed for correctness,
        the poll interval bounds every wait. Any failure of it is logged and retried."""
        attempt = 0
        while True:
            error = "connection closed"
            connected = False
            try:
                async with self._listener_connection() as conn:
                    connected = True
                    lost = anyio.Event()

                    def on_lost(_conn: object, lost: anyio.Event = lost) -> None:
                        lost.set()

                    def on_work(_c: object, _pid: object, _ch: object, payload: object) -> None:
                        self.worker.ring.wake(str(payload))  # the bucket that got work
                        self.doorbell.ring()  # one loop: one append, one campaign

                    conn.add_termination_listener(on_lost)
                    await conn.add_listener(work_channel(), on_work)
                    try:
                        self.listener_connected, attempt = True, 0
                        self.metrics.listener_connected.set(1)
                        _logger.info("listener.connected")
                        self.signals.listening.fire()
                        self.worker.ring.wake("")  # appended while we were away: look again
                        self.doorbell.ring_all()
                        await self._watch(conn, lost)
                    finally:
                        if not self.dsn:  # borrowed from the application's pool: back clean
                            await _unlisten(conn, on_work, on_lost)
            except Exception as exc:  # could not connect, lost before LISTEN, or while watching
                error = describe_error(exc)
                if not connected:
                    _logger.warning("listener.connect_failed", extra={"error": error})
            finally:
                self.listener_connected = False
                self.metrics.listener_connected.set(0)
            attempt += 1
            if connected:
                _logger.warning("listener.lost", extra={"error": error})
            await anyio.sleep(self._backoff(attempt))

    async def _watch(self, conn: db.Connection, lost: anyio.Event) -> None:
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
                await registration.heartbeat(registry_counters(self.totals, self.worker.tally))
            except Exception as exc:  # the registry serves the report, never the work
                _logger.warning("registry.heartbeat_failed", extra={"error": describe_error(exc)})

    async def refresh_metrics(self) -> None:
        """Queue gauges from the database; only while /metrics is served."""
        while True:
            try:
                await refresh_gauges(self.metrics, self.worker.pool, park=self.worker.park)
            except Exception as exc:  # metrics never stop the work
                _logger.warning("metrics.refresh_failed", extra={"error": describe_error(exc)})
            await anyio.sleep(REFRESH_INTERVAL)

    async def wait_listening(self) -> None:
        """Return once the LISTEN connection is up (at once if it is)."""
        await self.signals.listening.wait_until(lambda: self.listener_connected)

    async def run(
        self,
        *,
        shutdown_timeout: float | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run until `stop()` (or, with `until_idle`, until every loop found nothing due);
        `shutdown_timeout` overrides the service's own."""
        if shutdown_timeout is None:
            shutdown_timeout = self.shutdown_timeout
        if self.worker.park and self.mode == "apply":
            unblocked = await unblock_campaigns(self.worker.pool)
            if unblocked:
                _logger.info("campaigns.unblocked", extra={"campaigns": unblocked})
        if self.until_idle:
            await self._loops(shutdown_timeout, task_status)
            return
        registration = Registration(self.worker.pool, self.worker_id, self.mode, self.concurrency)
        await registration.register(self.stopping)
        _logger.info(
            "worker.registered",
            extra={"worker_id": self.worker_id, "mode": self.mode, "concurrency": self.concurrency},
        )
        try:
            async with anyio.create_task_group() as service:
                if self.notifications:
                    service.start_soon(self.listen)
                service.start_soon(self.heartbeat, registration)
                if self.metrics_port is not None:
                    self.metrics_address = self.metrics.serve(self.metrics_port, self.metrics_host)
                    host, port = self.metrics_address
                    _logger.info("metrics.serving", extra={"host": host, "port": port})
                    service.start_soon(self.refresh_metrics)
                await self._loops(shutdown_timeout, task_status)
                service.cancel_scope.cancel()
        finally:
            if self.metrics_address is not None:  # the server this run started, and only it
                self.metrics.stop()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                try:
                    await registration.stop(registry_counters(self.totals, self.worker.tally))
                except Exception as exc:  # the row goes stale and drops out of the report
                    _logger.warning("registry.stop_failed", extra={"error": describe_error(exc)})

    async def _loops(self, shutdown_timeout: float, task_status: TaskStatus[None]) -> None:
        running = self.concurrency

        async def loop() -> None:
            nonlocal running
            try:
                await self.claim_loop()
            finally:
                running -= 1
                if running == 0:  # a drain's loops all found nothing due
                    self.stop()

        async with anyio.create_task_group() as loops:
            for _ in range(self.concurrency):
                loops.start_soon(loop)
            task_status.started()
            await self.stopping.wait()
            # Loops finish their batch; past the deadline the batch is cancelled, and its
            # transaction, never committed, leaves every row as it was.
            loops.cancel_scope.deadline = anyio.current_time() + shutdown_timeout


async def serve(service: Service) -> BatchCounts:
    """Run `service` until SIGTERM/SIGINT (or, with `until_idle`, until nothing is due), then
    shut down within its shutdown timeout; return its totals."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, service)
        await service.run()
        tg.cancel_scope.cancel()
    return service.totals


async def _stop_on_signal(service: Service) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            _logger.info("worker.stopping", extra={"signal": signal.Signals(signum).name})
            service.stop()
            return


async def _unlisten(
    conn: db.Connection, on_work: Callable[..., None], on_lost: Callable[[object], None]
) -> None:
    """Take the listener's callbacks and LISTEN off a borrowed connection before it goes back
    (also at shutdown); one gone or slow to answer is left as it is (the pool discards it)."""
    conn.remove_termination_listener(on_lost)
    with anyio.move_on_after(1, shield=True), contextlib.suppress(Exception):
        await conn.remove_listener(work_channel(), on_work)
