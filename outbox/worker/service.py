"""The long-running worker service: claim loops, LISTEN, heartbeat, metrics, shutdown.

`Service.run()` owns one task group: claim loops around `Worker.run_once()` (`concurrency` of
them, more while a backlog lasts: `loops.Loops`), the LISTEN
connection that rings them (naming the bucket that got work), the registry heartbeat, the
campaign queue's rotation and the metrics refresh. Nothing the database does ends it: a lost
connection anywhere or any other failure of a batch is logged, backed off and retried; the
broken connection is discarded.
Only `stop()` (a signal, the end of an embedding block), the end of a drain or a failure at
start-up ends the service. `database.lost` and `database.restored` mark the link's changes.

`Service.signals` says what happened, for tests and embedding code to wait on instead of
polling: the LISTEN connection is up (`listening`), a batch ended (`batch_done`), a claim loop
found nothing due (`idle`). A service is its fixed configuration (`ServiceConfig`) and the
state it lives by; what a loop does after a batch is `steps.next_step`. Building a service
from settings is `runtime`'s job.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from functools import partial

import anyio
from anyio.abc import TaskStatus

from outbox.errors import TransientBatchError
from outbox.model import BatchCounts, WorkerMode
from outbox.obs import log
from outbox.obs.metrics import REFRESH_INTERVAL, Metrics
from outbox.projection import known
from outbox.queue.rotation import keep_rotating
from outbox.queue.settle import unblock_campaigns
from outbox.retry import backoff_delay, describe_error
from outbox.worker import groups
from outbox.worker.batch import Worker
from outbox.worker.gauges import refresh_gauges
from outbox.worker.listener import Listener, listen
from outbox.worker.loops import Loops, backlog
from outbox.worker.registration import (
    HEARTBEAT_INTERVAL,
    Registration,
    at_start,
    registry_counters,
)
from outbox.worker.signals import Doorbell, Signals
from outbox.worker.steps import Step, next_step

__all__ = ["Link", "Service", "ServiceConfig", "serve"]

_logger = log.get_logger("outbox.worker")

# Plans are left to the server (plan_cache_mode auto): the claims are plan-stable (tests check
# generic and custom plans over deep backlogs); forcing custom plans re-planned every statement.
RECONNECT_BASE = 0.5
RECONNECT_CAP = 30.0
RECHECK_DELAY = 0.01  # a claim that found a campaign due but nothing in it looks again


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


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """How a worker service runs, fixed when it is built. `dsn`: where the LISTEN connection
    goes ('': a connection held from the worker's pool). `until_idle` (a drain): the loops end
    once a batch finds nothing due (not one that took all the campaigns it asked for, all
    emptied: more may wait), and no LISTEN, heartbeat or registry row is kept; with
    `wait_out_backoff` they wait out backoffs (and leases held elsewhere) until nothing
    outstanding will come due. `notifications`: LISTEN for wake-ups; without it the poll
    interval alone bounds every wait (e.g. behind a pooler in transaction mode)."""

    dsn: str = ""
    concurrency: int = 1
    max_concurrency: int = 0  # the most loops while a backlog lasts (0: `concurrency`)
    mode: WorkerMode = "apply"
    shutdown_timeout: float = 30.0  # seconds the loops get to finish their batch on stop()
    metrics_port: int | None = None  # serve /metrics (and refresh the queue gauges) when set
    metrics_host: str = "127.0.0.1"  # the address /metrics binds to
    until_idle: bool = False
    wait_out_backoff: bool = False
    notifications: bool = True


@dataclass
class Service:
    """Claim loops, the LISTEN connection and shutdown for one worker process: its `config`,
    and the state it lives by (the loops' doorbell, whether it is stopping, the LISTEN link,
    the totals, the signals and metrics it reports)."""

    worker: Worker
    config: ServiceConfig = field(default_factory=ServiceConfig)
    doorbell: Doorbell = field(default_factory=Doorbell)
    stopping: anyio.Event = field(default_factory=anyio.Event)
    totals: BatchCounts = field(default_factory=BatchCounts)
    signals: Signals = field(default_factory=Signals)
    metrics: Metrics = field(default_factory=Metrics)
    metrics_address: tuple[str, int] | None = None  # where /metrics serves, once it does
    link: Link = field(default_factory=Link)
    listener: Listener = field(init=False)
    loops: Loops = field(init=False)

    def __post_init__(self) -> None:
        self.listener = Listener(self.config.dsn, self.metrics, self.signals)
        floor = self.config.concurrency
        self.loops = Loops(floor, max(floor, self.config.max_concurrency))
        self.loops.on_change = self.metrics.claim_loops.set
        self.worker.metrics = self.metrics  # per-projector figures after each commit
        self.worker.ring.live = not self.config.until_idle
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

    async def claim_loop(self, *, elastic: bool = False) -> None:
        """Batches until the service stops (a drain: until nothing is left to take); an
        `elastic` loop, started for a backlog, ends at its first batch that finds none."""
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
            step = next_step(
                counts,
                batch_size=settings.batch_size,
                took_all=self.worker.took_all,
                until_idle=self.config.until_idle,
                wait_out_backoff=self.config.wait_out_backoff,
            )
            wait = await self._due_in() if step is Step.DUE and not elastic else None
            if step is Step.DUE and wait is None:
                step = Step.END  # what is left never comes due by itself: dead or blocked rows
            if step is Step.END and self.worker.catch_ups.running:
                await self.worker.catch_ups.wait()  # a drain: then the holds it left, if any
                continue
            if step is Step.END or (elastic and step is not Step.CLAIM):
                return
            if backlog(counts, batch_size=settings.batch_size):
                self.loops.grow()
            if wait is not None:  # Step.DUE
                await self._pause(wait)
            elif step is Step.RECHECK:
                await self._pause(RECHECK_DELAY)
            elif step is Step.IDLE:
                await self._pause(await self._idle_time(counts))

    async def _due_in(self, *, later: bool = False) -> float | None:
        """Until the next outstanding work is due (`later`: work not due yet), at most the poll
        interval; None when no claimable work is left (a failed lookup counts as "look again
        after a poll")."""
        poll = self.worker.app.settings.poll_interval
        worker = self.worker
        try:
            due_in = await groups.due_in(
                worker.pool, worker.app, span=worker.ring.span, later=later
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
        if due_in is None and counts.failed:  # the retry it scheduled may be due already
            due_in = await self._due_in()
        if due_in is None:
            return poll
        self.worker.ring.expect(due_in)  # no NOTIFY comes for it: the ring reads then
        return due_in

    async def listen(self) -> None:
        """Keep the LISTEN connection that rings the loops (`listener.listen`)."""
        await listen(self.listener, self.doorbell, self.worker, self._backoff)

    async def _record_projectors(self) -> None:
        """Record the projectors this worker runs, so the database knows them (new ones
        logged once, by the first worker that runs them)."""
        app, pool = self.worker.app, self.worker.pool
        await groups.require_one_server(pool, app.settings)
        write = partial(known.record, pool, app.registry, self.worker_id, app.settings.group)
        new = await at_start(write, self.stopping)
        for name in new:
            _logger.info("projector.first_seen", extra={"projector": name})

    def _running(self) -> dict[str, str] | None:
        """The projectors this worker runs now, with their fingerprints (an apply worker)."""
        if self.config.mode != "apply":
            return None
        app = self.worker.app
        return app.absent.running(app.registry)

    async def heartbeat(self, registration: Registration) -> None:
        while True:
            await anyio.sleep(HEARTBEAT_INTERVAL)
            try:
                await registration.heartbeat(
                    registry_counters(self.totals, self.worker.tally), self._running()
                )
            except Exception as exc:  # the registry serves the report, never the work
                _logger.warning("registry.heartbeat_failed", extra={"error": describe_error(exc)})

    async def refresh_metrics(self) -> None:
        """Queue gauges from the database; only while /metrics is served."""
        registry = self.worker.app.registry
        ordered = {n: registry.projectors[n].events for n in registry.ordered_names()}
        while True:
            try:
                await refresh_gauges(
                    self.metrics, self.worker.pool, park=self.worker.park, ordered=ordered
                )
            except Exception as exc:  # metrics never stop the work
                _logger.warning("metrics.refresh_failed", extra={"error": describe_error(exc)})
            await anyio.sleep(REFRESH_INTERVAL)

    @property
    def listener_connected(self) -> bool:
        """Whether the LISTEN connection is up."""
        return self.listener.connected

    async def wait_listening(self) -> None:
        """Return once the LISTEN connection is up (at once if it is)."""
        await self.signals.listening.wait_until(lambda: self.listener.connected)

    async def run(
        self,
        *,
        shutdown_timeout: float | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run until `stop()` (or, with `until_idle`, until every loop found nothing due);
        `shutdown_timeout` overrides the service's own."""
        config = self.config
        if shutdown_timeout is None:
            shutdown_timeout = config.shutdown_timeout
        if config.mode == "apply":  # first: a worker refused for a drift writes nothing (S33)
            await self._record_projectors()
        if self.worker.park and config.mode == "apply":
            unblocked = await unblock_campaigns(self.worker.pool)
            if unblocked:
                _logger.info("campaigns.unblocked", extra={"campaigns": unblocked})
        if config.until_idle:  # a drain: the engine's catch-ups beside the loops, to their end
            async with anyio.create_task_group() as drain:
                if self.worker.catch_ups.pending:
                    self.worker.catch_ups.launch(drain, self.worker.pool, until_done=True)
                await self._loops(shutdown_timeout, task_status)
                drain.cancel_scope.cancel()  # stopped: a build in flight resumes next time
            return
        registration = Registration(
            self.worker.pool, self.worker_id, config.mode, config.concurrency, self._running()
        )
        await registration.register(self.stopping)
        _logger.info(
            "worker.registered",
            extra={
                "worker_id": self.worker_id,
                "mode": config.mode,
                "concurrency": config.concurrency,
            },
        )
        try:
            async with anyio.create_task_group() as service:
                if config.notifications:
                    service.start_soon(self.listen)
                service.start_soon(self.heartbeat, registration)
                service.start_soon(keep_rotating, self.worker.pool, self.metrics)
                if self.worker.catch_ups.pending:  # beside the loops, yielding to them
                    self.worker.catch_ups.launch(service, self.worker.pool, until_done=False)
                if config.metrics_port is not None:
                    self.metrics_address = self.metrics.serve(
                        config.metrics_port, config.metrics_host
                    )
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
        async def loop(elastic: bool) -> None:
            try:
                await self.claim_loop(elastic=elastic)
            finally:
                if self.loops.ended() == 0:  # a drain's loops all found nothing due
                    self.stop()

        async with anyio.create_task_group() as loops:
            for _ in range(self.loops.floor):
                self.loops.started()
                loops.start_soon(loop, False)

            def grow() -> None:
                if self.stopping.is_set():
                    self.loops.ended()
                    return
                loops.start_soon(loop, True)

            self.loops.start = grow
            task_status.started()
            await self.stopping.wait()
            # Loops finish their batch; past the deadline the batch is cancelled, and its
            # transaction, never committed, leaves every row as it was.
            loops.cancel_scope.deadline = anyio.current_time() + shutdown_timeout
        self.loops.start = None


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
