"""Whether the outbox is well: `maintenance health` (probes, cron), the install as a whole or
one projector by its own figures.

One function taking an executor first and returning a typed result; the CLI renders it as a
line or as JSON (its fields, in order, are the `--json` keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import SchemaNotReady
from outbox.ops.serving import unserved_projectors
from outbox.projection.known import require_recorded
from outbox.projection.sweep import catch_ups
from outbox.queue import inspect
from outbox.queue.holds import projector_stall
from outbox.queue.stalls import STALL_AFTER, stalled_campaigns
from outbox.schema import check_current

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["Health", "ProjectorHealth", "health"]


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
