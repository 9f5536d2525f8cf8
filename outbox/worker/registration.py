"""The worker registry: each worker process registers, heartbeats and signs off.

It owns every statement on `outbox_workers` and nothing else; the report reads the workers
through `listed_workers()` (live, or stale when silent for three heartbeats), cleanup prunes
old rows with `prune_workers()`. Losing a heartbeat never affects correctness, only what the
report shows.
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
    "LISTED_FOR",
    "LIVE_WITHIN",
    "ListedWorker",
    "Registration",
    "at_start",
    "listed_workers",
    "new_worker_id",
    "prune_workers",
    "registry_counters",
]

T = TypeVar("T")

HEARTBEAT_INTERVAL = 5.0
# A worker silent for three heartbeats is stale (killed, frozen, cut off), no longer live; one
# silent for an hour is no longer listed.
LIVE_WITHIN = 3 * HEARTBEAT_INTERVAL
LISTED_FOR = 3600.0


class RegistrationQueries(Queries):
    register_worker: str
    heartbeat_worker: str
    stop_worker: str
    list_workers: str
    prune_workers: str


Q = RegistrationQueries


@dataclasses.dataclass(frozen=True, slots=True)
class ListedWorker:
    """A worker that heartbeated within the last hour and has not stopped: where it runs,
    how, its heartbeat's age, whether it is `live` or `stale` (silent for three heartbeats:
    killed, frozen or cut off), and its counters so far."""

    worker_id: str
    host: str
    pid: int
    mode: str
    concurrency: int
    heartbeat_age_seconds: float
    state: str
    counters: dict[str, Any]
    # The projectors it runs, each with its definition's fingerprint (S33); None: a worker of
    # a release before definitions, or a shadow worker.
    projectors: dict[str, str] | None = None

    @property
    def live(self) -> bool:
        return self.state == "live"


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
    # The projectors it runs at start (projector -> fingerprint; None: none, a shadow worker).
    projectors: dict[str, str] | None = None

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
                    self.projectors,
                )

        await at_start(write, stopping)

    async def heartbeat(
        self, counters: dict[str, Any], projectors: dict[str, str] | None = None
    ) -> None:
        async with db.acquire(self.executor) as conn:
            await conn.execute(
                Q.heartbeat_worker, self.worker_id, counters, projectors or self.projectors
            )

    async def stop(self, counters: dict[str, Any]) -> None:
        async with db.acquire(self.executor) as conn:
            await conn.execute(Q.stop_worker, self.worker_id, counters)


async def listed_workers(executor: Executor, within: float = LISTED_FOR) -> list[ListedWorker]:
    """Workers that heartbeated within `within` seconds and have not stopped, oldest first,
    each live or stale (`LIVE_WITHIN`)."""
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.list_workers, within)
    return [
        ListedWorker(
            r["worker_id"],
            r["host"],
            r["pid"],
            r["mode"],
            r["concurrency"],
            r["heartbeat_age"],
            "live" if r["heartbeat_age"] <= LIVE_WITHIN else "stale",
            r["counters"],
            r["projectors"],
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
