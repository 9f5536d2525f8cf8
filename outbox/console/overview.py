"""The overview's figures, and the one poller that reads them for every open page.

`read_overview()` reads rows per status (each counted up to a bound), the oldest claimable
head, blocked campaigns, the live workers and the oldest snapshot the server holds (each read
also adds a sample to the last hour's `Trend`), in one read-only transaction under the console's
session (a statement timeout: the console never holds the database up). `Poller.get()` returns
the latest figures, reading again only when they are older than its interval, one read at a
time: ten open tabs cost what one does, and no tab costs nothing. A failed read keeps the
previous figures and says why. No SQL here: the reads are the queue's (`outbox.queue.inspect`,
`outbox.queue.horizon`) and the registry's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from time import monotonic

import anyio

from outbox import db
from outbox.console.history import Trend
from outbox.console.reads import COUNT_BOUND, reading
from outbox.queue import inspect
from outbox.queue.horizon import HorizonHolder, horizon_holder
from outbox.queue.inspect import OldestClaimable, StatusCounts
from outbox.retry import describe_error
from outbox.worker.registration import ListedWorker, listed_workers

__all__ = ["Overview", "Poller", "read_overview"]


def describe_failure(exc: BaseException) -> str:
    """A failed read in one line, saying when the database refused it or could not be
    reached."""
    if db.database_error(exc):
        return f"the database refused: {describe_error(exc)}"
    if isinstance(exc, OSError | TimeoutError):  # refused, unreachable, or no answer
        return f"the database is unreachable: {describe_error(exc)}"
    return describe_error(exc)


@dataclass(frozen=True, slots=True)
class Overview:
    """What the overview shows, as of `read_at` (the console's clock)."""

    read_at: datetime
    counts: StatusCounts  # each up to `bound`
    bound: int
    oldest_claimable: OldestClaimable | None
    blocked_campaigns: int
    workers: list[ListedWorker]
    snapshot: HorizonHolder | None  # the oldest snapshot the server holds for this database


@dataclass(frozen=True, slots=True)
class Alarms:
    """When every page shows a banner: blocked campaigns past `blocked`, the oldest claimable
    head older than `age` seconds, and (always) no live worker while work waits."""

    blocked: int = 100
    age: float = 300.0

    def raised(self, overview: Overview) -> list[str]:
        """The banners `overview` calls for, most urgent first."""
        found = []
        counts = overview.counts
        waiting = (counts.pending, counts.failed, counts.processing)
        if any(waiting) and not overview.workers:
            bounded = max(waiting) >= overview.bound  # each count stops at the bound
            said = f"{overview.bound:,}+" if bounded else f"{sum(waiting):,}"
            found.append(f"no worker is alive while {said} rows wait")
        if overview.blocked_campaigns > self.blocked:
            found.append(
                f"{overview.blocked_campaigns:,} campaigns are blocked behind a dead or "
                f"failing head (more than {self.blocked:,})"
            )
        oldest = overview.oldest_claimable
        if oldest is not None and oldest.age_seconds > self.age:
            found.append(
                f"the oldest claimable head ({oldest.campaign_id} seq {oldest.seq}) has waited "
                f"{oldest.age_seconds:,.0f} s (more than {self.age:,.0f} s)"
            )
        return found


async def read_overview(executor: db.Executor, *, park: bool, bound: int) -> Overview:
    async with reading(executor) as conn:
        counts = await inspect.count_rows_bounded(conn, bound)
        oldest = await inspect.oldest_claimable(conn, park=park)
        _, blocked = await inspect.blocked_campaigns(conn, park=park, limit=1, waiting_bound=1)
        workers = await listed_workers(conn)
        snapshot = await horizon_holder(conn)
    return Overview(datetime.now(UTC), counts, bound, oldest, blocked, workers, snapshot)


@dataclass
class Poller:
    """The latest overview, read at most once per `interval` seconds (see the module)."""

    pool: db.Pool
    park: bool = False
    interval: float = 5.0
    bound: int = COUNT_BOUND
    alarms: Alarms = field(default_factory=Alarms)
    latest: Overview | None = None
    error: str | None = None  # why the last read failed (None: it did not)
    reads: int = 0  # reads made so far
    trend: Trend = field(default_factory=Trend)  # the last hour, one sample per read
    _read_at: float = field(default=float("-inf"), repr=False)
    _lock: anyio.Lock = field(default_factory=anyio.Lock, repr=False)

    async def get(self) -> Overview | None:
        async with self._lock:
            if monotonic() - self._read_at >= self.interval:
                await self._read()
        return self.latest

    def invalidate(self) -> None:
        """Read again at the next `get()` (an action changed what the figures show)."""
        self._read_at = float("-inf")

    async def _read(self) -> None:
        self.reads += 1
        try:
            self.latest = latest = await read_overview(self.pool, park=self.park, bound=self.bound)
            self.error = None
            applied = {w.worker_id: int(w.counters.get("applied", 0)) for w in latest.workers}
            oldest = latest.oldest_claimable
            self.trend.add(latest.read_at, applied, oldest.age_seconds if oldest else None)
        except Exception as exc:  # the page shows the last figures and why they are old
            self.error = describe_failure(exc)
        finally:
            self._read_at = monotonic()
