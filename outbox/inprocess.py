"""The worker inside your own process: an application's lifespan, a test, a script.

    async with outbox.running_worker(app, pool, concurrency=2):
        ...  # serve requests: the worker applies in the background, stops on exit

    counts = await outbox.drain_now(app, pool)  # tests: apply what is due now, then return

`running_worker` runs the same service as `outbox-worker` (claim loops, LISTEN wake-ups when
the app's settings carry a DSN, the registry heartbeat, lease mode) in a task group of its
own, and on exit stops it the way SIGTERM does: loops finish their batch within
`shutdown_timeout`, then the transaction in flight is rolled back and nothing is lost (S12).
It installs no signal handler and no logging: the application owns both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Literal

import anyio

from outbox.config import resolve_worker_mode
from outbox.migrate import check_current
from outbox.service import Service, drain
from outbox.worker import BatchCounts, ShadowWorker, Worker

if TYPE_CHECKING:
    from outbox.db import Pool
    from outbox.projectors import Outbox

__all__ = ["drain_now", "running_worker"]


@asynccontextmanager
async def running_worker(
    app: Outbox,
    pool: Pool,
    *,
    concurrency: int = 1,
    mode: Literal["apply", "shadow"] | None = None,
    shutdown_timeout: float = 30.0,
) -> AsyncIterator[Service]:
    """Run the worker service while the block runs; yields it (`.totals`, `.worker_id`).

    Checks the app against its settings and the schema before starting (ConfigError,
    SchemaNotReady). `mode` overrides the OUTBOX_*_ENABLED flags as `--mode` does. Without a
    DSN in `app.settings` the loops poll (OUTBOX_POLL_INTERVAL) instead of LISTENing.
    """
    app.validate()
    resolved = resolve_worker_mode(app.settings, mode).mode
    await check_current(pool)
    kind = ShadowWorker if resolved == "shadow" else Worker
    dsn = app.settings.dsn or ""
    service = Service(kind(app, pool), dsn, concurrency, mode=resolved, notifications=bool(dsn))
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=shutdown_timeout))
        try:
            yield service
        finally:
            service.stop()


async def drain_now(app: Outbox, pool: Pool, *, concurrency: int = 1) -> BatchCounts:
    """Apply everything due now with `app`'s projectors, then return the counts: the helper
    for tests that append and then assert on read models."""
    return await drain(Worker(app, pool), concurrency=concurrency)
