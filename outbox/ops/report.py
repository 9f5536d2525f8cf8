"""What the queue holds and whether it is well: the outbox report, health, a drain's leftovers,
and the audit of operators' actions.

Each function takes an executor first and returns a typed result; the CLI renders it as a
table or as JSON (its fields, in order, are the `--json` keys). Nothing here renders, parses
options or writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import SchemaNotReady, ValidationError
from outbox.ops.serving import ProjectorService, served, unserved_projectors
from outbox.projection.builds import Build, list_builds
from outbox.projection.known import list_known, require_recorded
from outbox.projection.sweep import CatchUp, catch_ups
from outbox.queue import inspect
from outbox.queue.holds import ProjectorHolds, count_holds, projector_stall
from outbox.queue.horizon import HorizonHolder, horizon_holder
from outbox.queue.inspect import (
    STATUSES,
    BlockedCampaign,
    FailureGroup,
    LeaseRow,
    OldestClaimable,
    ParkedRow,
    QueueRow,
    ShadowObservations,
    StatusCounts,
)
from outbox.queue.repair import AuditEntry, list_audit
from outbox.queue.stalls import STALL_AFTER, StalledCampaign, stalled_campaigns
from outbox.schema import check_current
from outbox.worker.registration import ListedWorker, listed_workers

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = [
    "DEFAULT_SCAN",
    "MAX_LIMIT",
    "MAX_SCAN",
    "STATUSES",
    "Audit",
    "Failures",
    "Health",
    "Leftovers",
    "ProjectorHealth",
    "Report",
    "Summary",
    "audit",
    "check_limit",
    "failures",
    "health",
    "leftovers",
    "outbox_report",
]

MAX_LIMIT = 10_000
# Rows an error grouping reads by default and at most (each costs two regular expressions).
DEFAULT_SCAN = 10_000
MAX_SCAN = 1_000_000
SUMMARY_LIST_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Summary:
    campaign_id: str | None
    counts: StatusCounts
    total: int
    oldest_claimable: OldestClaimable | None
    earliest_next_attempt_at: datetime | None
    blocked_campaigns: list[BlockedCampaign]
    shadow: ShadowObservations
    parked_rows: list[ParkedRow]
    leases: list[LeaseRow]
    workers: list[ListedWorker]
    resolved_mode: str | None
    holds: list[ProjectorHolds]  # per projector: what holds it alone (S24)
    catch_ups: list[CatchUp]  # projectors that start at the beginning, their progress (S25)
    builds: list[Build]  # each projector's latest build by the catch-up engine (S30)
    # The oldest snapshot the server holds for this database (what keeps dead versions alive).
    snapshot: HorizonHolder | None
    # Each recorded projector owed work, its definition's fingerprint and the live workers that
    # run it (S33): none, or some under another definition, is for an operator to look at.
    projectors: list[ProjectorService]
    # Campaigns whose head has been due for a while that no claim can take (S33).
    stalled_campaigns: list[StalledCampaign]


@dataclass(frozen=True, slots=True)
class Report:
    """`maintenance outbox-report`: the summary, then rows (failed and dead first)."""

    status: str | None
    limit: int
    summary: Summary
    rows: list[QueueRow]


@dataclass(frozen=True, slots=True)
class Health:
    """`maintenance health`: healthy or not, the figures it judged, and every reason."""

    healthy: bool
    read_only: bool
    migrations: str
    oldest_claimable_age_seconds: float | None
    max_oldest_age_seconds: float | None
    dead_rows: int | None
    max_dead: int
    failed_rows: int | None
    max_failed: int | None
    blocked_campaigns: int | None
    max_blocked: int
    projector: ProjectorHealth | None
    # Projectors owed work that no live worker runs, or that one runs under another definition
    # than the recorded one, and campaigns stalled past `max_stall_seconds` (S33).
    unserved_projectors: list[str]
    stalled_campaigns: int | None
    max_stall_seconds: float
    reasons: list[str]


@dataclass(frozen=True, slots=True)
class ProjectorHealth:
    """`maintenance health --projector`: one projector's state (the events it is dead and
    failing on: its holds, and its types' rows failed with no hold), and the lag it was judged
    by (`max_lag_seconds`)."""

    projector: str
    paused: bool
    catching_up: bool
    dead: int
    failed: int
    lag_seconds: float
    max_lag_seconds: float


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What a finished drain leaves: rows per status, and campaigns blocked behind a failed
    or dead head."""

    pending: int
    processing: int
    failed: int
    dead: int
    blocked_campaigns: int


@dataclass(frozen=True, slots=True)
class Audit:
    """`maintenance audit`: the newest audited actions (one campaign's, or all)."""

    campaign_id: str | None
    limit: int
    entries: list[AuditEntry]


@dataclass(frozen=True, slots=True)
class Failures:
    """`maintenance outbox-failures`: failed and dead rows grouped by projector and error shape,
    from at most `scan` rows (`scanned` == `scan`: more may exist, the counts are of those)."""

    status: str | None
    scan: int
    scanned: int
    groups: list[FailureGroup]


def check_limit(limit: int, *, name: str = "limit", most: int = MAX_LIMIT) -> None:
    """An integer from 1 to `most` (the `name` option's), or a ValidationError."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise ValidationError(name, f"expected an integer from 1 to {most}, got {limit!r}")


async def outbox_report(
    executor: Executor,
    *,
    status: str | None = None,
    limit: int = 50,
    campaign_id: str | None = None,
    park: bool = False,
    resolved_mode: str | None = None,
    payload: bool = False,
    ordered: bool = True,
) -> Report:
    """Counts, the oldest claimable row, blocked campaigns, parked rows (under `park`), leases,
    the workers (live or stale), then rows (`payload`: with their events' payloads).
    `resolved_mode` is what a worker with the caller's settings runs."""
    if status is not None and status not in STATUSES:
        raise ValidationError("status", f"expected one of {'/'.join(STATUSES)}, got {status!r}")
    check_limit(limit)
    async with db.acquire(executor) as conn:
        counts = await inspect.count_rows(conn, campaign_id)
        oldest = await inspect.oldest_claimable(conn, campaign_id, park=park)
        earliest = await inspect.earliest_next_attempt(conn, campaign_id)
        blocked, _ = await inspect.blocked_campaigns(
            conn, campaign_id, park=park, limit=SUMMARY_LIST_LIMIT
        )
        parked = (
            await inspect.list_parked(conn, campaign_id, limit=SUMMARY_LIST_LIMIT) if park else []
        )
        rows = await inspect.list_rows(
            conn, status=status, campaign_id=campaign_id, limit=limit, payload=payload
        )
        leases = await inspect.list_leases(conn, campaign_id, limit=SUMMARY_LIST_LIMIT)
        workers = await listed_workers(conn)
        shadow = await inspect.shadow_observations(conn, campaign_id)
        held = await count_holds(conn, campaign_id)
        caught = await catch_ups(conn) if campaign_id is None else []
        builds = await list_builds(conn) if campaign_id is None else []
        snapshot = await horizon_holder(conn)
        serving = served(await list_known(conn), workers) if campaign_id is None else []
        stalled = await stalled_campaigns(conn, ordered=ordered) if campaign_id is None else []
    summary = Summary(
        campaign_id,
        counts,
        counts.total,
        oldest,
        earliest,
        blocked,
        shadow,
        parked,
        leases,
        workers,
        resolved_mode,
        held,
        caught,
        builds,
        snapshot,
        serving,
        stalled,
    )
    return Report(status, limit, summary, rows)


async def leftovers(executor: Executor, *, park: bool) -> Leftovers:
    """What a finished drain leaves (under `park`, dead rows block nothing)."""
    async with db.acquire(executor) as conn:
        counts = await inspect.count_rows(conn)
        _, blocked = await inspect.blocked_campaigns(conn, park=park, limit=1)
    return Leftovers(counts.pending, counts.processing, counts.failed, counts.dead, blocked)


async def health(
    executor: Executor,
    *,
    max_oldest_age: float | None = None,
    max_dead: int = 0,
    max_blocked: int = 0,
    park: bool = False,
    projector: str | None = None,
    max_lag: float = 60.0,
    max_stall: float = STALL_AFTER,
    ordered: bool = True,
    max_failed: int | None = None,
) -> Health:
    """Healthy when migrations are current, at most `max_dead` rows are dead (and at most
    `max_failed` failed, when given), at most `max_blocked` campaigns are blocked behind a
    failed or dead head (under `park` dead rows block nothing), the oldest claimable row is
    younger than `max_oldest_age`, and no campaign stalls past `max_stall`; the reasons say
    what is not; a server in recovery (a standby: the DSN does not lead to the primary) is
    unhealthy whatever the figures. (The database answering is the caller's first check.)
    `projector`: that projector alone is judged, by its own figures against the same
    thresholds (`_projector_health`): the install-wide rows, campaigns and oldest age are
    reported, not judged, so another projector's dead rows never make it unhealthy."""
    reasons: list[str] = []
    refusal = await db.write_refusal(executor, session=False)
    if refusal is not None:
        reasons.append(
            f"read-only: {refusal}; workers cannot apply here (point the DSN at the primary, "
            "e.g. a multi-host DSN with target_session_attrs=read-write)"
        )
    try:
        await check_current(executor)
        migrations = "current"
    except SchemaNotReady as exc:
        migrations = "not current"
        reasons.append(str(exc))
    age: float | None = None
    dead = failed = blocked = stalls = None
    install = projector is None  # the install-wide figures are judged, not only reported
    if migrations == "current":
        async with db.acquire(executor) as conn:
            oldest = await inspect.oldest_claimable(conn, park=park)
            dead = await inspect.count_dead(conn)
            if max_failed is not None:
                failed = (await inspect.count_rows(conn)).failed
            first, blocked = await inspect.blocked_campaigns(conn, park=park, limit=1)
            stalled = await stalled_campaigns(conn, after=max_stall, ordered=ordered)
        if stalls := len(stalled):
            reasons.append(f"{stalls} stalled campaign(s) (oldest: {stalled[0].describe()})")
        if install and dead > max_dead:
            reasons.append(f"{dead} dead row(s), over {max_dead}")
        if install and failed is not None and max_failed is not None and failed > max_failed:
            reasons.append(f"{failed} failed row(s), over {max_failed}")
        if install and blocked > max_blocked:
            where = (
                f" (oldest: {first[0].campaign_id!r} at seq {first[0].blocking_seq})"
                if first
                else ""
            )
            reasons.append(f"{blocked} blocked campaign(s), over {max_blocked}{where}")
        if oldest is not None:
            age = oldest.age_seconds
            if install and max_oldest_age is not None and age > max_oldest_age:
                reasons.append(
                    f"oldest claimable row {oldest.campaign_id!r} seq {oldest.seq} "
                    f"is {age:.0f}s old, over {max_oldest_age:g}s"
                )
    judged = None
    unserved: list[str] = []
    if migrations == "current":
        unserved = await unserved_projectors(executor, reasons, projector)
    if projector is not None and migrations == "current":
        judged = await _projector_health(
            executor, projector, max_lag, max_dead, max_failed, reasons
        )
    return Health(
        not reasons,
        refusal is not None,
        migrations,
        age,
        max_oldest_age,
        dead,
        max_dead,
        failed,
        max_failed,
        blocked,
        max_blocked,
        judged,
        unserved,
        stalls,
        max_stall,
        reasons,
    )


async def _projector_health(
    executor: Executor,
    name: str,
    max_lag: float,
    max_dead: int,
    max_failed: int | None,
    reasons: list[str],
) -> ProjectorHealth:
    """Judge projector `name` (recorded, S23): stalled when something it owes has been due and
    unworked for over `max_lag` seconds (a due hold no worker took, a due row of its types
    no worker claimed; nothing due is no lag, so an idle store raises no alarm); unhealthy
    too when paused, dead on more than `max_dead` events or failing on more than
    `max_failed`."""
    async with db.acquire(executor) as conn:
        known = await require_recorded(conn, name)
        lag = await projector_stall(conn, name, known.events)
        catching = any(
            c.projector == name and c.catching_up
            for c in await catch_ups(conn, progress=False)  # whether, not how far: no lag pass
        )
    if known.paused:
        reasons.append(f"projector {name!r} is paused (maintenance projector-resume)")
    if lag.dead > max_dead:
        reasons.append(f"projector {name!r} is dead on {lag.dead} event(s), over {max_dead}")
    if max_failed is not None and lag.failed > max_failed:
        reasons.append(f"projector {name!r} is failing on {lag.failed} event(s), over {max_failed}")
    if lag.lag_seconds > max_lag and not known.paused:
        what = (
            "a due hold of it has not been worked"
            if (lag.hold_seconds or 0.0) >= (lag.row_seconds or 0.0)
            else "a due row of its types has not been claimed"
        )
        reasons.append(
            f"projector {name!r} is stalled: {what} for {lag.lag_seconds:.0f}s, over {max_lag:g}s"
        )
    return ProjectorHealth(
        name, known.paused, catching, lag.dead, lag.failed, lag.lag_seconds, max_lag
    )


async def audit(executor: Executor, *, campaign_id: str | None = None, limit: int = 50) -> Audit:
    """Operators' actions on work rows (requeues, discards), newest first, at most `limit`."""
    check_limit(limit)
    async with db.acquire(executor) as conn:
        entries = await list_audit(conn, campaign_id, limit=limit)
    return Audit(campaign_id, limit, entries)


async def failures(
    executor: Executor, *, status: str | None = None, scan: int = DEFAULT_SCAN, limit: int = 50
) -> Failures:
    """Failed and dead rows (`status`: only failed or only dead) grouped by projector and error
    shape, largest group first, at most `limit` groups, counted from at most `scan` rows."""
    if status is not None and status not in ("failed", "dead"):
        raise ValidationError("status", f"expected failed or dead, got {status!r}")
    check_limit(limit)
    check_limit(scan, name="scan", most=MAX_SCAN)
    async with db.acquire(executor) as conn:
        groups, scanned = await inspect.failure_groups(conn, status=status, scan=scan, limit=limit)
    return Failures(status, scan, scanned, groups)
