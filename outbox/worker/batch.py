"""A worker's batches: the bucket, the claim and the transaction around its strategy.

`Worker.run_once()` is one batch in one transaction, in one bucket (the next one the worker's
`BucketRing` knows to be due; on one server every bucket at once, `buckets.SPAN`), and returns
its counts; `drain()` repeats it until nothing is
due. What the batch does with what it claimed is the worker's `strategy` (`strategy.Strategy`):
`apply.Apply` (the default) or `shadow.Shadow`. The happy path of an apply batch is five round
trips whatever its size: BEGIN, the claim (one call), the projectors, the settle (one call),
COMMIT; when the strategy raises `Isolate`, the batch is rolled back and claimed again with a
savepoint per group (S6). A batch that meets a transient database error (a lost connection
included) is rolled back whole: no row changes and no attempt is consumed, and the connection
it ran on is discarded. Leases the batch took run after its commit (`lease`). The long-running
service around it (loops, LISTEN, signals, heartbeat) lives in `service`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic
from typing import TYPE_CHECKING

import anyio

from outbox import buckets, db
from outbox.buckets.ring import BucketRing
from outbox.model import BatchCounts, Take
from outbox.obs import log, tracing
from outbox.obs.metrics import Metrics
from outbox.projection.app import Outbox
from outbox.projection.sweep import Sweeps
from outbox.projection.versions import AutoPromotions
from outbox.queue.claim import ClaimedCampaign, claim
from outbox.retry import FailurePolicy, leaves
from outbox.worker import groups
from outbox.worker.apply import Apply
from outbox.worker.catch_ups import CatchUps
from outbox.worker.lease import LeaseRunner
from outbox.worker.registration import new_worker_id
from outbox.worker.sql_batch import OneCall
from outbox.worker.strategy import AfterCommit, Batch, Isolate, Strategy
from outbox.worker.transient import transient_cause

if TYPE_CHECKING:
    from outbox.db import Pool
    from outbox.projection.registry import Registry

__all__ = ["Worker"]

_logger = log.get_logger("outbox.worker")

# Seconds between steps of a catch-up sweep while the worker is busy (S25); an idle worker
# steps it at once.
SWEEP_INTERVAL = 0.2
# Batches for buckets an append woke a worker serves in a row before one in turn (S25).
APPENDS_FIRST = 4
# Seconds after a failure during which a worker's batches run careful from the first pass (a
# savepoint per group): a projector that failed once likely fails again, and a failure in a
# careful pass costs its group one more run, not the batch a rollback and a second claim.
CAREFUL_AFTER_FAILURE = 10.0


@dataclass
class Worker:
    """Batches of one worker: the bucket ring, the claim and the transaction, around what its
    `strategy` does with the claimed work (default: apply it)."""

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
    # What a batch does with what it claimed (`apply.Apply`, `shadow.Shadow`).
    strategy: Strategy = field(default_factory=Apply)
    # Which bucket the next batch claims from.
    ring: BucketRing = field(init=False, repr=False)
    # The catch-up sweeps of this worker's unordered projectors that start at the beginning
    # (S25), and the engine's catch-ups of its ordered ones (S30).
    sweeps: Sweeps = field(init=False, repr=False)
    catch_ups: CatchUps = field(init=False, repr=False)
    # Its versions registered promote="auto" not yet live (S29).
    promotions: AutoPromotions = field(init=False, repr=False)
    # Batches served in a row for buckets an append woke (see `run_once`).
    _woken_streak: int = field(default=0, init=False, repr=False)
    # Until when (monotonic) batches run careful from the first pass (`CAREFUL_AFTER_FAILURE`).
    _careful_until: float = field(default=float("-inf"), init=False, repr=False)
    # The registry in force last seen, and its plan for batches in one call (None: some
    # projector is not SQL, `sql_batch`).
    _one_call: tuple[Registry, OneCall | None] | None = field(default=None, init=False, repr=False)
    # Whether the app's projectors are all SQL: else no batch tries the one call.
    _all_sql: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.rand is None:
            self.rand = self.app.rand or FailurePolicy().rand
        poll = self.app.settings.poll_interval
        self.ring = BucketRing(rows=not self._claim_ordered(), poll_interval=poll)
        applies = isinstance(self.strategy, Apply) and self.ordered
        self.sweeps = Sweeps.of(self.app.registry, min(poll, SWEEP_INTERVAL), applies=applies)
        self.catch_ups = CatchUps.of(self.app.registry, self.app.settings, applies=applies)
        self.promotions = AutoPromotions.of(self.app.registry, applies=applies)
        self._all_sql = applies and OneCall.of(self.app.registry) is not None

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
            await self._sweep(idle=False)
            # Appends first (S25): a bucket an append woke is served first, without background
            # work (campaigns waiting for holds alone, catch-ups), as long as the worker has
            # not served `APPENDS_FIRST` such batches in a row: then the next bucket in turn
            # with background work, so a catch-up moves however busy the appends keep it. A
            # worker that does only background work (OUTBOX_BACKGROUND=only) or none (`never`)
            # takes buckets in turn, or those woken first, and that work alone.
            share = self.app.settings.background
            woken_first = share == "never" or (
                share == "share" and self._woken_streak < APPENDS_FIRST
            )
            # A worker group's batches claim its projectors' holds across every bucket (S35).
            grouped = self.app.settings.grouped
            taken = (
                (buckets.SPAN, False)
                if grouped
                else await self.ring.take_next(self.pool, self.now(), woken_first=woken_first)
            )
            if taken is None:
                self.took_all = True
                # Nothing due: a sweep under way steps now, and has the loop look again.
                return BatchCounts(more_due=int(await self._sweep(idle=True)))
            bucket, woken = taken
            take: Take = (
                "holds"
                if share == "only" or grouped
                else "live"
                if share == "never" or woken
                else "all"
            )
            self._woken_streak = self._woken_streak + 1 if woken else 0
            careful = monotonic() < self._careful_until
            try:
                counts = None if careful else await self._batch_in_one_call(after, bucket, take)
                if counts is None:
                    counts = await self._batch(after, bucket, careful=careful, take=take)
            except Isolate as isolate:
                _logger.debug("batch.isolate", extra={"error": str(isolate)})
                after = AfterCommit()
                counts = await self._batch(after, bucket, careful=True, take=take)
                careful = True
            if careful and (counts.failed or counts.dead):
                self._careful_until = monotonic() + CAREFUL_AFTER_FAILURE
            if not (counts.claimed or counts.more_due) and await self._sweep(idle=True):
                counts.more_due = 1
            full = counts.claimed >= self.app.settings.batch_size
            if grouped:
                return counts
            await self.ring.found(
                self.pool,
                bucket,
                more=bool(counts.more_due) or full or not after.took_all,
                empty=not counts.claimed,
                now=self.now(),
            )
        except Exception as exc:
            if bucket is not None:  # the next batch tries another bucket; a read brings it back
                self.ring.drop(bucket)
            transient = transient_cause(exc)
            if transient is not None and transient.sqlstate == db.PROJECTORS_CHANGED:
                # A rolling deploy recorded one, or a promotion superseded one: read again.
                self.app.absent.expire()
                self.app.superseded.expire()
            if transient is None:
                raise
            raise transient from exc
        # What is due now in other buckets is this worker's to claim next.
        self.took_all = after.took_all and not self.ring.due_now()
        self.tally.update(after.tally)
        if self.metrics is not None:
            self.metrics.record_apply(after.tally, after.durations, after.ages)
            self.metrics.record_unsubscribed(after.unsubscribed)
        if after.leases:  # committed with the batch: run them outside any queue transaction
            runner = LeaseRunner(
                self.pool,
                after.registry or self.app.registry,
                self.app.settings,
                self.worker_id,
                self.policy,
                self.metrics,
                self.tally,
            )
            await runner.run(after.leases, counts)
            self.ring.wake(str(bucket))  # the campaigns behind the leases go on
        return counts

    async def _sweep(self, *, idle: bool) -> bool:
        """Step the catch-up sweeps still under way (S25): when nothing is due (`idle`), else
        at most once per interval; whether there is more to do now (it placed catch-up holds,
        and the buckets are read again, or a sweep has further to go). A version of its own
        registered promote="auto" is promoted here once caught up (at most every few seconds)."""
        if self.promotions.pending:
            for made in await self.promotions.step(self.pool, self.worker_id):
                _logger.info(
                    "version.promoted",
                    extra={
                        "projector": made.projector,
                        "version": made.version,
                        "previous": made.previous,
                        "released": made.released,
                    },
                )
                self.app.superseded.expire()
        if not self.sweeps.pending:
            return False
        seeded, moving = await self.sweeps.step(self.pool, idle=idle)
        if seeded:
            self.ring.wake("")
        return bool(seeded) or moving

    async def _batch(
        self, after: AfterCommit, bucket: int, *, careful: bool, take: Take = "all"
    ) -> BatchCounts:
        """One transaction in `bucket`: claim, hand the campaigns to `_handle`, commit.
        `careful`: a savepoint around each group, so a failing event can be rolled back
        alone; `take`: which campaigns the claim takes (S25): with any but `live`, the batch
        does background work (the holds of ordered projectors go on through the journal)."""
        now = self.now()
        session = self.app.settings.worker_session()
        with tracing.span("outbox.batch"):
            async with db.acquire(self.pool, session=session) as conn, conn.transaction():
                registry = await self.app.in_force(conn)
                after.registry = registry
                wanted = self._campaigns_to_claim()
                if self.app.settings.grouped:
                    campaigns = await groups.claim(conn, self.app, registry, now)
                    wanted = self.app.settings.batch_size
                else:
                    self.ring.claiming(bucket)
                    campaigns = await claim(
                        conn,
                        bucket=bucket,
                        limit=self.app.settings.batch_size,
                        ordered=self._claim_ordered(),
                        campaigns=wanted,
                        projectors=registry.checkpointed_names(),
                        now=now,
                        take=take,
                    )
                after.took_all = not self._claim_ordered() or len(campaigns) < wanted
                self._observe(campaigns)
                batch = Batch(
                    self.app,
                    registry,
                    self.policy,
                    self.worker_id,
                    conn,
                    bucket,
                    now,
                    after,
                    careful,
                    take != "live",
                )
                return await self.strategy.handle(batch, campaigns)

    async def _batch_in_one_call(
        self, after: AfterCommit, bucket: int, take: Take
    ) -> BatchCounts | None:
        """The batch in one call of the server (`sql_batch`) when every projector in force is
        a SQL projector it can run and none is paused or missing from this code; None when
        the batch is left to `_batch` (nothing of it was written)."""
        settings = self.app.settings
        if not self._all_sql or (take == "holds" and not settings.grouped):
            return None  # a background worker's batches are holds' work: the worker's own
        async with db.acquire(self.pool, session=settings.worker_session()) as conn:
            registry = await self.app.in_force(conn)
            if self._one_call is None or self._one_call[0] is not registry:
                self._one_call = (registry, OneCall.of(registry))
            plan = self._one_call[1]
            if plan is None:
                return None
            if await self.app.pauses.projectors(conn, registry):
                return None
            if await self.app.absent.of(conn, registry):
                return None
            wanted = self._campaigns_to_claim()
            with tracing.span("outbox.batch"):
                if settings.grouped:  # a worker group's holds (S35)
                    result = await groups.one_call(conn, plan, settings, self.now())
                else:
                    self.ring.claiming(bucket)
                    result = await plan.run(
                        conn,
                        bucket=bucket,
                        campaigns=wanted,
                        budget=settings.batch_size,
                        now=self.now(),
                        take=take,
                    )
        if result is None:
            return None
        after.took_all = result.campaigns < wanted
        if result.campaigns:
            self._learn_depth(result.depth_rows / result.campaigns)
        after.registry = registry
        after.ages = result.ages
        for name, events in result.per_projector.items():
            after.tally[(name, "applied")] += events
        return result.counts

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
        self._learn_depth(sum(found) / len(found))

    def _learn_depth(self, rows_per_campaign: float) -> None:
        """The depth the next claims share a batch by: rows per campaign, 1 to a batch."""
        self.depth = min(max(rows_per_campaign, 1.0), float(self.app.settings.batch_size))

    def _claim_ordered(self) -> bool:
        """Whether the claim goes by campaign (the strategy says, from the settings)."""
        return self.strategy.claims_in_order(self.app.settings)

    async def drain(self) -> BatchCounts:
        """Run batches until one claims nothing and leaves nothing due, and the engine's
        catch-ups (beside them) to their end; return the totals."""
        if not self.catch_ups.pending:
            return await self._drain_batches()
        try:
            async with anyio.create_task_group() as tasks:
                self.catch_ups.launch(tasks, self.pool, until_done=True)
                total = await self._drain_batches()
        except BaseExceptionGroup as group:  # one task's failure, as it was raised
            raise leaves(group)[0] from None
        return total

    async def _drain_batches(self) -> BatchCounts:
        total = BatchCounts()
        while True:
            counts = await self.run_once()
            total.add(counts)
            if counts.claimed == 0 and counts.more_due == 0 and not self.ring.due_now():
                if not self.catch_ups.running:
                    return total
                await self.catch_ups.wait()  # then the holds it left, if any
