"""The apply worker's strategy: the claimed rows applied as one group, failures isolated.

`Apply.handle` walks the claimed campaigns (`walk`), applies the rows as one group under the
exactly-once guards (`outbox.projection.dispatch`), leases the rows of non-transactional
projectors (S13), and settles the batch in one call: successes deleted, failures recorded as
the failure policy decides them, the campaign rows written. A group runs without a savepoint;
when one fails, `Isolate` has the worker roll the batch back and run it again `careful`, with a
savepoint per group, so the failing event records its attempt and its neighbours apply (S6).
"""

from __future__ import annotations

from collections import deque

from outbox.config import Settings
from outbox.model import BatchCounts, Failure, Key
from outbox.projection.dispatch import ApplyOutcome, Dispatch, GroupFailed
from outbox.queue.claim import ClaimedCampaign, ClaimedRow, event_batch
from outbox.queue.lease import Lease, lease_rows
from outbox.queue.settle import defer, settle
from outbox.retry import FailurePolicy, log_failure
from outbox.worker.lease import choose_leases
from outbox.worker.strategy import Batch, Isolate
from outbox.worker.transient import raise_transient
from outbox.worker.walk import campaign_writes, paused_waits, walk

__all__ = ["Apply"]


class Apply:
    """The apply worker's strategy (see the module docstring)."""

    def claims_in_order(self, settings: Settings) -> bool:
        return settings.ordered

    async def handle(self, batch: Batch, campaigns: list[ClaimedCampaign]) -> BatchCounts:
        """Apply the walked rows as one group (`careful`: in a savepoint; on a failure, roll
        the group back and retry smaller pieces, so only the failing event records an attempt
        and its neighbours still apply, S6; else a failure raises `Isolate`).
        Rows of events with a non-transactional projector end their campaign's walk and are
        leased (`after.leases`, run after the commit). Then settle: delete successes, record
        failures and write the campaign rows, in one call."""
        app, conn, bucket, now, after = batch.app, batch.conn, batch.bucket, batch.now, batch.after
        settings = app.settings
        leased_types = app.registry.leased_types()
        paused = await app.pauses.types(conn, app.registry) if campaigns else frozenset()
        work = walk(
            campaigns,
            limit=settings.batch_size,
            park=settings.park,
            ordered=settings.ordered,
            stop_after=leased_types,
            paused=paused,
        )
        counts = BatchCounts(claimed=len(work))
        waiting = paused_waits(campaigns, work, paused, ordered=settings.ordered)
        to_lease = [r for r in work if r.event_type in leased_types]
        if to_lease:
            leasing = {r.key for r in to_lease}
            work = [r for r in work if r.key not in leasing]
        if not campaigns:
            return counts
        dispatch = Dispatch(conn, app.registry, settings.unsubscribed, bucket)
        done: list[Key] = []
        failures: list[Failure] = []
        if work:
            if settings.ordered:  # the claim locked them
                dispatch.use(
                    {(c.campaign_id, p): v for c in campaigns for p, v in c.checkpoints.items()}
                )
            else:
                await dispatch.load(sorted({r.campaign_id for r in work}))
            await _apply(batch, dispatch, work, done, failures, counts)
            after.tally, after.durations = dispatch.tally, dispatch.durations
            after.unsubscribed = dispatch.skipped_types
        if to_lease:
            await _lease(batch, to_lease, failures, counts)
        writes = (
            await campaign_writes(
                conn,
                campaigns,
                set(done),
                failures,
                park=settings.park,
                leased={lease.key: lease.expires_at for lease in after.leases},
            )
            if settings.ordered  # under ordering `none` the claim reads the work rows directly
            else []
        )
        settled = await settle(
            conn,
            bucket=bucket,
            done=done,
            failures=failures,
            campaigns=writes,
            checkpoints=dispatch.moves(),
            now=now,
        )
        counts.more_due, after.ages = settled.due, settled.ages
        if any(waiting):  # due again in one poll interval: a resume is seen that soon
            held, rows = waiting
            await defer(
                conn,
                campaigns=held,
                rows=rows,
                seconds=settings.poll_interval,
                bucket=bucket,
            )
            counts.paused = len(held) + len(rows)
            counts.more_due = max(0, counts.more_due - len(held))
        return counts


async def _apply(
    batch: Batch,
    dispatch: Dispatch,
    work: list[ClaimedRow],
    done: list[Key],
    failures: list[Failure],
    counts: BatchCounts,
) -> None:
    """The walked rows as one group: when it fails, `Isolate`, or, careful, the group rolled
    back to its savepoint and retried in pieces around the failing event."""
    ordered = batch.app.settings.ordered
    pending: deque[list[ClaimedRow]] = deque([work])
    while pending:
        # Under campaign ordering, rows behind a row that failed in this batch wait.
        failed_at = {f.campaign_id: f.seq for f in failures} if ordered else {}
        group = [r for r in pending.popleft() if r.seq <= failed_at.get(r.campaign_id, r.seq)]
        if not group:
            continue
        bad = next((i for i, r in enumerate(group) if r.event_type is None), None)
        if bad is not None:  # a missing or undecodable event fails its row alone (S8)
            failures.append(_failed(batch.policy, group[bad], group[bad].unavailable, counts))
            pending.extendleft([group[bad + 1 :], group[:bad]])
            continue
        if batch.careful:
            await dispatch.open_group()
        try:
            outcomes = await dispatch.apply(event_batch(group))
        except GroupFailed as failed:
            raise_transient(failed, closed=dispatch.conn.is_closed())
            if not batch.careful:
                raise Isolate(failed.describe()) from failed.cause
            pieces = _split(batch.policy, group, failed, failures, counts)
            await dispatch.undo_group()
            pending.extendleft(reversed(pieces))
            continue
        # A campaign an ordered projector is still catching up from the journal comes back
        # BEHIND: its rows stay due, charged nothing, and the next batch goes on from the
        # checkpoints this one moved.
        behind = outcomes.count(ApplyOutcome.BEHIND)
        done.extend(
            [(r.campaign_id, r.seq) for r in group]
            if not behind
            else [
                (r.campaign_id, r.seq)
                for r, o in zip(group, outcomes, strict=True)
                if o is not ApplyOutcome.BEHIND
            ]
        )
        applied = outcomes.count(ApplyOutcome.APPLIED)
        counts.applied += applied
        counts.skipped += len(group) - applied - behind
        counts.behind += behind


async def _lease(
    batch: Batch, rows: list[ClaimedRow], failures: list[Failure], counts: BatchCounts
) -> None:
    """Lease the rows whose campaign did not fail before them in this batch (S13)."""
    settings = batch.app.settings
    ready, last, reclaimed = choose_leases(rows, failures, max_attempts=settings.max_attempts)
    counts.reclaimed += reclaimed
    failures.extend(_failed(batch.policy, row, expired, counts) for row, expired in last)
    leased: list[Lease] = await lease_rows(
        batch.conn,
        ready,
        owner=batch.worker_id,
        seconds=settings.lease_seconds,
        now=batch.now,
        bucket=batch.bucket,
    )
    batch.after.leases.extend(leased)
    counts.leased += len(leased)


def _split(
    policy: FailurePolicy,
    group: list[ClaimedRow],
    failed: GroupFailed,
    failures: list[Failure],
    counts: BatchCounts,
) -> list[list[ClaimedRow]]:
    """The pieces to retry after `group` failed: around the failing event when it is known
    (which records its failure), else the two halves."""
    if failed.index is None and len(group) > 1:
        half = len(group) // 2
        return [group[:half], group[half:]]
    index = failed.index or 0
    failures.append(_failed(policy, group[index], failed.cause, counts, failed.projector))
    return [group[:index], group[index + 1 :]]


def _failed(
    policy: FailurePolicy,
    row: ClaimedRow,
    exc: BaseException | None,
    counts: BatchCounts,
    projector: str | None = None,
) -> Failure:
    """Record one row's failure: the attempt, the backoff or dead, the log line."""
    exc = exc if exc is not None else RuntimeError("no event")
    failure = policy.fail(row.campaign_id, row.seq, row.attempt_count, exc, projector=projector)
    counts.dead += failure.dead
    counts.failed += not failure.dead
    log_failure(failure, exc)
    return failure
