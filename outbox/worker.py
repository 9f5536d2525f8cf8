"""The apply worker (S6-S12): claim a batch, apply each event in its own savepoint, settle.

`Worker.run_once()` is one batch in one transaction and returns its counts; `drain()` repeats
it until nothing is due. A batch that meets a transient database error is rolled back whole:
no row changes and no attempt is consumed (S7, S16). The worker never decides what a projector
does; it only dispatches (`projectors.apply_event`) and does the bookkeeping (`queue`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from outbox import log, queue
from outbox.projectors import ApplyOutcome, Outbox, apply_event
from outbox.queue import ClaimedRow, Failure
from outbox.retry import ErrorClass, backoff_delay, classify, describe_error

if TYPE_CHECKING:
    from outbox.db import Connection, Pool

__all__ = ["BatchCounts", "TransientBatchError", "Worker", "walk"]

_logger = log.get_logger("outbox.worker")


@dataclass
class BatchCounts:
    claimed: int = 0
    applied: int = 0
    skipped: int = 0
    failed: int = 0
    dead: int = 0

    def add(self, other: BatchCounts) -> None:
        self.claimed += other.claimed
        self.applied += other.applied
        self.skipped += other.skipped
        self.failed += other.failed
        self.dead += other.dead


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
    def _ordered(self) -> bool:
        return self.app.settings.ordering == "campaign"

    @property
    def _park(self) -> bool:
        return self.app.settings.dead_policy == "park"

    def _failure(self, row: ClaimedRow, exc: BaseException, *, permanent: bool) -> Failure:
        settings = self.app.settings
        attempts = row.attempt_count + 1
        dead = permanent or attempts >= settings.max_attempts
        delay = (
            0.0
            if dead
            else backoff_delay(
                attempts, base=settings.backoff_base, cap=settings.backoff_cap, rand=self.rand
            )
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
        settings = self.app.settings
        counts = BatchCounts()
        now = self.now()
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await queue.claim(
                conn, limit=settings.batch_size, ordered=self._ordered, park=self._park, now=now
            )
            work = walk(rows, limit=settings.batch_size, park=self._park)
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
                    if self._ordered:
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

    async def drain(self) -> BatchCounts:
        """Run batches until one claims nothing (no row is due); return the totals."""
        total = BatchCounts()
        while True:
            counts = await self.run_once()
            total.add(counts)
            if counts.claimed == 0:
                return total
