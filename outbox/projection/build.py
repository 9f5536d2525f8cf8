"""The catch-up engine (S30): an ordered projector's track built from the journal, bucket by
bucket, in parallel, throttled, resumable and cancellable, with its progress.

`build()` walks every bucket's campaigns in key order, `CAMPAIGNS` at a time: the next
campaigns' checkpoint keys are made first, committed alone (`outbox_build_keys`), so that a
batch claiming one of them afterwards waits for the build's lock rather than read the key as
missing; then each step locks, `FOR UPDATE SKIP LOCKED` and in the claim's order, the campaign
rows of those that have one, then the keys (`outbox_build_step`: a campaign whose row or key a
batch holds is skipped, never waited for: the batch heals the projector itself, S17, or leaves
it a catch-up hold, S25), reads the
journal from each checkpoint to the campaign's head, at most `EVENTS` events a transaction,
runs the projector on them (a batch projector in one call), and moves the checkpoints in the
same transaction. The checkpoints are the only state: a build killed, cancelled or cut off by
a server restart leaves every committed step in place, and the next build goes on from them.
`connections` tasks take the buckets in turn, each bucket held by one build at a time (a
session advisory lock per bucket), and `max_rate` caps the events applied per second over all.
While a build runs (its lock on the whole), the workers' sweep of the projector seeds no
catch-up hold: the build takes the campaigns on itself.

A failing event fails its step; the step runs again campaign by campaign, and a campaign that
fails alone is left where its checkpoint stands, for the workers, whose holds count its
attempts (S24). It owns the engine and its progress; the statements it runs are the
checkpoints' (guards), the journal's (append.journal) and the settle's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import anyio

from outbox import db
from outbox.append.journal import decode_bulk, load_ranges
from outbox.buckets import bucket_count
from outbox.errors import ConfigError
from outbox.model import EventBatch
from outbox.projection.registry import Projector
from outbox.queries import Queries
from outbox.queue.settle import settle
from outbox.retry import leaves

__all__ = [
    "CAMPAIGNS",
    "DEFAULT_CONNECTIONS",
    "EVENTS",
    "Built",
    "Progress",
    "Throttle",
    "build",
    "buildable",
    "planned",
]

# Campaigns one step looks at, and journal events one step applies at most.
CAMPAIGNS = 500
EVENTS = 5000
# A build's connections unless told: two, which on a small server leaves the live workers
# their share of the cores (docs/performance.md measures it beside live appends).
DEFAULT_CONNECTIONS = 2
# The bucket number of the lock a build holds as a whole (outbox_lock_build_bucket).
WHOLE = -1


class BuildQueries(Queries):
    count_build_work: str
    set_build_count_unbounded: str
    create_build_keys: str
    lock_build_step: str
    lock_build_bucket: str


Q = BuildQueries


@dataclass
class Progress:
    """Where a build stands: events of the projector's types applied of those it lacked when
    it started, campaigns brought to their head, those skipped because a batch held them (the
    workers take them on), those that failed (left to the workers' holds), and the seconds
    since it started. `rate` and `eta` follow."""

    projector: str
    events_total: int
    campaigns_total: int
    events: int = 0
    campaigns: int = 0
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0
    done: bool = False

    @property
    def rate(self) -> float:
        """Events applied per second so far."""
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far (None until it has one)."""
        if self.done:
            return 0.0
        if not self.rate:
            return None
        return max(self.events_total - self.events, 0) / self.rate

    def summary(self) -> dict[str, object]:
        """Its fields, with the rate and the ETA, for a JSON line."""
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return {**fields, "rate": round(self.rate, 1), "eta": self.eta}


@dataclass(frozen=True, slots=True)
class Built:
    """A build's end: its progress as it stood."""

    progress: Progress

    @property
    def complete(self) -> bool:
        """Whether every bucket was walked (False: cancelled)."""
        return self.progress.done


@dataclass
class Throttle:
    """At most `rate` events per second over every task of a build (None: no limit): a task
    waits before a step until the events applied so far fit the rate."""

    rate: float | None
    _started: float = field(default_factory=time.monotonic)
    _taken: int = 0

    async def take(self, events: int) -> None:
        if self.rate is None or events <= 0:
            return
        self._taken += events
        ahead = self._taken / self.rate - (time.monotonic() - self._started)
        if ahead > 0:
            await anyio.sleep(ahead)


def buildable(projector: Projector) -> None:
    """Refuse a projector the engine cannot build: one with no checkpoint (the engine's resume
    point and its guard against applying twice) or one outside the queue's transaction."""
    if not projector.ordered or not projector.transactional:
        raise ConfigError(
            f"projector {projector.name!r}: the catch-up engine builds ordered projectors (a "
            "checkpoint per campaign is its resume point); an unordered one with markers catches "
            "up through the workers' sweep (S25)"
        )


async def planned(executor: db.Executor, projector: Projector) -> Progress:
    """What a build of `projector` would apply now: its progress before the first step."""
    buildable(projector)
    async with db.acquire(executor) as conn, conn.transaction():
        await conn.execute(Q.set_build_count_unbounded)
        row = await conn.fetchrow(Q.count_build_work, projector.name, sorted(projector.events))
    assert row is not None  # an aggregate: one row
    return Progress(projector.name, row["events"], row["campaigns"])


async def build(
    pool: db.Pool,
    projector: Projector,
    *,
    connections: int = 1,
    max_rate: float | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> Built:
    """Build `projector`'s track from the journal to every campaign's head (see the module
    docstring): `connections` tasks (the pool needs one connection more, which holds the build
    as a whole), at most `max_rate` events per second; `progress` after every step. Cancelling
    the caller's scope stops it between steps or rolls the one in flight back."""
    if connections < 1:
        raise ConfigError(f"connections must be at least 1, not {connections}")
    if max_rate is not None and max_rate <= 0:
        raise ConfigError(f"max_rate must be above 0, not {max_rate}")
    state = await planned(pool, projector)
    async with db.acquire(pool) as whole:
        # Held while it runs: the workers' sweep of it seeds no catch-up hold meanwhile.
        await whole.fetchval(Q.lock_build_bucket, projector.name, WHOLE, True)
        try:
            return await _walk(pool, projector, state, connections, max_rate, progress, whole)
        finally:
            await whole.fetchval(Q.lock_build_bucket, projector.name, WHOLE, False)


async def _walk(
    pool: db.Pool,
    projector: Projector,
    state: Progress,
    connections: int,
    max_rate: float | None,
    progress: Callable[[Progress], None] | None,
    conn: db.Connection,
) -> Built:
    """Every bucket's campaigns, by `connections` tasks (see `build`)."""
    buckets = list(range(await bucket_count(conn)))
    started = time.monotonic()
    throttle = Throttle(max_rate)
    queue: Iterator[int] = iter(buckets)
    walked: list[int] = []

    def report() -> None:
        state.seconds = time.monotonic() - started
        if progress is not None:
            progress(state)

    async def task() -> None:
        for bucket in queue:
            async with db.acquire(pool) as walker:
                if await _bucket(walker, projector, bucket, state, throttle, report):
                    walked.append(bucket)

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(min(connections, len(buckets))):
                tg.start_soon(task)
    except BaseExceptionGroup as group:  # one task's failure: the build's, as it was raised
        raise leaves(group)[0] from None
    state.done = len(walked) == len(buckets)
    report()
    return Built(state)


# A journal range a step applies: (campaign, first seq, last seq, whether that is the head).
Range = tuple[str, int, int, bool]


async def _bucket(
    conn: db.Connection,
    projector: Projector,
    bucket: int,
    state: Progress,
    throttle: Throttle,
    report: Callable[[], None],
) -> bool:
    """Walk one bucket's campaigns (held by this build alone); False when another build holds
    it (it walks it)."""
    if not await conn.fetchval(Q.lock_build_bucket, projector.name, bucket, True):
        return False
    try:
        after: str | None = None
        more = True
        while more:
            more, after = await _step(conn, projector, bucket, after, state, throttle)
            report()
        return True
    finally:
        await conn.fetchval(Q.lock_build_bucket, projector.name, bucket, False)


async def _step(
    conn: db.Connection,
    projector: Projector,
    bucket: int,
    after: str | None,
    state: Progress,
    throttle: Throttle,
) -> tuple[bool, str | None]:
    """One step after campaign `after`: whether the bucket has more, and the cursor."""
    campaigns = await conn.fetchval(Q.create_build_keys, projector.name, bucket, after, CAMPAIGNS)
    if not campaigns:
        return False, after
    async with conn.transaction():
        rows = await conn.fetch(Q.lock_build_step, projector.name, bucket, campaigns)
        ranges: list[Range] = []
        cursor, budget = rows[-1]["campaign_id"], EVENTS
        for i, r in enumerate(rows):
            if not r["locked"]:
                state.skipped += 1
                continue
            applied, head = r["applied_seq"], r["last_seq"] or 0
            if applied >= head:
                continue
            last = min(head, applied + budget)
            ranges.append((r["campaign_id"], applied + 1, last, last == head))
            budget -= last - applied
            if budget <= 0:
                # Cut here: a campaign cut short and those after it are looked at again.
                cursor = (
                    r["campaign_id"]
                    if last == head
                    else (rows[i - 1]["campaign_id"] if i else after)
                )
                break
        if ranges:
            await throttle.take(sum(hi - lo + 1 for _, lo, hi, _ in ranges))
            await _isolated(conn, projector, bucket, ranges, state)
    return True, cursor


async def _isolated(
    conn: db.Connection,
    projector: Projector,
    bucket: int,
    ranges: list[Range],
    state: Progress,
) -> None:
    """Apply `ranges` in a savepoint; when the projector fails, each campaign in a savepoint
    of its own, and one that fails alone is left where its checkpoint stands (counted)."""
    try:
        async with conn.transaction():
            await _apply(conn, projector, bucket, ranges, state)
        return
    except Exception as exc:
        if db.transient(exc):
            raise
        if len(ranges) == 1:
            state.failed += 1
            return
    for one in ranges:
        await _isolated(conn, projector, bucket, [one], state)


async def _apply(
    conn: db.Connection,
    projector: Projector,
    bucket: int,
    ranges: list[Range],
    state: Progress,
) -> None:
    """Apply the journal's `ranges` to `projector` and move its checkpoints to each range's
    end. An event that cannot be decoded ends its campaign's range before it (the workers'
    claim meets it there and fails it, S8)."""
    journal = await load_ranges(conn, [(c, lo, hi) for c, lo, hi, _ in ranges], bucket=bucket)
    rows = [r for r in journal if r["event_type"] in projector.events]
    decoded = decode_bulk(rows)
    ends = {c: (lo, hi, whole) for c, lo, hi, whole in ranges}
    for i in sorted(decoded.unavailable):
        cid, seq = rows[i]["campaign_id"], rows[i]["seq"]
        lo, hi, _ = ends[cid]
        if hi >= seq:
            ends[cid] = (lo, seq - 1, False)
            state.failed += 1
    keep = [i for i, r in enumerate(rows) if r["seq"] <= ends[r["campaign_id"]][1]]
    if keep:
        await projector.run(
            conn,
            EventBatch(
                [rows[i]["campaign_id"] for i in keep],
                [rows[i]["seq"] for i in keep],
                [rows[i]["event_type"] for i in keep],
                [decoded.payloads[i] for i in keep],
                [decoded.metadata[i] or {} for i in keep],
                [rows[i]["recorded_at"] for i in keep],
            ),
        )
    moves = sorted((c, projector.name, hi) for c, (lo, hi, _) in ends.items() if hi >= lo)
    await settle(conn, bucket=bucket, checkpoints=moves, notify_applied=False)
    state.events += len(keep)
    state.campaigns += sum(whole for _, _, whole in ends.values())
