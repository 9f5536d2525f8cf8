"""The queue's generations kept short (S26): every worker rotates the queue.

Work rows and campaign rows live in three slots each, one per ten-second period in turn
(migration 0008; `rotation_fn.sql`). `rotate()` empties the oldest slot once its period is
over: its live rows move to the current one and it is truncated, which gives back the space
and index entries of every version a snapshot held elsewhere keeps alive (vacuum may not
remove them). `keep_rotating()` is the worker's task: every `INTERVAL` seconds one call, which
finds the slot empty on most calls (one statement); each outcome is counted
(`outbox_queue_rotations_total{outcome}`): rotations that stay `busy` meet a session that holds
the old slot's lock (a `pg_dump`). A rotation waits at most `LOCK_TIMEOUT` for the slot's
locks, so readers and batches never queue behind it for longer, and a busy slot is tried again
at the next call. Rotations of one install never overlap (an advisory lock).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

import anyio

from outbox import db
from outbox.obs import log
from outbox.queries import Queries
from outbox.retry import describe_error

if TYPE_CHECKING:
    from outbox.db import Executor
    from outbox.obs.metrics import Metrics

__all__ = ["INTERVAL", "LIVE_LIMIT", "LOCK_TIMEOUT", "Rotation", "keep_rotating", "rotate"]

_logger = log.get_logger("outbox.rotation")

INTERVAL = 2.0  # seconds between a worker's rotation calls (periods are 10 s)
LOCK_TIMEOUT = 0.05  # seconds a rotation waits for the oldest slot's lock
LIVE_LIMIT = 10_000  # live rows a rotation moves at most; more: a backlog, left to vacuum

Outcome = Literal["empty", "busy", "backlog", "rotated"]


class RotationQueries(Queries):
    rotate_queue: str


Q = RotationQueries


@dataclass(frozen=True, slots=True)
class Rotation:
    """One call's result: the oldest `slot`, what became of it (`empty` already, `busy`: its
    lock or another rotation was in the way, `backlog`: more than the limit live, `rotated`)
    and the live rows it moved (for `backlog`, the live rows counted: the limit plus one)."""

    slot: int
    outcome: Outcome
    moved: int


async def rotate(
    executor: Executor,
    *,
    limit: int = LIVE_LIMIT,
    lock_timeout: float = LOCK_TIMEOUT,
    now: datetime | None = None,
) -> Rotation:
    """Empty the campaign queue's oldest slot, in a transaction of its own (`executor` must
    not be in one: the slot stays locked until the rotation commits)."""
    async with db.acquire(executor) as conn, conn.transaction():
        row = await conn.fetchrow(Q.rotate_queue, limit, max(1, round(lock_timeout * 1000)), now)
    assert row is not None  # the function always returns one row
    return Rotation(row["slot"], row["outcome"], row["moved"])


async def keep_rotating(
    executor: Executor, metrics: Metrics | None = None, interval: float = INTERVAL
) -> None:
    """Rotate every `interval` seconds until cancelled, each outcome counted in `metrics`
    (`outbox_queue_rotations_total`). A rotation that moved rows or found a backlog is logged;
    a failure is logged and tried again at the next call (it never stops the worker)."""
    while True:
        await anyio.sleep(interval)
        try:
            done = await rotate(executor)
        except Exception as exc:  # upkeep never stops the work
            _logger.warning("rotation.failed", extra={"error": describe_error(exc)})
            if metrics is not None:
                metrics.rotations.labels("failed").inc()
            continue
        if metrics is not None:
            metrics.rotations.labels(done.outcome).inc()
        if done.outcome == "rotated":
            _logger.debug("rotation.rotated", extra={"slot": done.slot, "moved": done.moved})
        elif done.outcome == "backlog":
            _logger.info("rotation.backlog", extra={"slot": done.slot, "live": done.moved})
