"""The apply worker's batch: claim, apply the batch as one group, isolate failures, settle.

`Worker.run_once()` is one batch in one transaction, in one bucket (the next one the worker's
`BucketRing` knows to be due), and returns its counts; `drain()` repeats it until nothing is
due. The happy path is five round trips whatever the batch's size: BEGIN,
the claim (one call), the projectors, the settle (one call), COMMIT. A group runs without a
savepoint; when one fails, the batch is rolled back and claimed again with a savepoint per
group, so the failing event records its attempt and its neighbours apply (S6). A batch that
meets a transient database error (a lost connection included) is rolled back whole: no row
changes and no attempt is consumed, and the connection it ran on is discarded. The worker never
decides what a projector does; it dispatches (`outbox.projection.dispatch`), walks the claim
(`walk`), asks the failure policy (`outbox.retry`) what a failure costs, and runs the queue's
statements (`outbox.queue`). The long-running service around it (loops, LISTEN, signals,
heartbeat) lives in `service`.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from outbox import db
from outbox.model import BatchCounts, Failure, Key
from outbox.obs import log, tracing
from outbox.obs.metrics import Metrics
from outbox.projection.app import Outbox
from outbox.projection.dispatch import ApplyOutcome, Dispatch, GroupFailed
from outbox.queue.claim import ClaimedCampaign, ClaimedRow, claim, event_batch
from outbox.queue.lease import Lease, lease_rows
from outbox.queue.settle import defer, settle
from outbox.retry import FailurePolicy, log_failure
from outbox.worker.lease import LeaseRunner, choose_leases
from outbox.worker.registration import new_worker_id
from outbox.worker.ring import BucketRing
from outbox.worker.transient import raise_transient, transient_cause
from outbox.worker.walk import campaign_writes, paused_waits, walk

if TYPE_CHECKING:
    from outbox.db import Connection, Pool

__all__ = ["Worker"]

_logger = log.get_logger("outbox.worker")


@dataclass
class AfterCommit:
    """What a batch hands on past its commit: leases to run, figures for the metrics (events
    per projector and outcome, each projector call's seconds, each completed row's seconds
    since it was enqueued)."""

    leases: list[Lease] = field(default_factory=list)
    tally: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: list[tuple[str, float]] = field(default_factory=list)
    ages: list[float] = field(default_factory=list)
    unsubscribed: Counter[str] = field(default_factory=Counter)  # completed unapplied, per type


class _Isolate(Exception):
    """A batch applied without savepoints met a failing event: roll it back and run it again
    with a savepoint per group, which isolates the event."""


@dataclass
class Worker:
    app: Outbox
    pool: Pool
    # The jitter's random source (None: the app's); tests inject a fixed one.
    rand: Callable[[], float] | None = None
    # Tests inject `now` to move time forward; None means the database clock.
    now: Callable[[], datetime | None] = lambda: None
    # Rows per campaign the last ordered claim found (see `_campaigns_to_claim`).
    depth: float = field(default=1.0, init=False, repr=False)
    # The owner of this worker's leases (lease mode) and its registry row.
    worker_id: str = field(default_factory=new_worker_id)
    # Where per-projector figures go after each commit (the service attaches its own).
    metrics: Metrics | None = field(default=None, repr=False)
    # Whether the last claim took every due campaign no other batch held (it got fewer than
    # it asked for): what is due now and was left is held elsewhere, or came due since.
    took_all: bool = field(default=True, init=False, repr=False)
    # (projector, outcome) -> events since the worker started: its registry row shows them.
    tally: Counter[tuple[str, str]] = field(default_factory=Counter, init=False, repr=False)
    # Which bucket the next batch claims from.
    ring: BucketRing = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.rand is None:
            self.rand = self.app.rand or FailurePolicy().rand
        self.ring = BucketRing(
            rows=not self._claim_ordered(), poll_interval=self.app.settings.poll_interval
        )

    @property
    def policy(self) -> FailurePolicy:
        """The failure policy of the app's settings, with this worker's random source."""
        return FailurePolicy.of(self.app.settings, self.rand)

    @property
    def ordered(self) -> bool:
        return self.app.settings.ordered

    @property
    def park(self) -> bool:
        return self.app.settings.park

    async def run_once(self) -> BatchCounts:
        """Claim, apply and settle one batch in one transaction, in the next bucket due; return
        its counts (all zero when no bucket is due).

        Raises TransientBatchError when the database failed transiently: the transaction is
        gone, so every row is as it was and no attempt was consumed.
        """
        after = AfterCommit()
        bucket: int | None = None
        try:
            bucket = await self.ring.take(self.pool, self.now())
            if bucket is None:
                self.took_all = True
                return BatchCounts()
            try:
                counts = await self._batch(after, bucket, careful=False)
            except _Isolate as isolate:
                _logger.debug("batch.isolate", extra={"error": str(isolate)})
                after = AfterCommit()
                counts = await self._batch(after, bucket, careful=True)
            full = counts.claimed >= self.app.settings.batch_size
            await self.ring.found(
                self.pool,
                bucket,
                more=bool(counts.more_due) or full or not self.took_all,
                empty=not counts.claimed,
                now=self.now(),
            )
        except Exception as exc:
            if bucket is not None:  # the next batch tries another bucket; a read brings it back
                self.ring.drop(bucket)
            transient = transient_cause(exc)
            if transient is None:
                raise
            raise transient from exc
        # What is due now in other buckets is this worker's to claim next.
        self.took_all = self.took_all and not self.ring.due_now()
        self.tally.update(after.tally)
        if self.metrics is not None:
            self.metrics.record_apply(after.tally, after.durations, after.ages)
            self.metrics.record_unsubscribed(after.unsubscribed)
        if after.leases:  # committed with the batch: run them outside any queue transaction
            runner = LeaseRunner(
                self.pool,
                self.app.registry,
                self.app.settings,
                self.worker_id,
                self.policy,
                self.metrics,
                self.tally,
            )
            await runner.run(after.leases, counts)
            self.ring.wake(str(bucket))  # the campaigns behind the leases go on
        return counts

    async def _batch(self, after: AfterCommit, bucket: int, *, careful: bool) -> BatchCounts:
        """One transaction in `bucket`: claim, hand the campaigns to `_handle`, commit.
        `careful`: a savepoint around each group, so a failing event can be rolled back
        alone."""
        now = self.now()
        session = self.app.settings.worker_session()
        with tracing.span("outbox.batch"):
            async with db.acquire(self.pool, session=session) as conn, conn.transaction():
                wanted = self._campaigns_to_claim()
                campaigns = await claim(
                    conn,
                    bucket=bucket,
                    limit=self.app.settings.batch_size,
                    ordered=self._claim_ordered(),
                    campaigns=wanted,
                    projectors=self.app.registry.ordered_names(),
                    now=now,
                )
                self.took_all = not self._claim_ordered() or len(campaigns) < wanted
                self._observe(campaigns)
                return await self._handle(conn, campaigns, now, after, careful=careful)

    def _campaigns_to_claim(self) -> int:
        """How many campaigns an ordered claim takes: as many as fill a batch at the depth
        recent claims found. Oldest due campaigns first either way; this only decides how the
        batch is shared: a backlog of deep campaigns gives each batch a few campaigns with many
        rows (each campaign row and checkpoint is written once per batch, so fewer campaigns
        cost less per event), a stream of shallow ones gives it many campaigns of one row."""
        return max(1, math.ceil(self.app.settings.batch_size / self.depth))

    def _observe(self, campaigns: list[ClaimedCampaign]) -> None:
        """Learn the depth from this claim: rows found per campaign, doubled where the claim's
        share ran out before the campaign did."""
        if not campaigns or not self._claim_ordered():
            return
        found = [
            2 * len(c.rows) if c.rows and (c.last_seq or 0) > c.rows[-1].seq else len(c.rows)
            for c in campaigns
        ]
        self.depth = min(max(sum(found) / len(found), 1.0), float(self.app.settings.batch_size))

    def _claim_ordered(self) -> bool:
        """Whether the claim goes by campaign: the apply worker follows the settings."""
        return self.ordered

    async def _handle(
        self,
        conn: Connection,
        campaigns: list[ClaimedCampaign],
        now: datetime | None,
        after: AfterCommit,
        *,
        careful: bool = False,
    ) -> BatchCounts:
        """Apply the walked rows as one group (`careful`: in a savepoint; on a failure, roll
        the group back and retry smaller pieces, so only the failing event records an attempt
        and its neighbours still apply, S6; else a failure raises `_Isolate`).
        Rows of events with a non-transactional projector end their campaign's walk and are
        leased (`after.leases`, run after the commit). Then settle: delete successes, record
        failures and write the campaign rows, in one call."""
        leased_types = self.app.registry.leased_types()
        paused = await self.app.pauses.types(conn, self.app.registry) if campaigns else frozenset()
        work = walk(
            campaigns,
            limit=self.app.settings.batch_size,
            park=self.park,
            ordered=self.ordered,
            stop_after=leased_types,
            paused=paused,
        )
        counts = BatchCounts(claimed=len(work))
        waiting = paused_waits(campaigns, work, paused, ordered=self.ordered)
        to_lease = [r for r in work if r.event_type in leased_types]
        if to_lease:
            leasing = {r.key for r in to_lease}
            work = [r for r in work if r.key not in leasing]
        if not campaigns:
            return counts
        dispatch = Dispatch(conn, self.app.registry, self.app.settings.unsubscribed)
        done: list[Key] = []
        failures: list[Failure] = []
        if work:
            if self.ordered:  # the claim locked them
                dispatch.use(
                    {(c.campaign_id, p): v for c in campaigns for p, v in c.checkpoints.items()}
                )
            else:
                await dispatch.load(sorted({r.campaign_id for r in work}))
            await self._apply(dispatch, work, done, failures, counts, careful=careful)
            after.tally, after.durations = dispatch.tally, dispatch.durations
            after.unsubscribed = dispatch.skipped_types
        if to_lease:
            await self._lease(conn, to_lease, failures, counts, after.leases, now)
        writes = (
            await campaign_writes(
                conn,
                campaigns,
                set(done),
                failures,
                park=self.park,
                leased={lease.key: lease.expires_at for lease in after.leases},
            )
            if self.ordered  # under ordering `none` the claim reads the work rows directly
            else []
        )
        settled = await settle(
            conn,
            done=done,
            failures=failures,
            campaigns=writes,
            checkpoints=dispatch.moves(),
            now=now,
        )
        counts.more_due, after.ages = settled.due, settled.ages
        if any(waiting):  # due again in one poll interval: a resume is seen that soon
            held, rows = waiting
            await defer(conn, campaigns=held, rows=rows, seconds=self.app.settings.poll_interval)
            counts.paused = len(held) + len(rows)
            counts.more_due = max(0, counts.more_due - len(held))
        return counts

    async def _apply(
        self,
        dispatch: Dispatch,
        work: list[ClaimedRow],
        done: list[Key],
        failures: list[Failure],
        counts: BatchCounts,
        *,
        careful: bool,
    ) -> None:
        pending: deque[list[ClaimedRow]] = deque([work])
        while pending:
            # Under campaign ordering, rows behind a row that failed in this batch wait.
            failed_at = {f.campaign_id: f.seq for f in failures} if self.ordered else {}
            group = [r for r in pending.popleft() if r.seq <= failed_at.get(r.campaign_id, r.seq)]
            if not group:
                continue
            bad = next((i for i, r in enumerate(group) if r.event_type is None), None)
            if bad is not None:  # a missing or undecodable event fails its row alone (S8)
                failures.append(self._failed(group[bad], group[bad].unavailable, counts))
                pending.extendleft([group[bad + 1 :], group[:bad]])
                continue
            if careful:
                await dispatch.open_group()
            try:
                outcomes = await dispatch.apply(event_batch(group))
            except GroupFailed as failed:
                raise_transient(failed, closed=dispatch.conn.is_closed())
                if not careful:
                    raise _Isolate(failed.describe()) from failed.cause
                pieces = self._split(group, failed, failures, counts)
                await dispatch.undo_group()
                pending.extendleft(reversed(pieces))
                continue
            done.extend([(r.campaign_id, r.seq) for r in group])
            applied = outcomes.count(ApplyOutcome.APPLIED)
            counts.applied += applied
            counts.skipped += len(group) - applied

    async def _lease(
        self,
        conn: Connection,
        rows: list[ClaimedRow],
        failures: list[Failure],
        counts: BatchCounts,
        leases: list[Lease],
        now: datetime | None,
    ) -> None:
        """Lease the rows whose campaign did not fail before them in this batch (S13)."""
        ready, last, reclaimed = choose_leases(
            rows, failures, max_attempts=self.app.settings.max_attempts
        )
        counts.reclaimed += reclaimed
        failures.extend(self._failed(row, expired, counts) for row, expired in last)
        leased = await lease_rows(
            conn, ready, owner=self.worker_id, seconds=self.app.settings.lease_seconds, now=now
        )
        leases.extend(leased)
        counts.leased += len(leased)

    def _split(
        self,
        group: list[ClaimedRow],
        failed: GroupFailed,
        failures: list[Failure],
        counts: BatchCounts,
    ) -> list[list[ClaimedRow]]:
        """The pieces to retry after `group` failed: around the failing event when it is
        known (which records its failure), else the two halves."""
        if failed.index is None and len(group) > 1:
            half = len(group) // 2
            return [group[:half], group[half:]]
        index = failed.index or 0
        failures.append(self._failed(group[index], failed.cause, counts, failed.projector))
        return [group[:index], group[index + 1 :]]

    def _failed(
        self,
        row: ClaimedRow,
        exc: BaseException | None,
        counts: BatchCounts,
        projector: str | None = None,
    ) -> Failure:
        """Record one row's failure: the attempt, the backoff or dead, the log line."""
        exc = exc if exc is not None else RuntimeError("no event")
        failure = self.policy.fail(
            row.campaign_id, row.seq, row.attempt_count, exc, projector=projector
        )
        counts.dead += failure.dead
        counts.failed += not failure.dead
        log_failure(failure, exc)
        return failure

    async def drain(self) -> BatchCounts:
        """Run batches until one claims nothing and leaves nothing due; return the totals."""
        total = BatchCounts()
        while True:
            counts = await self.run_once()
            total.add(counts)
            if counts.claimed == 0 and counts.more_due == 0 and not self.ring.due_now():
                return total
