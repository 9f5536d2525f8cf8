"""`maintenance outbox-report` and `maintenance outbox-failures`: what the queue holds (whether
it is well: `outbox.cli.health`)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated

import orjson
import typer
from rich.table import Table

from outbox.cli.attention import render_attention
from outbox.cli.common import (
    DsnOption,
    JsonOption,
    emit_json,
    settings_for,
    stderr,
    stdout,
)
from outbox.cli.operator import (
    CampaignOption,
    LimitOption,
    Status,
    age,
    app,
    pool_run,
    when,
)
from outbox.ops.report import (
    DEFAULT_SCAN,
    MAX_SCAN,
    Failures,
    Report,
    failures,
    outbox_report,
)

# Identifiers fold onto a second line in a narrow terminal: never cut off.
_FOLDED = {"campaign", "event type", "worker", "owner", "last error"}
# Below this width the rows table leaves out its timestamps (and says so).
_WIDE = 120


def _table(*columns: str, title: str) -> Table:
    table = Table(title=title)
    for name in columns:
        table.add_column(name, overflow="fold" if name in _FOLDED else "ellipsis")
    return table


def render_report(report: Report, *, payload: bool = False) -> None:
    summary = report.summary
    counts = _table("status", "rows", title="outbox queue")
    for status, n in dataclasses.asdict(summary.counts).items():
        counts.add_row(status, str(n))
    counts.add_row("total", str(summary.total))
    stdout.print(counts)
    oldest = summary.oldest_claimable
    if oldest:
        stdout.print(
            f"oldest claimable: {oldest.campaign_id} seq {oldest.seq}, "
            f"enqueued {when(oldest.enqueued_at)}, age {age(oldest.age_seconds)}"
        )
    stdout.print(f"earliest next attempt: {when(summary.earliest_next_attempt_at)}")
    holder = summary.snapshot
    if holder:
        since = "" if holder.held_seconds is None else f", held {age(holder.held_seconds)}"
        stdout.print(f"oldest snapshot: {holder.described}{since}")
    shadow = summary.shadow
    if shadow and shadow.rows_seen:
        stdout.print(
            f"shadow worker: {shadow.rows_seen} row(s) seen, {shadow.sightings} "
            f"sighting(s), longest enqueue-to-sighting lag {age(shadow.max_lag_seconds)}"
        )
    if summary.holds:
        held = _table(
            "projector",
            "failed",
            "dead",
            "waiting",
            "campaigns",
            "since",
            "paused",
            title="projectors held (each alone: the others go on)",
        )
        for h in summary.holds:
            held.add_row(
                h.projector,
                str(h.failed),
                str(h.dead),
                str(h.waiting),
                str(h.campaigns),
                when(h.since),
                "paused: resume it to go on" if h.paused else "",
            )
        stdout.print(held)
    render_attention(summary.projectors, summary.stalled_campaigns)
    catching_up = [c for c in summary.catch_ups if c.catching_up]
    if catching_up:
        caught = _table(
            "projector",
            "campaigns done",
            "events behind",
            "sweep",
            "since",
            title="projectors catching up from the journal",
        )
        for c in catching_up:
            caught.add_row(
                c.projector,
                f"{c.done} of {c.campaigns}",
                str(c.events_behind),
                "under way" if c.swept_at is None else f"done {when(c.swept_at)}",
                when(c.first_seen_at),
            )
        stdout.print(caught)
    if summary.builds:
        built = _table(
            "projector",
            "kind",
            "state",
            "events",
            "campaigns",
            "rate",
            "eta",
            "failed",
            "updated",
            title="builds by the catch-up engine (projections-rebuild)",
        )
        for one in summary.builds:
            built.add_row(
                one.projector,
                one.kind,
                one.state,
                f"{one.events:,} of {one.events_total:,}"
                + (
                    " (the rest left to the workers)"
                    if one.state == "complete" and one.events < one.events_total
                    else ""
                ),
                f"{one.campaigns:,} of {one.campaigns_total:,}",
                f"{one.rate:,.0f}/s",
                age(one.eta),
                str(one.failed),
                when(one.updated_at),
            )
        stdout.print(built)
    if summary.blocked_campaigns:
        blocked = _table(
            "campaign", "blocking seq", "status", "waiting", "age", title="blocked campaigns"
        )
        for b in summary.blocked_campaigns:
            blocked.add_row(
                b.campaign_id,
                str(b.blocking_seq),
                b.status,
                str(b.waiting),
                age(b.age_seconds),
            )
        stdout.print(blocked)
    if summary.parked_rows:
        parked = _table("campaign", "seq", "event type", "last error", title="parked rows")
        for p in summary.parked_rows:
            parked.add_row(p.campaign_id, str(p.seq), p.event_type, p.last_error or "")
        stdout.print(parked)
    if summary.leases:
        leases = _table(
            "campaign",
            "seq",
            "event type",
            "owner",
            "epoch",
            "attempts",
            "lease age",
            "expires in",
            title="leases (processing rows)",
        )
        for lease in summary.leases:
            expires = lease.expires_in_seconds
            leases.add_row(
                lease.campaign_id,
                str(lease.seq),
                lease.event_type,
                lease.lease_owner,
                str(lease.claim_epoch),
                str(lease.attempt_count),
                age(lease.lease_age_seconds),
                age(expires) if expires is None or expires >= 0 else "expired",
            )
        stdout.print(leases)
    workers = _table(
        "worker", "mode", "loops", "heartbeat age", "state",
        title="workers (stale: silent for three heartbeats)",
    )  # fmt: skip
    for w in summary.workers:
        workers.add_row(
            w.worker_id, w.mode, str(w.concurrency), age(w.heartbeat_age_seconds), w.state
        )
    stdout.print(workers)
    wide = stdout.width >= _WIDE
    rows = _table(
        "campaign",
        "seq",
        "event type",
        "status",
        "attempts",
        *(("next attempt", "enqueued") if wide else ()),
        "last error",
        *(("payload",) if payload else ()),
        title=f"rows (limit {report.limit})",
    )
    for r in report.rows:
        times = (when(r.next_attempt_at), when(r.enqueued_at)) if wide else ()
        shown = (_payload_text(r.payload),) if payload else ()
        rows.add_row(
            r.campaign_id,
            str(r.seq),
            r.event_type,
            r.status,
            str(r.attempt_count),
            *times,
            (r.last_error or "")[:80],
            *shown,
        )
    if not wide:
        stderr.print(
            f"{stdout.width} columns: the rows' next attempt and enqueued times are left out "
            "(a wider terminal, or --json, shows them)"
        )
    stdout.print(rows)


def _payload_text(value: object) -> str:
    """A payload on one line, cut at 200 characters (`--json` carries it whole)."""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= 200 else text[:199] + "…"


@app.command("outbox-report")
def outbox_report_command(
    dsn: DsnOption = None,
    status: Annotated[
        Status | None,
        typer.Option("--status", "--outbox-status", help="Only rows in this status."),
    ] = None,
    limit: LimitOption = 50,
    campaign_id: CampaignOption = None,
    payload: Annotated[
        bool, typer.Option("--payload", help="Show each listed row's event payload.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Counts per status, the oldest claimable row, blocked campaigns, workers, then rows."""
    settings = settings_for(dsn=dsn)
    report = pool_run(
        dsn,
        lambda pool: outbox_report(
            pool,
            status=status.value if status else None,
            limit=limit,
            campaign_id=campaign_id,
            park=settings.park,
            resolved_mode=settings.resolved_mode(),
            payload=payload,
            ordered=settings.ordered,
        ),
    )
    if as_json:
        emit_json("outbox", report)
    else:
        render_report(report, payload=payload)


class FailingStatus(enum.StrEnum):
    failed = "failed"
    dead = "dead"


def render_failures(result: Failures) -> None:
    table = _table(
        "status", "rows", "projector", "error shape", "fingerprint", "event types", "latest",
        title="failures by projector and error",
    )  # fmt: skip
    for g in result.groups:
        table.add_row(
            g.status,
            str(g.rows),
            g.projector or "",
            g.shape or "",
            g.fingerprint,
            ", ".join(g.event_types),
            f"{g.latest_campaign_id} seq {g.latest_seq}, {when(g.last_at)}",
        )
    stdout.print(table)
    if result.scanned >= result.scan:
        stderr.print(
            f"grouped the first {result.scanned:,} failed or dead rows: more exist, and the "
            "counts are of those (--scan reads more)"
        )


@app.command("outbox-failures")
def outbox_failures_command(
    dsn: DsnOption = None,
    status: Annotated[
        FailingStatus | None, typer.Option("--status", help="Only failed, or only dead, rows.")
    ] = None,
    scan: Annotated[
        int,
        typer.Option(
            "--scan", min=1, max=MAX_SCAN, help="Read at most this many failed or dead rows."
        ),
    ] = DEFAULT_SCAN,
    limit: LimitOption = 50,
    as_json: JsonOption = False,
) -> None:
    """Failed and dead rows grouped by projector and error shape (quoted values and numbers
    masked), largest group first; requeue a dead group with `outbox-requeue-dead --error`."""
    result = pool_run(
        dsn,
        lambda pool: failures(
            pool, status=status.value if status else None, scan=scan, limit=limit
        ),
    )
    if as_json:
        emit_json("outbox-failures", result)
    else:
        render_failures(result)
