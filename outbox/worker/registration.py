"""The worker registry: each worker process registers, heartbeats and signs off.

It owns every statement on `outbox_workers` and nothing else; the report reads live workers
through `live_workers()`, cleanup prunes stale rows with `prune_workers()`. Losing a heartbeat
never affects correctness, only what the report shows.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from outbox import db
from outbox.queries import Queries
from outbox.retry import backoff_delay

if TYPE_CHECKING:
    from collections import Counter

    from outbox.db import Connection, Executor
    from outbox.model import BatchCounts

__all__ = [
    "HEARTBEAT_INTERVAL",
    "LIVE_WITHIN",
    "LiveWorker",
    "Registration",
    "at_start",
    "live_workers",
    "new_worker_id",
    "prune_workers",
    "registry_counters",
]

T = TypeVar("T")

HEARTBEAT_INTERVAL = 5.0
# A worker that has not heartbeated for this long is not listed as live.
LIVE_WITHIN = 30.0


class RegistrationQueries(Queries):
    register_worker: str
    heartbeat_worker: str
    stop_worker: str
    list_live_workers: str
    prune_workers: str


Q = RegistrationQueries


@dataclasses.dataclass(frozen=True, slots=True)
class LiveWorker:
    """A worker that heartbeated lately: where it runs, how, and its counters so far."""

    worker_id: str
    host: str
    pid: int
    mode: str
    concurrency: int
    heartbeat_age_seconds: float
    counters: dict[str, Any]


async def at_start(write: Callable[[], Awaitable[T]], stopping: anyio.Event | None = None) -> T:
    """Run a worker's start-up write; a transient failure (a failover as the worker starts) is
    retried with backoff until it succeeds, or raised once `stopping` is set."""
    failures = 0
    while True:
        try:
            return await write()
        except Exception as exc:
            if not db.transient(exc) or (stopping is not None and stopping.is_set()):
                raise
            failures += 1
            await anyio.sleep(backoff_delay(failures, base=0.5, cap=5.0, rand=random.random))


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclasses.dataclass(frozen=True, slots=True)
class Registration:
    executor: Executor
    worker_id: str
    mode: str
    concurrency: int

    async def register(self, stopping: anyio.Event | None = None) -> None:
        """Write the registry row, retried as `at_start` says."""

        async def write() -> None:
            async with db.acquire(self.executor) as conn:
                await conn.execute(
                    Q.register_worker,
                    self.worker_id,
                    socket.gethostname(),
                    os.getpid(),
                    self.mode,
                    self.concurrency,
                )

        await at_start(write, stopping)

    async def heartbeat(self, counters: dict[str, Any]) -> None:
        async with db.acquire(self.executor) as conn:
            await conn.execute(Q.heartbeat_worker, self.worker_id, counters)

    async def stop(self, counters: dict[str, Any]) -> None:
        async with db.acquire(self.executor) as conn:
            await conn.execute(Q.stop_worker, self.worker_id, counters)


async def live_workers(executor: Executor, within: float = LIVE_WITHIN) -> list[LiveWorker]:
    """Workers that heartbeated within `within` seconds and have not stopped, oldest first."""
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.list_live_workers, within)
    return [
        LiveWorker(
            r["worker_id"],
            r["host"],
            r["pid"],
            r["mode"],
            r["concurrency"],
            r["heartbeat_age"],
            r["counters"],
        )
        for r in rows
    ]


async def prune_workers(conn: Connection, *, retention_hours: int, batch_size: int) -> int:
    """Delete rows of workers stopped or silent for `retention_hours`; how many went."""
    return await db.prune(conn, Q.prune_workers, retention_hours, batch=batch_size)


def registry_counters(totals: BatchCounts, tally: Counter[tuple[str, str]]) -> dict[str, Any]:
    """What a worker's registry row shows: its run's totals, and per projector the events it
    applied, skipped and failed (`tally`: (projector, outcome) -> events)."""
    names = sorted({name for name, _ in tally})
    outcomes = ("applied", "skipped", "failed")
    per = [{"projector": n, **{o: tally[(n, o)] for o in outcomes}} for n in names]
    return {**vars(totals), "projectors": per}
