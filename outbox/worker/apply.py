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
from outbox.projection.plan import starting_now
from outbox.queue.claim import ClaimedCampaign, ClaimedRow, event_batch
from outbox.queue.lease import Lease, lease_rows
from outbox.queue.settle import settle
from outbox.retry import FailurePolicy, log_failure
from outbox.worker.groups import group_holds
from outbox.worker.leasing import choose_leases, leasing_types, plan_leases
from outbox.worker.strategy import Batch, Isolate
from outbox.worker.tracks import Away, Tracks
from outbox.worker.transient import raise_transient
from outbox.worker.walk import campaign_writes, walk

__all__ = ["LIVE_HEAL", "Apply"]

# Journal events a batch that serves appends first heals an ordered projector by, per campaign
# (a few rows deleted by hand, a restart); one further behind catches up in the background.
LIVE_HEAL = 20


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
        settings, in_force = app.settings, batch.registry
        leased_types = in_force.leased_types()
        stopping = await app.pauses.projectors(conn, in_force) if campaigns else frozenset()
        # A paused projector holds only itself (S24), a lease-mode one too: its share of the
        # batch waits in holds, as does the share of a projector the database knows and this
        # worker's code lacks (a rolling deploy).
        registry = in_force.projectors
        away = [Away(n, registry[n].events, registry[n].ordered, True) for n in sorted(stopping)]
        if campaigns:
            away += [
                Away(k.projector, frozenset(k.events), k.ordered)
                for k in await app.absent.of(conn, in_force)
            ]
        others = await app.absent.others(conn) if campaigns else frozenset()
        tracks = Tracks(in_force, settings.poll_interval)
        tracks.read(campaigns, stopping, away, go_on=batch.background, others=others)
        work = walk(
            campaigns,
            limit=settings.batch_size,
            park=settings.park,
            ordered=settings.ordered,
            stop_after=leasing_types(in_force, stopping),
            attached=tracks.attached,
            leasing=in_force.leased_names(),
        )
        if away:
            tracks.wait_for(work, away)
        # A worker group's batch claims holds, not rows (S35): they are what it took.
        taken = sum(len(c.holds) for c in campaigns) if settings.grouped else len(work)
        counts = BatchCounts(claimed=taken)
        to_lease, holders = plan_leases(in_force, work, leased_types, tracks)
        if to_lease:
            leasing = {r.key for r in to_lease}
            work = [r for r in work if r.key not in leasing]
        if not campaigns:
            return counts
        dispatch = Dispatch(conn, in_force, settings.unsubscribed, bucket)
        dispatch.awaited = frozenset().union(*(a.events for a in away))
        done: list[Key] = []
        failures: list[Failure] = []
        if settings.ordered:  # the claim locked them
            dispatch.use(
                {(c.campaign_id, p): v for c in campaigns for p, v in c.checkpoints.items()}
            )
            if in_force.starting_now():
                firsts = {c.campaign_id: c.first_seq for c in campaigns if c.first_seq}
                starts = starting_now(in_force, firsts, dispatch.checkpoints, tracks.first_holds())
                dispatch.use(starts, write=True)
            if not batch.background:  # appends first: a long catch-up waits for the background
                tracks.defer_behind(campaigns, dispatch.checkpoints, LIVE_HEAL)
        if work:
            if not settings.ordered:
                await dispatch.load(sorted({r.campaign_id for r in work}))
            await _apply(batch, dispatch, work, done, failures, counts, tracks)
        if tracks.tails:
            await _catch_up(batch, dispatch, campaigns, set(done), counts, tracks)
        after.tally, after.durations = dispatch.tally, dispatch.durations
        after.unsubscribed = dispatch.skipped_types
        if not tracks.quiet:
            tracks.applied(done)
            done = [key for key in done if not tracks.holds_row(key)]
        if to_lease:
            await _lease(batch, to_lease, holders, failures, counts, tracks)
        if settings.grouped:  # a worker group's holds (S35): no work row, no campaign row
            holds, released, upto = group_holds(tracks, dispatch.checkpoints)
            writes = []
        else:
            holds, released, upto = list(tracks.placed.values()), tracks.released, None
            writes = (
                await campaign_writes(
                    conn,
                    campaigns,
                    set(done),
                    failures,
                    park=settings.park,
                    leased={lease.key: lease.expires_at for lease in after.leases},
                    tracks=tracks,
                )
                if settings.ordered  # under ordering `none` the claim reads the rows directly
                else []
            )
        settled = await settle(
            conn,
            bucket=bucket,
            done=done,
            failures=failures,
            campaigns=writes,
            checkpoints=dispatch.moves(),
            holds=holds,
            released=released,
            projectors=[*registry, *(a.name for a in away)],
            now=now,
            group=settings.group,
            upto=upto,
        )
        counts.more_due, after.ages = settled.due, settled.ages
        if settings.grouped:  # holds taken on that have further to go: the loop goes on
            counts.more_due += sum(1 for h in holds if h.status == "pending" and not h.delay)
        counts.paused += tracks.waiting
        counts.elsewhere += tracks.elsewhere
        return counts


async def _apply(
    batch: Batch,
    dispatch: Dispatch,
    work: list[ClaimedRow],
    done: list[Key],
    failures: list[Failure],
    counts: BatchCounts,
    tracks: Tracks,
) -> None:
    """The walked rows as one group: when it fails, `Isolate`, or, careful, the group rolled
    back to its savepoint and run again: without the projector that failed, which gets a hold
    at the event (S24), or, when no projector is to blame, in pieces around the failing
    event. The campaigns whose holds this batch retries (likely to fail again) run in a group
    of their own with a savepoint from the first pass, so a retry that fails again costs the
    batch no second pass."""
    ordered = batch.app.settings.ordered
    claimed = {r.key for r in work}
    retried = tracks.retried_campaigns() if not batch.careful else set()
    pending: deque[tuple[list[ClaimedRow], bool]] = deque(
        [
            ([r for r in work if r.campaign_id not in retried], False),
            ([r for r in work if r.campaign_id in retried], True),
        ]
        if retried
        else [(work, batch.careful)]
    )
    while pending:
        # Under campaign ordering, rows behind a row that failed in this batch wait.
        failed_at = {f.campaign_id: f.seq for f in failures} if ordered else {}
        rows, careful = pending.popleft()
        group = [r for r in rows if r.seq <= failed_at.get(r.campaign_id, r.seq)]
        if not group:
            continue
        bad = next((i for i, r in enumerate(group) if r.event_type is None), None)
        if bad is not None:  # a missing or undecodable event fails its row alone (S8)
            failures.append(_failed(batch.policy, group[bad], group[bad].unavailable, counts))
            pending.extendleft([(group[bad + 1 :], careful), (group[:bad], careful)])
            continue
        if careful:
            await dispatch.open_group()
        try:
            outcomes = await dispatch.apply(event_batch(group), tracks.skips)
        except GroupFailed as failed:
            raise_transient(failed, closed=dispatch.conn.is_closed())
            if not careful:
                raise Isolate(failed.describe()) from failed.cause
            if _hold(batch.policy, failed, tracks, counts, claimed):
                await dispatch.undo_group()
                pending.appendleft((group, careful))
                continue
            if not batch.careful:  # no projector to hold: the batch runs again, careful
                raise Isolate(failed.describe()) from failed.cause
            pieces = _split(batch.policy, group, failed, failures, counts)
            await dispatch.undo_group()
            pending.extendleft((piece, careful) for piece in reversed(pieces))
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
        held = outcomes.count(ApplyOutcome.HELD)
        failing = (  # an event a projector failed on in this batch counts as its failure
            sum(
                1
                for r, o in zip(group, outcomes, strict=True)
                if o is ApplyOutcome.HELD and tracks.failed_on(r.key)
            )
            if held
            else 0
        )
        held -= failing
        counts.applied += applied
        counts.skipped += len(group) - applied - behind - held - failing
        counts.behind += behind
        counts.held += held


async def _catch_up(
    batch: Batch,
    dispatch: Dispatch,
    campaigns: list[ClaimedCampaign],
    done: set[Key],
    counts: BatchCounts,
    tracks: Tracks,
) -> None:
    """The projectors whose holds this batch retried go on from their checkpoints (an
    unordered one's catch-up cursor) through the journal (`Dispatch.catch_up`), where the
    batch went through all of the campaign's rows (else their holds stay due, and the next
    batch goes on); one that fails gets its hold at the event, and the others go on without
    it."""
    complete = {
        c.campaign_id
        for c in campaigns
        if (c.last_seq is None or (c.rows and c.rows[-1].seq >= c.last_seq))
        and all(r.key in done or tracks.attached.get(r.key) == frozenset() for r in c.rows)
    }
    while True:
        tails = {
            cid: set(names) for cid, names in tracks.tails.items() if names and cid in complete
        }
        await dispatch.open_group()  # a savepoint whatever the pass: a retry may fail again
        try:
            reached, caught = await dispatch.catch_up(tails, tracks.skips.held)
        except GroupFailed as failed:
            raise_transient(failed, closed=dispatch.conn.is_closed())
            await dispatch.undo_group()
            if not _hold(batch.policy, failed, tracks, counts, set()):
                raise  # catch_up names the projector of every failure it raises
            continue
        counts.applied += caught  # events a held projector applied from the journal
        break
    for cid, names in tracks.tails.items():
        for name in names if cid in complete else ():
            tracks.caught_up(cid, name, done=(cid, name) in reached)


def _hold(
    policy: FailurePolicy,
    failed: GroupFailed,
    tracks: Tracks,
    counts: BatchCounts,
    claimed: set[Key],
) -> bool:
    """A projector of the registry failed on a known event: it gets a hold there (attempts,
    backoff, dead after the last) and the group goes on without it. False: nobody to hold
    (a guard, a gap, an unknown type): the row fails as a whole."""
    name, event = failed.projector, failed.event
    if name is None or event is None or name not in tracks.registry.projectors:
        return False
    cid, seq = event
    failure = policy.fail(cid, seq, tracks.attempts(cid, name, seq), failed.cause, projector=name)
    tracks.fail(failure, event_type=None if event in claimed else failed.event_type)
    counts.dead += failure.dead
    counts.failed += not failure.dead
    log_failure(failure, failed.cause)
    return True


async def _lease(
    batch: Batch,
    rows: list[ClaimedRow],
    holders: dict[Key, frozenset[str]],
    failures: list[Failure],
    counts: BatchCounts,
    tracks: Tracks,
) -> None:
    """Lease the rows whose campaign did not fail before them in this batch (S13); a retry's
    holds are due again when its lease would expire, not before."""
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
        holders=holders,
    )
    for lease in leased:
        if lease.holders is not None:
            tracks.leasing(lease.key, lease.holders, settings.lease_seconds)
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
