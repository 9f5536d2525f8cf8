"""The one runtime root: how a worker service is built from one `Settings`, wherever it runs.

`outbox-worker`, `running_worker` (the worker inside an application) and `drain_now` (tests)
all build their service here, from the app's settings: the mode (OUTBOX_MODE or the worker
flags), concurrency, shutdown timeout, metrics address, LISTEN wake-ups when a DSN is known.

    async with outbox.running_worker(app, pool, concurrency=2):
        ...  # serve requests: the worker applies in the background, stops on exit

    counts = await outbox.drain_now(app, pool)  # tests: apply what is due now, then return

`running_worker` runs the same service as `outbox-worker` (claim loops, LISTEN wake-ups, the
registry heartbeat, lease mode) in a task group of its own, on the application's pool: one of
its connections is held for LISTEN (without a DSN to open one), and every connection the
worker borrows carries the worker's session (`statement_timeout`, `lock_timeout`,
`idle_in_transaction_session_timeout`, `application_name`), whoever made the pool. On exit it
stops the way SIGTERM does: loops finish their batch within the shutdown timeout, then the
transaction in flight is rolled back and nothing is lost. It installs no signal handler and no
logging: the application owns both.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from outbox import db
from outbox.config import Settings, resolve_worker_mode
from outbox.errors import DatabaseUnavailable
from outbox.model import BatchCounts, WorkerMode
from outbox.obs import log
from outbox.queries import using_schema
from outbox.retry import backoff_delay, describe_error, sole_error
from outbox.schema import check_current
from outbox.worker.apply import Apply
from outbox.worker.batch import Worker
from outbox.worker.loops import ceiling_of
from outbox.worker.pools import open_pool
from outbox.worker.registration import new_worker_id
from outbox.worker.service import Service, ServiceConfig
from outbox.worker.shadow import Shadow

if TYPE_CHECKING:
    from outbox.db import Pool
    from outbox.projection.app import Outbox

__all__ = ["build_service", "drain_now", "open_pool", "open_pool_when_up", "running_worker"]

_logger = log.get_logger("outbox.worker")


async def open_pool_when_up(
    settings: Settings, *, wait: float | None = None, max_size: int | None = None
) -> Pool:
    """`open_pool` with the schema checked (SchemaNotReady), waiting for a database that cannot
    take the connection yet (refused, starting up, every slot taken: a transient
    `DatabaseUnavailable`), cannot write (a standby not promoted yet, a read-only session) or
    goes away meanwhile, with backoff up to the poll interval's tenfold, at most `wait` seconds
    (None: as long as it takes). One log line when the wait starts and one when it ends; a bad
    password or a missing database raise at once, as does the wait's end."""
    deadline = None if wait is None else anyio.current_time() + wait
    failures = 0
    while True:
        try:
            pool = await _open_ready(settings, max_size)
        except DatabaseUnavailable as exc:
            failures += 1
            left = None if deadline is None else deadline - anyio.current_time()
            if not exc.transient or (left is not None and left <= 0):
                raise
            cap = max(settings.poll_interval * 10, 1.0)
            delay = backoff_delay(failures, base=0.5, cap=cap, rand=random.random)
            if failures == 1:
                _logger.warning("database.waiting", extra={"error": str(exc), "retry_in": delay})
            await anyio.sleep(delay if left is None else min(delay, left))
            continue
        if failures:
            _logger.info("database.available", extra={"attempts": failures + 1})
        return pool


async def _open_ready(settings: Settings, max_size: int | None) -> Pool:
    """`open_pool`, checked: it can write (on a multi-host DSN without
    target_session_attrs=read-write the first host that answers may be a standby) and the
    schema is current (SchemaNotReady). A server lost meanwhile is a transient
    DatabaseUnavailable, as is one that cannot write."""
    pool = await open_pool(settings, max_size=max_size)
    target = db.redact_dsn(settings.dsn) if settings.dsn else "the database"
    try:
        refusal = await db.write_refusal(pool)
        if refusal is None:
            with using_schema(settings.schema):
                await check_current(pool)
    except Exception as exc:
        pool.terminate()
        if not db.transient(exc):
            raise
        reason = describe_error(exc)
        raise DatabaseUnavailable(f"{target} went away: {reason}", transient=True) from None
    if refusal is None:
        return pool
    await pool.close()
    raise DatabaseUnavailable(f"{target} cannot take writes: {refusal}", transient=True)


def build_service(
    app: Outbox,
    pool: Pool,
    *,
    settings: Settings | None = None,
    mode: WorkerMode | None = None,
    worker_id: str | None = None,
    until_idle: bool = False,
    wait_out_backoff: bool = False,
    own_pool: bool = False,
) -> Service:
    """The worker service for `app` on `pool`. `settings` (default: the app's) give the
    process's knobs; `mode` (default: OUTBOX_MODE, else the worker flags) chooses apply or
    shadow; `until_idle` makes it a drain (no LISTEN, registry or metrics), which with
    `wait_out_backoff` waits out backoffs until nothing left can come due by itself;
    `own_pool`: the pool is the worker's alone (`open_pool`), so its loops may grow past the
    concurrency while a backlog lasts without OUTBOX_MAX_CONCURRENCY (`loops.ceiling_of`)."""
    settings = settings if settings is not None else app.settings
    if mode is None:
        mode = resolve_worker_mode(settings).mode
    strategy = Shadow() if mode == "shadow" else Apply()
    dsn = settings.dsn or ""
    config = ServiceConfig(
        dsn=dsn,
        concurrency=settings.concurrency,
        max_concurrency=ceiling_of(settings, own_pool=own_pool),
        mode=mode,
        shutdown_timeout=settings.shutdown_timeout,
        metrics_port=settings.metrics_port,
        metrics_host=settings.metrics_host,
        until_idle=until_idle,
        wait_out_backoff=wait_out_backoff,
    )
    worker = Worker(app, pool, worker_id=worker_id or new_worker_id(), strategy=strategy)
    return Service(worker, config)


@asynccontextmanager
async def running_worker(
    app: Outbox,
    pool: Pool,
    *,
    concurrency: int | None = None,
    mode: WorkerMode | None = None,
    shutdown_timeout: float | None = None,
) -> AsyncIterator[Service]:
    """Run the worker service while the block runs; yields it (`.totals`, `.worker_id`,
    `.signals`).

    Checks the app against its settings and the schema before starting (ConfigError,
    SchemaNotReady). `concurrency`, `mode` and `shutdown_timeout` override the app's settings
    (OUTBOX_CONCURRENCY, OUTBOX_MODE, OUTBOX_SHUTDOWN_TIMEOUT). It LISTENs on a connection
    of `pool` (or of `app.settings.dsn` when set), so wake-ups need no environment variable.
    `pool` is an asyncpg pool (a TypeError says what to pass otherwise).
    """
    db.require_asyncpg(pool, "running_worker")
    app.validate()
    settings = app.settings.replace(concurrency=concurrency, shutdown_timeout=shutdown_timeout)
    resolved = resolve_worker_mode(settings, mode).mode
    with using_schema(settings.schema):
        await check_current(pool)
    service = build_service(app, pool, settings=settings, mode=resolved)
    started = False
    try:
        async with anyio.create_task_group() as tg:
            # The service's tasks name the app's schema; the application's own block is left
            # as is.
            with using_schema(settings.schema):
                await tg.start(service.run)
            started = True
            try:
                yield service
            finally:
                service.stop()
    except BaseExceptionGroup as group:
        # A start-up refusal (a drift of definition, S33) is raised as itself, not wrapped.
        error = sole_error(group)
        if started or error is group:
            raise
        raise error from None


async def drain_now(app: Outbox, pool: Pool, *, concurrency: int | None = None) -> BatchCounts:
    """Apply everything due now with `app`'s projectors, then return the counts: the helper
    for tests that append and then assert on read models (and for scripts)."""
    db.require_asyncpg(pool, "drain_now")
    settings = app.settings.replace(concurrency=concurrency)
    service = build_service(app, pool, settings=settings, mode="apply", until_idle=True)
    with using_schema(settings.schema):
        await service.run(shutdown_timeout=0)
    return service.totals
