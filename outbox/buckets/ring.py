"""Which bucket a worker's next batch claims from: a round-robin over the buckets known to be due.

On one server an ordered batch claims across buckets (`SPAN`): the ring then knows one bucket,
due when any campaign is, read by one probe of the install's due-order index. Under Citus (and
for claims of rows, ordering `none`) a batch claims and settles in one bucket (every statement
on one shard). The ring
knows, per bucket, when its earliest work falls due; `take()` hands out the next bucket due now
after the last one taken, so concurrent claim loops and a backlog spread over the buckets are
served in turn, and no claim scans buckets that have nothing. The knowledge comes from
`outbox_due_buckets` (one index probe per bucket), read again when it is older than the poll
interval, when a retry an idle loop looked up falls due (`expect`) or (a drain's ring, not
`live`) when no bucket is known to be due, and from wake-ups: an append's NOTIFY names its
bucket (`wake`), and a batch reports what it left (`found`). Being wrong costs little either
way: a bucket wrongly thought due yields an empty claim and is dropped; one wrongly thought idle
is found at the next refresh, within a poll interval. A bucket whose batch failed is dropped too
and comes back with the next read that finds it due.

A wake-up is news until a claim in its bucket is taken after it: that claim's statement, sent
later, sees the append the NOTIFY announced (it commits before it notifies), and takes it or
reports more. So a loop rung for news that a later take covered neither claims (its claim would
find the campaign held by the batch in flight, and come back empty) nor reads the buckets (the
read would see that campaign due and send it to claim all the same); and a batch that reports
nothing left does not drop news that came after its take: the loop rung for it claims at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from outbox import db
from outbox.buckets.key import SPAN
from outbox.db import Executor
from outbox.queries import Queries

__all__ = ["SPAN_RECHECK", "BucketRing", "due_buckets", "spans"]

# Seconds between reads of whether the install is distributed (`BucketRing.span`).
SPAN_RECHECK = 60.0


class RingQueries(Queries):
    list_due_buckets: str
    get_spans: str
    get_install_due_in: str


Q = RingQueries


async def due_buckets(
    executor: Executor,
    *,
    rows: bool,
    now: datetime | None = None,
    span: bool = False,
    later: bool = False,
) -> list[tuple[int, float]]:
    """(bucket, seconds until due by the database clock or `now`; <= 0: due now) for every
    bucket with work: campaign rows, or live work rows (`rows`, ordering `none`). One index
    probe per bucket (`outbox_due_buckets`, ring_fn.sql); with `span` (campaign rows, one
    server) one probe of the install's due-order index, answered as `SPAN`. `later`: only
    work not due yet counts."""
    async with db.acquire(executor) as conn:
        if span and not rows:
            due_in: float | None = await conn.fetchval(Q.get_install_due_in, now, later)
            return [] if due_in is None else [(SPAN, due_in)]
        records = await conn.fetch(Q.list_due_buckets, rows, now, later)
    return [(r["bucket"], r["due_in"]) for r in records]


async def spans(executor: Executor) -> bool:
    """Whether a worker's ordered batches claim across buckets (`SPAN`): on one server, not on
    Citus (ring.sql)."""
    async with db.acquire(executor) as conn:
        return bool(await conn.fetchval(Q.get_spans))


@dataclass
class BucketRing:
    """The buckets with work a worker knows of, and when each is due (monotonic seconds)."""

    rows: bool  # ordering `none` (and the shadow worker): due work rows, not campaigns
    poll_interval: float
    clock: Callable[[], float] = time.monotonic
    due: dict[int, float] = field(default_factory=dict)
    read_from: float | None = None  # when the last read began: it saw what committed before
    stale: bool = True  # a wake-up without a bucket: read every bucket again
    last: int = -1
    _lock: anyio.Lock = field(default_factory=anyio.Lock, repr=False)
    _told: dict[int, float] = field(default_factory=dict, repr=False)  # wake-ups, batches' news
    _news: dict[int, float] = field(default_factory=dict, repr=False)  # the latest wake-up
    _taken: dict[int, float] = field(default_factory=dict, repr=False)  # the latest take
    _read_by: float | None = field(default=None, repr=False)  # `expect`: read again from then
    # Buckets a wake-up named, oldest first: an append's new work is taken before work the
    # ring knew of (catch-up holds, retries), so a backlog elsewhere never delays it a round.
    woken: list[int] = field(default_factory=list, repr=False)
    # Campaign claims across buckets (one server): the ring then knows one bucket, `SPAN`, due
    # when anything is; every wake-up names it. Read with the first refresh, again every
    # `SPAN_RECHECK` seconds (an install distributed meanwhile goes back to single buckets).
    span: bool = False
    _span_read: float | None = field(default=None, repr=False)
    # False: one bucket a batch even on one server (tests of the bucket-by-bucket ring, Citus's).
    may_span: bool = True
    # A live service's loops (woken by NOTIFY, and at least every poll interval): between reads
    # the ring goes by the news, the batches' reports and the last read, and reads again only
    # when stale or older than the poll interval. A read made while batches are in flight
    # finds their campaigns due (a read cannot tell a held campaign from a free one) and sends
    # the loop to claim them, empty. False (a drain, `Worker.drain`): it also reads whenever
    # nothing is known due, and after a claim that found nothing, so that "nothing is due"
    # comes from a read.
    live: bool = False

    def due_now(self) -> bool:
        """Whether some bucket is known to have work due now (news a later take covered is
        not: that claim is taking it)."""
        now = self.clock()
        return any(at <= now and not self._covered(b) for b, at in self.due.items())

    def _covered(self, bucket: int) -> bool:
        """Whether `bucket` is due by a wake-up alone that a take since covered."""
        news = self._news.get(bucket)
        return news is not None and self.due.get(bucket) == news and not self._unserved(bucket)

    def _unserved(self, bucket: int) -> bool:
        """Whether a wake-up came to `bucket` after its latest take."""
        return self._news.get(bucket, float("-inf")) > self._taken.get(bucket, float("-inf"))

    async def take(self, executor: Executor, now: datetime | None = None) -> int | None:
        """The next bucket due now (`take_next`'s, without how it was found)."""
        taken = await self.take_next(executor, now)
        return None if taken is None else taken[0]

    async def take_next(
        self, executor: Executor, now: datetime | None = None, *, woken_first: bool = True
    ) -> tuple[int, bool] | None:
        """The next bucket due now, and whether a wake-up named it: those first, else the next
        after the last one taken (None: nothing is due), after reading every bucket again when
        what is known is stale or shows nothing due (`woken_first=False`: in turn, whatever
        woke them). `now`: the database's time instead of its clock (tests move time
        forward)."""
        # A live ring reads only when stale or old; a drain's also when nothing is known due
        # (news a later take covered is known: that claim is taking it).
        known = self.live or self.due_now() or any(map(self._covered, self.due))
        if self.stale or self._old() or not known:
            await self.refresh(executor, now)
        at = self.clock()
        while woken_first and self.woken:
            bucket = self.woken.pop(0)
            if self.due.get(bucket, at + 1) <= at and not self._covered(bucket):
                return self._take(bucket), True
        ready = sorted(b for b, due in self.due.items() if due <= at and not self._covered(b))
        if not ready:
            return None
        return self._take(next((b for b in ready if b > self.last), ready[0])), False

    def _take(self, bucket: int) -> int:
        self.last = bucket
        self.claiming(bucket)
        return bucket

    def claiming(self, bucket: int) -> None:
        """A claim in `bucket` is about to be sent (and was taken): it serves every wake-up
        received until now."""
        self._taken[bucket] = self.clock()
        if bucket in self.woken:
            self.woken.remove(bucket)

    async def refresh(self, executor: Executor, now: datetime | None = None) -> None:
        """Read which buckets have work and when it is due (one call; concurrent callers
        share it). What a wake-up or a batch reported meanwhile is kept: the read may have
        started before that work committed."""
        started = self.clock()
        async with self._lock:
            if self.read_from is not None and self.read_from >= started:
                return  # another loop's read began after this one asked: it is as fresh
            self.read_from = began = self.clock()
            self.stale = False
            if self._read_by is not None and self._read_by <= began:
                self._read_by = None
            if (
                not self.rows
                and self.may_span
                and (self._span_read is None or began - self._span_read >= SPAN_RECHECK)
            ):
                self.span, self._span_read = await spans(executor), began
                if self.span:  # what woke it before it knew: every bucket is one now
                    self.woken = [SPAN] if self.woken else []
                    self._told = {SPAN: max(self._told.values())} if self._told else {}
                    self._news = {SPAN: max(self._news.values())} if self._news else {}
            found = await due_buckets(executor, rows=self.rows, now=now, span=self.span)
            at = self.clock()
            self._told = {b: t for b, t in self._told.items() if t >= began}
            self.due = {bucket: at + max(due_in, 0.0) for bucket, due_in in found}
            self.due.update(self._told)

    def wake(self, payload: str) -> None:
        """A NOTIFY: its payload names a bucket that got work; anything else (a requeue, a
        reconcile) means read every bucket again."""
        if self.span or payload.isdigit():
            bucket = SPAN if self.span else int(payload)
            self._due_now(bucket)
            self._news[bucket] = self.due[bucket]
            if bucket not in self.woken:
                self.woken.append(bucket)
        if not payload.isdigit():
            self.stale = True

    async def found(
        self,
        executor: Executor,
        bucket: int,
        *,
        more: bool,
        empty: bool,
        now: datetime | None = None,
    ) -> None:
        """What a batch in `bucket` left: `more` due now (a full batch, campaigns left due), or
        nothing it could take (the bucket leaves the ring until a refresh or a wake-up finds
        work in it again). After an `empty` claim, when nothing else is known to be due, every
        bucket is read again: the ring says "nothing is due" only from a read that began after
        a claim found nothing (another batch may have emptied what it believed)."""
        if more:
            self._due_now(bucket)
        elif not self._unserved(bucket):  # news since the take: a loop was rung for it
            self.drop(bucket)
        if empty and not self.live and not self.due_now():
            await self.refresh(executor, now)

    def drop(self, bucket: int) -> None:
        """`bucket` leaves the ring until a read or a wake-up finds work in it again: nothing
        left in it, or its batch failed (under Citus, a node down: the read leaves its buckets
        out while it cannot be reached, so the other nodes' buckets are served meanwhile)."""
        self.due.pop(bucket, None)
        self._told.pop(bucket, None)
        self._news.pop(bucket, None)

    def _due_now(self, bucket: int) -> None:
        self.due[bucket] = self._told[bucket] = self.clock()

    def expect(self, seconds: float) -> None:
        """Work falls due by time in `seconds` (a retry, a lease's expiry, looked up by an idle
        loop): the ring reads every bucket again from then on."""
        at = self.clock() + seconds
        self._read_by = at if self._read_by is None else min(self._read_by, at)

    def _old(self) -> bool:
        now = self.clock()
        return (
            self.read_from is None
            or now - self.read_from >= self.poll_interval
            or (self._read_by is not None and now >= self._read_by)
        )
