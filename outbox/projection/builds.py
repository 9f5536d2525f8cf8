"""A build of the catch-up engine (`build.py`, S30) as a plan and a record: its kind
(`buildable`: a catch-up, an in-place rebuild, or a lease-mode projector's replay), what it
lacks when it starts (`planned`), its progress and pace (`Throttle`), and what it has done,
kept for the report, the console and the metrics. `outbox_builds` holds a build's kind,
state, totals and seconds (recorded once a second); `outbox_build_buckets` its part in each
bucket, moved in each step's transaction: its counters, and an in-place rebuild's or a
replay's resume point (the last campaign it reset or gave again there).

A build that did not complete (cancelled, killed, cut off by a server restart) is resumed by
the next build of the same projector of the same kind: its counters go on from where its
committed steps left them, and its totals become what it did plus what it lacks now. The
record never decides what is applied: the checkpoints do, and the resume points say which
campaigns an in-place rebuild has reset already (a replay's, which it has given again).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import anyio

from outbox import db
from outbox.errors import ConfigError, Conflict
from outbox.projection.registry import Projector
from outbox.queries import Queries

__all__ = [
    "COUNTS",
    "Build",
    "Built",
    "Kind",
    "Part",
    "Progress",
    "Throttle",
    "add_counts",
    "buildable",
    "count_totals",
    "list_builds",
    "open_build",
    "planned",
    "read_parts",
    "record_part",
    "record_progress",
]

Kind = Literal["catch-up", "in-place", "replay"]


class BuildsQueries(Queries):
    count_build_work: str
    set_build_count_unbounded: str
    get_build: str
    create_build: str
    resume_build: str
    record_build_totals: str
    record_build_progress: str
    list_builds: str
    list_build_buckets: str
    record_build_bucket: str
    delete_build_buckets: str


Q = BuildsQueries


@dataclass
class Progress:
    """Where a build stands: events of the projector's types applied of those it lacked (from
    its first start, across resumes), campaigns brought to their head, those skipped because a
    batch held them (the workers take them on), those that failed (left to the workers), and
    its seconds of running. `rate` and `eta` follow."""

    projector: str
    events_total: int
    campaigns_total: int
    events: int = 0
    campaigns: int = 0
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0
    done: bool = False
    kind: Kind = "catch-up"
    resumed: bool = False
    counted: bool = False  # whether the totals are known (counted beside the first steps)

    def count(self, got: Part) -> None:
        """Count a committed step's events, campaigns, skips and failures in; the totals (once
        counted) grow to what was done, which appends made since the count may pass."""
        add_counts(self, got)
        self.lift()

    def lift(self) -> None:
        """Totals never below what was done: the count is of what the projector lacked as
        the build began, and it walks each campaign to the head it has when it gets there."""
        if self.counted:
            self.events_total = max(self.events_total, self.events)
            self.campaigns_total = max(self.campaigns_total, self.campaigns)

    @property
    def left(self) -> int:
        """Of its totals, the events it did not apply: the campaigns batches held (the workers
        bring the projector up to date there) and those failing; until it is done, still to go."""
        return max(self.events_total - self.events, 0)

    @property
    def rate(self) -> float:
        """Events applied per second so far."""
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far (None until it has one)."""
        if self.done:
            return 0.0
        if not self.rate or not self.counted:
            return None
        return max(self.events_total - self.events, 0) / self.rate

    def summary(self) -> dict[str, object]:
        """Its fields, with the rate and the ETA, for a JSON line."""
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return {**fields, "rate": round(self.rate, 1), "eta": self.eta}


@dataclass
class Throttle:
    """At most `rate` of the projector's events per second over every task of a build (None:
    no limit): a task waits after a step (a replay: before its calls) until the events
    applied so far fit the rate."""

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


@dataclass(frozen=True, slots=True)
class Built:
    """A build's end: its progress as it stood."""

    progress: Progress

    @property
    def complete(self) -> bool:
        """Whether every bucket was walked (False: cancelled)."""
        return self.progress.done


@dataclass
class Part:
    """A build's part in one bucket: its counters there and, in place, the last campaign it
    reset there (None: none yet)."""

    after: str | None = None
    events: int = 0
    campaigns: int = 0
    skipped: int = 0
    failed: int = 0
    # A step's campaigns left where their checkpoints stand by a failure (not recorded, not
    # added up: the step gives each a catch-up hold).
    failing: list[str] = field(default_factory=list, compare=False, repr=False)

    def add(self, step: Part) -> None:
        """Count a step's events, campaigns, skips and failures in."""
        add_counts(self, step)


# What a build counts, in a bucket's part and in its progress alike.
COUNTS = ("events", "campaigns", "skipped", "failed")


def add_counts(into: Part | Progress, got: Part) -> None:
    """Add what `got` counted (`COUNTS`) into a part or a progress."""
    for name in COUNTS:
        setattr(into, name, getattr(into, name) + getattr(got, name))


@dataclass(frozen=True, slots=True)
class Build:
    """A projector's latest build as recorded: its kind (catch-up or in-place), `running`,
    `stopped` (ended early, or recorded running by a process that is gone: no session holds
    the build's lock) or `complete`; its counters and totals, its seconds of running, its rate
    and, while it runs, its ETA in seconds; when it started and last recorded progress."""

    projector: str
    kind: str
    state: str
    started_at: datetime
    updated_at: datetime
    events_total: int
    campaigns_total: int
    events: int
    campaigns: int
    skipped: int
    failed: int
    seconds: float
    rate: float
    eta: float | None


def buildable(projector: Projector, *, in_place: bool = False) -> Kind:
    """The kind of build `projector` takes (`in_place`: a rebuild), or a ConfigError: the
    engine builds ordered projectors (a checkpoint per campaign is its resume point and its
    guard against applying twice), in place only with a reset hook, and gives a lease-mode
    projector its history again only when it asks (`replay=True`, S31)."""
    if not projector.transactional:
        if not projector.replay:
            raise ConfigError(
                f"projector {projector.name!r} runs in lease mode, with side effects outside "
                "the database: its history is never given again unless it is registered with "
                "replay=True"
            )
        return "replay"
    if not projector.ordered:
        raise ConfigError(
            f"projector {projector.name!r}: the catch-up engine builds ordered projectors (a "
            "checkpoint per campaign is its resume point); an unordered one with markers catches "
            "up through the workers' sweep (S25)"
        )
    if in_place and projector.reset is None:
        raise ConfigError(
            f"projector {projector.name!r} has no reset hook: register it with reset= to "
            "rebuild it in place"
        )
    return "in-place" if in_place else "catch-up"


async def planned(
    executor: db.Executor,
    projector: Projector,
    *,
    in_place: bool = False,
    cursors: Mapping[int, str] | None = None,
) -> Progress:
    """What a build of `projector` would apply now: its progress before the first step. In
    place: every event of its types in the campaigns not reset yet (after `cursors`); a
    replay: every event of its types after `cursors`."""
    kind = buildable(projector, in_place=in_place)
    cursors = cursors or {}
    after: list[str | None] = [None] * (max(cursors, default=-1) + 1)
    for bucket, campaign in cursors.items():
        after[bucket] = campaign
    async with db.acquire(executor) as conn, conn.transaction():
        await conn.execute(Q.set_build_count_unbounded)
        row = await conn.fetchrow(
            Q.count_build_work, projector.name, sorted(projector.events), kind, after
        )
    assert row is not None  # an aggregate: one row
    return Progress(projector.name, row["events"], row["campaigns"])


async def open_build(
    conn: db.Connection, name: str, kind: Kind, parts: Mapping[int, Part]
) -> Progress:
    """Record a build of projector `name` starting, its totals not counted yet (`counted`):
    the one recorded, when it did not complete and was of `kind`, resumed (its counters the
    sums of its `parts`, `resumed` set); else a new one, its buckets' parts gone. An in-place
    rebuild that stopped half way is finished before anything else builds the projector
    (Conflict)."""
    row = await conn.fetchrow(Q.get_build, name)
    if row is not None and row["state"] != "complete":
        done = Part()
        for part in parts.values():
            done.add(part)
        if row["kind"] != kind and row["kind"] == "in-place":
            raise Conflict(
                f"an in-place rebuild of {name!r} stopped half way ({done.events:,} events "
                "re-applied): finish it first (run maintenance projections-rebuild again)"
            )
        if row["kind"] == kind:
            await conn.execute(Q.resume_build, name)
            resumed = Progress(
                name, done.events, done.campaigns, seconds=row["seconds"], kind=kind,
                resumed=True,
            )  # fmt: skip
            add_counts(resumed, done)
            return resumed
    async with conn.transaction():
        await conn.execute(Q.delete_build_buckets, name)
        await conn.execute(Q.create_build, name, kind)
    return Progress(name, 0, 0, kind=kind)


async def count_totals(conn: db.Connection, progress: Progress, lacking: Progress) -> None:
    """Set `progress`'s totals, and the record's: what it had done when it started (carried
    from a resume) and what it `lacking` then (`planned`, counted as it began)."""
    progress.events_total += lacking.events_total
    progress.campaigns_total += lacking.campaigns_total
    progress.counted = True
    progress.lift()
    await conn.execute(
        Q.record_build_totals, progress.projector, progress.events_total, progress.campaigns_total
    )


async def record_progress(conn: db.Connection, progress: Progress, state: str) -> None:
    """Record `progress`'s state (running, stopped or complete) and seconds of running."""
    await conn.execute(Q.record_build_progress, progress.projector, state, progress.seconds)


async def read_parts(conn: db.Connection, projector: str) -> dict[int, Part]:
    """A build's parts, by bucket (for its resume)."""
    return {
        r["bucket"]: Part(
            r["after_campaign"], r["events"], r["campaigns"], r["skipped"], r["failed"]
        )
        for r in await conn.fetch(Q.list_build_buckets, projector)
    }


async def record_part(conn: db.Connection, projector: str, bucket: int, part: Part) -> None:
    """Record a build's part in `bucket` as it stands (in the step's transaction)."""
    await conn.execute(
        Q.record_build_bucket, projector, bucket, part.after, part.events, part.campaigns,
        part.skipped, part.failed,
    )  # fmt: skip


async def list_builds(executor: db.Executor) -> list[Build]:
    """Every projector's latest build; one recorded running whose lock no session holds reads
    as stopped (its process was killed)."""
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.list_builds)
    found = []
    for r in rows:
        state = "stopped" if r["state"] == "running" and not r["held"] else r["state"]
        events, campaigns, skipped, failed = (r[k] or 0 for k in COUNTS)
        # Its rate, and its ETA while it runs, as its progress has them.
        progress = Progress(
            r["projector"], r["events_total"], r["campaigns_total"], events, campaigns,
            skipped, failed, r["seconds"], counted=True,
        )  # fmt: skip
        eta = progress.eta if state == "running" else None
        found.append(
            Build(
                r["projector"],
                r["kind"],
                state,
                r["started_at"],
                r["updated_at"],
                r["events_total"],
                r["campaigns_total"],
                events,
                campaigns,
                skipped,
                failed,
                r["seconds"],
                round(progress.rate, 1),
                None if eta is None else round(eta, 1),
            )
        )
    return found
