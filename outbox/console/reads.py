"""What the console's pages read, each in one read-only transaction under the console's session.

The session names the connection `outbox-console` and bounds every statement (5 s): a page can
fail, it cannot hold the database up. Every read is bounded: counts stop at `COUNT_BOUND`,
lists at a limit, error groups read at most the report's default scan (`DEFAULT_SCAN`). No SQL
here: the reads are the queue's, the journal's, the guards' and the registry's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import orjson

from outbox import db, schema
from outbox.append.journal import JournalEntry, get_campaign_head, recent_events
from outbox.config import Session
from outbox.errors import NotFound, ValidationError
from outbox.ops.report import Failures, failures
from outbox.ops.serving import ProjectorService, served
from outbox.projection.app import Outbox
from outbox.projection.builds import Build, list_builds
from outbox.projection.guards import ProjectorLag, checkpoints_of, projector_lag
from outbox.projection.known import list_known
from outbox.projection.pauses import Pause, PauseEntry, list_pause_audit, list_pauses
from outbox.projection.versions import list_versions
from outbox.queue import inspect
from outbox.queue.attention import (
    AttentionPage,
    EventRow,
    get_event,
    list_attention,
    list_campaign_rows,
)
from outbox.queue.holds import ProjectorHolds, RowHold, count_holds, row_holds
from outbox.queue.inspect import BlockedCampaign, LeaseRow, QueueRow, ShadowObservations
from outbox.queue.repair import AuditEntry, Cursor, list_audit
from outbox.queue.stalls import StalledCampaign, stalled_campaigns
from outbox.schema import MigrationState
from outbox.worker.registration import ListedWorker, listed_workers

__all__ = [
    "CONSOLE_SESSION",
    "COUNT_BOUND",
    "Blocked",
    "CampaignView",
    "Fleet",
    "ProjectorRow",
    "Projectors",
    "System",
    "audit_cursor",
    "aware_time",
    "read_blocked",
    "read_campaign",
    "read_failures",
    "read_fleet",
    "read_projectors",
    "read_row",
    "read_rows",
    "read_system",
    "reading",
    "redacted",
    "redacted_row",
    "time_cursor",
]

# Rows counted per status (and behind a blocked head) at most: past it a page says "10,000+".
COUNT_BOUND = 10_000
# Rows a list shows at most.
LIST_LIMIT = 100
# Blocked campaigns read (oldest first) for a ranking.
BLOCKED_LIMIT = 1_000
# The console's session on the connections it borrows: named, and never a long statement.
CONSOLE_SESSION = Session("outbox-console", {"statement_timeout": "5s"}, {})


@asynccontextmanager
async def reading(executor: db.Executor) -> AsyncIterator[db.Connection]:
    """A connection under the console's session, in a read-only transaction."""
    async with (
        db.acquire(executor, session=CONSOLE_SESSION) as conn,
        conn.transaction(readonly=True),
    ):
        yield conn


async def read_failures(executor: db.Executor, *, status: str | None = None) -> Failures:
    async with reading(executor) as conn:
        return await failures(conn, status=status, limit=LIST_LIMIT)


@dataclass(frozen=True, slots=True)
class Blocked:
    """Blocked campaigns: by head age, `LIST_LIMIT` a page (after `after`'s cursor); or the
    oldest `BLOCKED_LIMIT` ranked by rows waiting (`order`)."""

    order: str  # "age" or "waiting"
    total: int
    read: int
    bound: int
    campaigns: list[BlockedCampaign]
    after: str | None = None  # by age: the next page's cursor (None: the last page)
    # Campaigns whose due head no claim can take (S33), on the first page.
    stalled: list[StalledCampaign] = field(default_factory=list)


def time_cursor(text: str, name: str = "after") -> tuple[datetime, str]:
    """A page's cursor ordered by time: `<time, ISO 8601>/<key>` (a blocked campaign's head
    time and campaign, an audit entry's time and id)."""
    at, _, key = text.partition("/")
    when = aware_time(at)
    if when is None or not key:
        raise ValidationError(name, f"expected a page cursor, got {text[:40]!r}")
    return when, key


def aware_time(text: str) -> datetime | None:
    """An ISO 8601 time with its zone; None when `text` is not one."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def audit_cursor(text: str) -> tuple[datetime, int]:
    at, key = time_cursor(text, "audit_before")
    if not key.isdigit() or len(key) > 18:
        raise ValidationError("audit_before", f"expected a page cursor, got {text[:40]!r}")
    return at, int(key)


async def read_blocked(
    executor: db.Executor,
    *,
    park: bool,
    order: str,
    after: tuple[datetime, str] | None = None,
    ordered: bool = True,
) -> Blocked:
    waiting = order == "waiting"
    async with reading(executor) as conn:
        found, total = await inspect.blocked_campaigns(
            conn,
            park=park,
            limit=BLOCKED_LIMIT if waiting else LIST_LIMIT + 1,
            waiting_bound=COUNT_BOUND,
            after=None if waiting else after,
        )
        stalled = [] if after else await stalled_campaigns(conn, limit=LIST_LIMIT, ordered=ordered)
    if waiting:
        found = sorted(found, key=lambda b: -b.waiting)
        return Blocked(order, total, len(found), COUNT_BOUND, found[:LIST_LIMIT], None, stalled)
    page = found[:LIST_LIMIT]
    last = page[-1] if len(found) > LIST_LIMIT else None
    cursor = f"{last.enqueued_at.isoformat()}/{last.campaign_id}" if last else None
    return Blocked(order, total, len(page), COUNT_BOUND, page, cursor, stalled)


@dataclass(frozen=True, slots=True)
class CampaignView:
    """One campaign: its journal head, each projector's checkpoint, its queue rows (failed and
    dead first, with payloads), the journal's tail and the audit of actions on its rows."""

    campaign_id: str
    journal_head: int
    checkpoints: dict[str, int]
    rows: list[QueueRow]  # a page of its work rows in seq order
    journal_tail: list[JournalEntry]
    audit: list[AuditEntry]
    rows_total: int = 0  # its work rows, counted up to COUNT_BOUND
    rows_after: int | None = None  # the next page's seq cursor (None: the last page)
    audit_before: str | None = None  # the audit's next (older) page's cursor (None: the last)


def _shown(payload: Any, redact: Callable[[Any], Any]) -> Any:
    """What `redact` shows of a payload: it receives the decoded JSON, or the stored text when
    that is not JSON."""
    if isinstance(payload, str):
        with suppress(orjson.JSONDecodeError):
            payload = orjson.loads(payload)
    return redact(payload)


def redacted(view: CampaignView, redact: Callable[[Any], Any]) -> CampaignView:
    """`view` with each payload as `redact` shows it."""
    rows = [replace(r, payload=_shown(r.payload, redact)) for r in view.rows]
    tail = [
        replace(e, payload=orjson.dumps(_shown(e.payload, redact)).decode())
        for e in view.journal_tail
    ]
    return replace(view, rows=rows, journal_tail=tail)


async def read_campaign(
    executor: db.Executor,
    campaign_id: str,
    *,
    after: int = 0,
    audit_before: tuple[datetime, int] | None = None,
) -> CampaignView:
    """A campaign with the page of its work rows after seq `after`; NotFound when the journal,
    the queue and the audit know nothing of it."""
    async with reading(executor) as conn:
        rows = await list_campaign_rows(
            conn, campaign_id, after=after, limit=LIST_LIMIT, bound=COUNT_BOUND
        )
        view = CampaignView(
            campaign_id,
            await get_campaign_head(conn, campaign_id),
            await checkpoints_of(conn, campaign_id),
            rows.rows,
            await recent_events(conn, campaign_id, limit=20),
            await list_audit(conn, campaign_id, limit=LIST_LIMIT + 1, before=audit_before),
            rows.total,
            rows.after,
        )
    audit = view.audit[:LIST_LIMIT]
    more = audit[-1].cursor if len(view.audit) > LIST_LIMIT else None
    view = replace(view, audit=audit, audit_before=more)
    if not (view.journal_head or view.rows or view.audit or view.checkpoints):
        raise NotFound(f"no campaign {campaign_id!r}: the journal has no event of it")
    return view


async def read_rows(
    executor: db.Executor,
    *,
    status: str | None,
    event_type: str | None,
    projector: str | None,
    fingerprint: str | None,
    prefix: str | None,
    after: Cursor,
) -> AttentionPage:
    """A page of failed and dead rows (`attention.list_attention`), `LIST_LIMIT` long, the
    matches counted up to `COUNT_BOUND`."""
    async with reading(executor) as conn:
        return await list_attention(
            conn,
            status=status,
            event_type=event_type,
            projector=projector,
            fingerprint=fingerprint,
            prefix=prefix,
            after=after,
            limit=LIST_LIMIT,
            bound=COUNT_BOUND,
        )


@dataclass(frozen=True, slots=True)
class RowView:
    """One event in full: the journal's, its work row's state, its holds and its audit."""

    event: EventRow
    holds: list[RowHold]
    audit: list[AuditEntry]


async def read_row(executor: db.Executor, campaign_id: str, seq: int) -> RowView:
    """NotFound when the journal has no such event."""
    async with reading(executor) as conn:
        event = await get_event(conn, campaign_id, seq)
        if event is None:
            raise NotFound(f"no event {campaign_id!r} seq {seq} in the journal")
        holds = await row_holds(conn, campaign_id, seq)
        audit = await list_audit(conn, campaign_id, limit=LIST_LIMIT)
    return RowView(event, holds, [a for a in audit if a.seq == seq])


def redacted_row(view: RowView, redact: Callable[[Any], Any]) -> RowView:
    """`view` with its payload as `redact` shows it."""
    shown = orjson.dumps(_shown(view.event.payload, redact)).decode()
    return replace(view, event=replace(view.event, payload=shown))


@dataclass(frozen=True, slots=True)
class Fleet:
    """The workers that heartbeated lately, and the rows they hold in lease mode."""

    workers: list[ListedWorker]
    leases: list[LeaseRow]


async def read_fleet(executor: db.Executor) -> Fleet:
    async with reading(executor) as conn:
        return Fleet(
            await listed_workers(conn), await inspect.list_leases(conn, None, limit=LIST_LIMIT)
        )


@dataclass(frozen=True, slots=True)
class System:
    """Migrations and what shadow workers saw."""

    migrations: list[MigrationState]
    shadow: ShadowObservations


async def read_system(executor: db.Executor) -> System:
    async with reading(executor) as conn:
        return System(await schema.status(conn), await inspect.shadow_observations(conn))


@dataclass(frozen=True, slots=True)
class ProjectorRow:
    """A projector of the app (or, without the app, one that is paused)."""

    name: str
    events: list[str]
    ordered: bool | None
    transactional: bool | None
    pause: Pause | None
    lag: ProjectorLag | None  # ordered projectors: from their checkpoints to the journal heads
    # Events applied, skipped and failed since the live workers started (their registry rows).
    outcomes: dict[str, int]
    holds: ProjectorHolds | None = None  # what holds it alone (S24): failed, dead, waiting
    # Its declared name, version and the version's state (S29: live, building, superseded;
    # None: not recorded yet).
    base: str | None = None
    version: int | None = None
    state: str | None = None
    build: Build | None = None  # its latest build by the catch-up engine (S30)
    # Its recorded definition's fingerprint and the live workers that run it (S33; None: not
    # recorded yet, or superseded).
    fingerprint: str | None = None
    service: ProjectorService | None = None


@dataclass(frozen=True, slots=True)
class Projectors:
    """The app's projectors with their pauses (`known`: the console was given the app)."""

    known: bool
    projectors: list[ProjectorRow]
    history: list[PauseEntry]  # the latest pauses and resumes


async def read_projectors(executor: db.Executor, app: Outbox | None) -> Projectors:
    """The app's projectors, then those the database records that the app lacks (all of them
    without the app: a mixed fleet has no single app), then paused ones neither knows."""
    mine = sorted(app.registry.projectors.values(), key=lambda p: p.name) if app else []
    async with reading(executor) as conn:
        recorded = {k.projector: k for k in await list_known(conn)}
        pauses = {p.projector: p for p in await list_pauses(conn)}
        subscribed = {p.name: (p.events, p.ordered) for p in mine}
        for k in recorded.values():
            subscribed.setdefault(k.projector, (frozenset(k.events), k.ordered))
        lags = {
            name: await projector_lag(conn, name, events)
            for name, (events, ordered) in subscribed.items()
            if ordered
        }
        held = {h.projector: h for h in await count_holds(conn)}
        workers = await listed_workers(conn)
        history = await list_pause_audit(conn, limit=LIST_LIMIT)
        versions = {v.projector: v for v in await list_versions(conn)}
        builds = {b.projector: b for b in await list_builds(conn)}
    serving = {s.projector: s for s in served(list(recorded.values()), workers)}
    outcomes: dict[str, Counter[str]] = {}
    for w in (w for w in workers if w.live):  # since the live ones started
        for tally in w.counters.get("projectors", []):
            found = outcomes.setdefault(tally["projector"], Counter())
            found.update({k: int(tally.get(k, 0)) for k in ("applied", "skipped", "failed")})

    def row(
        name: str,
        events: Iterable[str],
        ordered: bool,
        transactional: bool,
        base: str,
        version: int,
    ) -> ProjectorRow:
        record = recorded.get(name)
        return ProjectorRow(
            name, sorted(events), ordered, transactional,
            pauses.pop(name, None), lags.get(name), dict(outcomes.get(name, {})),
            held.get(name), base, version,
            versions[name].state if name in versions else None, builds.get(name),
            record.fingerprint if record else None, serving.get(name),
        )  # fmt: skip

    rows = [row(p.name, p.events, p.ordered, p.transactional, p.base, p.version) for p in mine]
    rows += [
        row(k.projector, k.events, k.ordered, k.transactional, k.base, k.version)
        for k in recorded.values()
        if k.projector not in {p.name for p in mine}
    ]
    rows += [
        ProjectorRow(name, [], None, None, p, None, dict(outcomes.get(name, {})), held.get(name))
        for name, p in sorted(pauses.items())
    ]
    return Projectors(app is not None, rows, history)
