"""The catch-up engine (S30): an ordered projector's track built from the journal, bucket by
bucket, in parallel, throttled, resumable and cancellable, with its progress.

`build()` walks every bucket's campaigns in key order, `CAMPAIGNS` at a time: the next
campaigns' checkpoint keys are made first, committed alone (`outbox_build_keys`), so that a
batch claiming one of them afterwards waits for the build's lock rather than read the key as
missing; then each step locks, `FOR UPDATE SKIP LOCKED` and in the claim's order, the campaign
rows of those that have one, then the keys (`outbox_build_step`: a campaign whose row or key a
batch holds is skipped, never waited for: the batch heals the projector itself, S17, or leaves
it a catch-up hold, S25), reads the projector's events from each checkpoint to the campaign's
head by the journal's type index, at most `EVENTS` of them a transaction (`span`: the
positions a step spans follow the projector's share of the journal), runs the projector on
them (a batch projector in one call, `replaying()` true), and moves the checkpoints in the
same transaction. `connections` tasks take the buckets in turn, each bucket held by one build
at a time (a session advisory lock per bucket), and `max_rate` caps the events applied per
second over all. One build of a projector runs at a time (its lock on the whole); the workers
run it too (`worker.catch_ups`).

In place (`projections-rebuild`, the repair, S19), each campaign is first reset (the
projector's reset hook) and re-applied from its first event, in the same transaction as its
first step; the last campaign reset in each bucket is the rebuild's resume point, moved in
that transaction. A campaign a batch holds is waited for (it must be reset), not skipped.

The checkpoints (in place, and the resume points) are all it resumes from: a build killed,
cancelled or cut off by a server restart leaves every committed step in place, each with its
part of the progress (`builds`), and the next build goes on from them.

A failing event fails its step; the step runs again campaign by campaign, and a campaign that
fails alone is left where its checkpoint stands (in place: not reset; a catch-up gives it a
catch-up hold, S24). It owns the engine; the statements it runs are the checkpoints'
(guards), the journal's (append.journal), the settle's and the record's (builds).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import anyio

from outbox import db
from outbox.append.journal import batch_of, count_typed, decode_bulk, load_ranges
from outbox.buckets import bucket_count
from outbox.errors import ConfigError, Conflict
from outbox.projection.builds import (
    Built,
    Kind,
    Part,
    Progress,
    Throttle,
    buildable,
    count_totals,
    open_build,
    planned,
    read_parts,
    record_part,
    record_progress,
)
from outbox.projection.builds import Q as BuildsQ
from outbox.projection.known import check_recorded
from outbox.projection.pace import LivePace
from outbox.projection.redeliver import redeliver
from outbox.projection.registry import Projector
from outbox.projection.span import Count, Range, Span, plan, trim
from outbox.queries import Queries
from outbox.queue.settle import settle
from outbox.retry import leaves

__all__ = [
    "CAMPAIGNS",
    "DEFAULT_CONNECTIONS",
    "EVENTS",
    "Built",
    "Progress",
    "build",
    "buildable",
    "planned",
]

# Campaigns one step looks at, and the projector's events one step applies at most.
CAMPAIGNS = 500
EVENTS = 5000
# A build's connections unless told: two, which on a small server leaves the live workers
# their share of the cores (docs/performance.md measures it beside live appends).
DEFAULT_CONNECTIONS = 2
# The bucket of the lock a build holds as a whole (outbox_lock_build_bucket); tries to take it
# while a sweep holds it shared, and the pause between them.
WHOLE = -1
WHOLE_TRIES = 100
WHOLE_PAUSE = 0.02
# Seconds between records of a build's state, and an in-place rebuild's pause before it looks
# again at a campaign a batch holds.
RECORD_EVERY = 1.0
WAIT_FOR_BATCH = 0.02


class BuildQueries(Queries):
    create_build_keys: str
    lock_build_step: str
    lock_build_bucket: str
    hold_failed_campaigns: str
    list_queued_campaigns: str


Q = BuildQueries


async def build(
    pool: db.Pool,
    projector: Projector,
    *,
    connections: int = 1,
    max_rate: float | None = None,
    progress: Callable[[Progress], None] | None = None,
    in_place: bool = False,
    leave_queued: bool = False,
) -> Built:
    """Build `projector`'s track from the journal to every campaign's head (see the module
    docstring), or, `in_place`, rebuild it: each campaign reset and re-applied from its first
    event. `connections` tasks (the pool needs two connections more: one holds the build as a
    whole and records its progress, one counts what it lacks at first; a lease-mode
    projector's replay calls it with the pool too), at most `max_rate` events per second;
    `progress` after every step. A build of the projector that did not complete is resumed.
    Cancelling the caller's scope stops it between steps or rolls the one in flight back.
    Another build of the projector running is a Conflict. `leave_queued` (a catch-up the
    workers run, S25): a campaign with work rows is left to their claim, which heals the
    projector from the journal before its rows (S17), counted skipped."""
    if connections < 1:
        raise ConfigError(f"connections must be at least 1, not {connections}")
    if max_rate is not None and max_rate <= 0:
        raise ConfigError(f"max_rate must be above 0, not {max_rate}")
    kind = buildable(projector, in_place=in_place)
    await check_recorded(pool, [projector])  # what it owes is what the record says (S33)
    async with db.acquire(pool) as whole:
        await _hold_whole(whole, projector.name)
        try:
            parts = await read_parts(whole, projector.name)
            state = await open_build(whole, projector.name, kind, parts)
            if not state.resumed:
                parts = {}
            walk = _Walk(pool, projector, state, Throttle(max_rate), progress, parts, kind)
            walk.leave_queued = leave_queued and kind == "catch-up"  # never in place
            return await walk.run(whole, connections)
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await whole.fetchval(Q.lock_build_bucket, projector.name, WHOLE, False)


async def _hold_whole(conn: db.Connection, name: str) -> None:
    """Take the build's whole lock: a worker's sweep holds it shared for a statement, so a try
    that fails is tried again for a while; still held, another build runs (Conflict)."""
    for _ in range(WHOLE_TRIES):
        if await conn.fetchval(Q.lock_build_bucket, name, WHOLE, True):
            return
        await anyio.sleep(WHOLE_PAUSE)
    raise Conflict(f"a build of projector {name!r} is running already (its lock is held)")


@dataclass
class _Walk:
    """One build's walk over the buckets (see `build`)."""

    pool: db.Pool
    projector: Projector
    state: Progress
    throttle: Throttle
    progress: Callable[[Progress], None] | None
    parts: dict[int, Part]  # by bucket: its counters and, in place, the last campaign reset
    kind: Kind
    pace: LivePace = field(default_factory=LivePace)
    leave_queued: bool = False  # campaigns with work rows left to the workers' claim
    span: Span = field(default_factory=lambda: Span(EVENTS))  # positions a step spans
    _started: float = field(default_factory=time.monotonic)

    def report(self) -> None:
        self.state.seconds = self._base + time.monotonic() - self._started
        if self.progress is not None:
            self.progress(self.state)

    async def run(self, whole: db.Connection, connections: int) -> Built:
        """Walk every bucket by `connections` tasks, recording the progress on `whole` once a
        second and at the end (running, stopped or complete)."""
        self._base = self.state.seconds
        buckets = list(range(await bucket_count(whole)))
        queue: Iterator[int] = iter(buckets)
        walked: list[int] = []

        async def task() -> None:
            for bucket in queue:
                async with db.acquire(self.pool) as walker:
                    if await self.bucket(walker, bucket):
                        walked.append(bucket)

        async def record() -> None:
            # What it lacks is counted beside the first steps, in a snapshot taken before them
            # (none counted both done and lacking), ended once counted.
            async with (
                db.acquire(self.pool) as counter,
                counter.transaction(isolation="repeatable_read", readonly=True),
            ):
                await counter.execute(BuildsQ.set_build_count_unbounded)
                taken.set()
                kind = self.kind == "in-place"
                lacking = await planned(counter, self.projector, in_place=kind, cursors=cursors)
            await count_totals(whole, self.state, lacking)
            counted.set()
            while True:
                await anyio.sleep(RECORD_EVERY)
                await record_progress(whole, self.state, "running")

        cursors = {b: p.after for b, p in self.parts.items() if self.kind != "catch-up" and p.after}
        taken, counted = anyio.Event(), anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                recorder = anyio.CancelScope()

                async def recording() -> None:
                    with recorder:
                        await record()

                tg.start_soon(recording)
                await taken.wait()
                async with anyio.create_task_group() as walkers:
                    for _ in range(min(connections, len(buckets))):
                        walkers.start_soon(task)
                await counted.wait()
                recorder.cancel()
        except BaseExceptionGroup as group:  # one task's failure: the build's, as it was raised
            raise leaves(group)[0] from None
        finally:
            self.state.done = len(walked) == len(buckets)
            self.report()
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                ended = "complete" if self.state.done else "stopped"
                await record_progress(whole, self.state, ended)
        return Built(self.state)

    async def bucket(self, conn: db.Connection, bucket: int) -> bool:
        """Walk one bucket's campaigns (held by this build alone); False when another build
        holds it (it walks it)."""
        name = self.projector.name
        if not await conn.fetchval(Q.lock_build_bucket, name, bucket, True):
            return False
        try:
            step = _Step(bucket, None, self.parts.setdefault(bucket, Part()))
            while await self.step(conn, step):
                self.report()
                # The cap counts the projector's events, as the progress does (not the journal
                # positions walked past: a projector of sparse types would crawl), and waits
                # between steps, outside their transactions (no lock held while it waits);
                # the live path's wait paces it first (live first, `LivePace`).
                await self.pace.step_done(conn, step.applied)
                await self.throttle.take(step.applied)
                if step.waiting:  # in place: a batch holds a campaign not reset yet
                    await anyio.sleep(WAIT_FOR_BATCH)
            self.report()
            return True
        finally:
            await conn.fetchval(Q.lock_build_bucket, name, bucket, False)

    async def step(self, conn: db.Connection, step: _Step) -> bool:
        """One step of `step`'s bucket after its cursor: whether the bucket has more. What it
        did is recorded in its transaction (the bucket's part), then counted in the progress."""
        name, bucket, part = self.projector.name, step.bucket, step.part
        if self.kind == "replay":
            return await self.redeliver(conn, step)
        campaigns = await conn.fetchval(Q.create_build_keys, name, bucket, step.after, CAMPAIGNS)
        if not campaigns:
            return False
        got = Part()
        looked, queued = campaigns, set[str]()
        if self.leave_queued:  # left to the workers' claim
            queued = {r[0] for r in await conn.fetch(Q.list_queued_campaigns, bucket, campaigns)}
            campaigns = [c for c in looked if c not in queued]
        async with conn.transaction():
            rows = await conn.fetch(Q.lock_build_step, name, bucket, campaigns) if campaigns else []
            in_place = self.kind == "in-place"
            p = plan(rows, in_place=in_place, reset_after=part.after, span=self.span.positions)
            if p.positions() > EVENTS:  # wider than the budget: counted in its events
                await trim(p, self._counter(conn, bucket), EVENTS)
            cursor = looked[-1]
            if p.stop is not None:
                cursor = rows[p.stop - 1]["campaign_id"] if p.stop else step.after
            # Those it could not lock before where it stopped (a waited-for one is at `stop`).
            step.waiting = p.waiting
            got.skipped = sum(not r["locked"] for r in rows[: p.stop])
            # The campaigns left to the workers up to where the next step looks again.
            upto = looked.index(cursor) + 1 if cursor in looked else 0
            got.skipped += sum(c in queued for c in looked[:upto])
            ranges = p.ranges
            if ranges:
                await self.isolated(conn, bucket, ranges, got)
                self.span.found(p.positions(), got.events, EVENTS)
            if got.failing and self.kind == "catch-up":
                # Left where its checkpoint stands: the workers' holds count its attempts.
                await conn.fetchval(
                    Q.hold_failed_campaigns, name, [bucket] * len(got.failing), got.failing
                )
            if ranges or got.skipped:
                part.add(got)
                part.after = max([c for c, *_, fresh in ranges if fresh], default=part.after)
                await record_part(conn, name, bucket, part)
        self.state.count(got)  # committed: counted in the progress
        step.after, step.applied = cursor, got.events
        return True

    def _counter(self, conn: db.Connection, bucket: int) -> Count:
        """How many of the projector's events each range holds (`trim`)."""
        types = self.projector.events

        async def count(ranges: Sequence[Range]) -> dict[str, int]:
            return await count_typed(conn, [r[:3] for r in ranges], types, bucket=bucket)

        return count

    async def redeliver(self, conn: db.Connection, step: _Step) -> bool:
        """One step of a lease-mode projector's replay (`redeliver`): whether the bucket has
        more; its part recorded after the calls (a kill between gives them again)."""
        part = step.part
        given = await redeliver(
            conn, self.pool, self.projector, step.bucket, part.after, self.throttle
        )
        if given is None:
            return False
        got, part.after = given
        part.add(got)
        await record_part(conn, self.projector.name, step.bucket, part)
        self.state.count(got)
        return True

    async def isolated(
        self, conn: db.Connection, bucket: int, ranges: list[Range], got: Part
    ) -> None:
        """Apply `ranges` in a savepoint; when the projector fails, each campaign in a
        savepoint of its own, and one that fails alone is left where its checkpoint stands,
        with its projection as it was (counted)."""
        try:
            async with conn.transaction():
                await self.apply(conn, bucket, ranges, got)
            return
        except Exception as exc:
            if db.transient(exc):
                raise
            if len(ranges) == 1:
                got.failed += 1
                got.failing.append(ranges[0][0])
                return
        for one in ranges:
            await self.isolated(conn, bucket, [one], got)

    async def apply(self, conn: db.Connection, bucket: int, ranges: list[Range], got: Part) -> None:
        """Reset the campaigns of `ranges` the rebuild has not (in place), apply the journal's
        ranges and move the checkpoints to each range's end. An event that cannot be decoded
        ends its campaign's range before it (the workers' claim meets it there and fails it,
        S8)."""
        projector = self.projector
        for campaign, _, _, _, fresh in ranges:
            if fresh:
                await projector.reset_campaign(conn, campaign)
        rows = await load_ranges(
            conn,
            [(c, lo, hi) for c, lo, hi, _, _ in ranges if hi >= lo],
            bucket=bucket,
            types=projector.events,
        )
        decoded = decode_bulk(rows)
        payloads, metadata = decoded.payloads, decoded.metadata
        ends = {c: (lo, hi, whole) for c, lo, hi, whole, _ in ranges}
        if decoded.unavailable:
            for i in sorted(decoded.unavailable):
                cid, seq = rows[i]["campaign_id"], rows[i]["seq"]
                lo, hi, _ = ends[cid]
                if hi >= seq:
                    ends[cid] = (lo, seq - 1, False)
                    got.failed += 1
                    got.failing.append(cid)
            keep = [i for i, r in enumerate(rows) if r["seq"] <= ends[r["campaign_id"]][1]]
            rows = [rows[i] for i in keep]
            payloads, metadata = [payloads[i] for i in keep], [metadata[i] for i in keep]
        if rows:
            await projector.run(conn, batch_of(rows, payloads, metadata), replaying=True)
        moves = sorted((c, projector.name, hi) for c, (lo, hi, _) in ends.items() if hi >= lo)
        await settle(conn, bucket=bucket, checkpoints=moves, notify_applied=False)
        got.events += len(rows)
        got.campaigns += sum(whole for _, _, whole in ends.values())


@dataclass
class _Step:
    """A bucket's walk: the campaign after which the next step looks, the build's part there
    (in place: the last campaign reset), whether the last step waited for a batch, and the
    events it applied."""

    bucket: int
    after: str | None
    part: Part
    waiting: bool = False
    applied: int = 0  # the projector's events the last step applied (a replay: capped itself)
