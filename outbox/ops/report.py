"""What the queue holds: the outbox report, a drain's leftovers, failures by error group, and
the audit of operators' actions (whether it is well: `outbox.ops.health`).

Each function takes an executor first and returns a typed result; the CLI renders it as a
table or as JSON (its fields, in order, are the `--json` keys). Nothing here renders, parses
options or writes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import ValidationError
from outbox.ops.serving import ProjectorService, served
from outbox.projection.builds import Build, list_builds
from outbox.projection.known import list_known
from outbox.projection.pauses import list_pauses
from outbox.projection.sweep import CatchUp, catch_ups
from outbox.queue import inspect
from outbox.queue.holds import ProjectorHolds, count_holds
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
from outbox.queue.stalls import StalledCampaign, stalled_campaigns
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
    "Leftovers",
    "Report",
    "Summary",
    "audit",
    "check_limit",
    "failures",
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
        if held:
            paused = {p.projector for p in await list_pauses(conn)}
            held = [replace(h, paused=h.projector in paused) for h in held]
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
