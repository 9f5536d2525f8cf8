"""Repairs: requeue or discard dead rows, retry failed rows now, replay one row, reconcile the
journal, and the audit of operators' actions (rebuilds: `outbox.cli.rebuild`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from outbox import db
from outbox.cli.common import (
    AppOption,
    DsnOption,
    JsonOption,
    emit_json,
    stderr,
    stdout,
)
from outbox.cli.operator import (
    CampaignOption,
    LimitOption,
    ProjectorOption,
    QuietOption,
    ReasonOption,
    app,
    app_run,
    pool_run,
    when,
)
from outbox.errors import OutboxError, UsageError
from outbox.ops.discard import check_reason, discard_one
from outbox.ops.reconcile import reconcile
from outbox.ops.replay import replay
from outbox.ops.report import MAX_LIMIT, audit
from outbox.ops.requeue import (
    RequeueResult,
    requeue_dead,
    requeue_one,
    retry_failed,
    retry_one,
)
from outbox.queue.repair import DeadRow


@app.command("outbox-requeue")
def outbox_requeue_command(
    campaign_id: Annotated[
        str,
        typer.Option("--campaign-id", "--outbox-requeue-campaign-id", help="The row's campaign."),
    ],
    seq: Annotated[
        int, typer.Option("--seq", "--outbox-requeue-seq", min=1, help="The row's seq.")
    ],
    dsn: DsnOption = None,
    reason: ReasonOption = None,
    projector: ProjectorOption = None,
    as_json: JsonOption = False,
) -> None:
    """One dead row back to pending, due now, with a fresh attempt budget (audited)."""
    result = pool_run(
        dsn,
        lambda pool: requeue_one(pool, campaign_id, seq, reason=reason, projector=projector),
    )
    if as_json:
        emit_json("outbox-requeue", result)
    else:
        stdout.print(f"requeued {campaign_id} seq {seq}")


@app.command("outbox-requeue-dead")
def outbox_requeue_dead_command(
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            "--outbox-requeue-dead-limit",
            min=1,
            max=MAX_LIMIT,
            help=f"At most this many rows, oldest first (required unless --dry-run, which "
            f"previews up to {MAX_LIMIT:,}).",
            show_default=False,
        ),
    ] = None,
    dsn: DsnOption = None,
    campaign_id: CampaignOption = None,
    event_type: Annotated[
        str | None, typer.Option("--event-type", help="Only this event type.", show_default=False)
    ] = None,
    fingerprint: Annotated[
        str | None,
        typer.Option(
            "--error",
            help="Only this error group (a fingerprint from outbox-failures).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show, change nothing.")] = False,
    reason: ReasonOption = None,
    projector: ProjectorOption = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Dead rows back to pending in a bounded batch, oldest first by next_attempt_at, seq."""
    if limit is None and not dry_run:
        raise UsageError("--limit is required to requeue (a --dry-run previews without it)")
    bound = limit or MAX_LIMIT

    async def body(pool: db.Pool) -> RequeueResult:
        with Progress(console=stderr, transient=True, disable=bound <= 1000) as bar:
            task = bar.add_task("requeueing", total=bound)
            return await requeue_dead(
                pool,
                limit=bound,
                campaign_id=campaign_id,
                event_type=event_type,
                fingerprint=fingerprint,
                dry_run=dry_run,
                reason=reason,
                projector=projector,
                progress=lambda n: bar.advance(task, n),
            )

    result = pool_run(dsn, body)
    _render_batch(
        "outbox-requeue-dead", result, result.rows, bound=bound, dry_run=dry_run, quiet=quiet,
        as_json=as_json, verb="requeue", done="requeued",
    )  # fmt: skip


def _render_batch(
    mode: str,
    result: object,
    rows: list[DeadRow],
    *,
    bound: int,
    dry_run: bool,
    quiet: bool,
    as_json: bool,
    verb: str,
    done: str,
    note: str = "",
) -> None:
    """A batch repair's answer: a dry run's line, then the JSON or the rows' table (none
    with --quiet), then how many rows were `done`."""
    if dry_run:
        more = f" (the oldest {bound:,}: more may match)" if len(rows) == bound else ""
        stderr.print(f"dry run: {len(rows)} row(s) would be {done}{more}, none was")
    if as_json:
        emit_json(mode, result, omit=("rows",) if quiet else ())
        return
    if not quiet:
        stdout.print(_rows_table(rows, f"would {verb}" if dry_run else done))
    if not dry_run:
        stderr.print(f"{done} {len(rows)} row(s){note}")


def _rows_table(rows: list[DeadRow], title: str) -> Table:
    table = Table("campaign", "seq", "event type", "attempts", "last error", title=title)
    for r in rows:
        table.add_row(
            r.campaign_id, str(r.seq), r.event_type, str(r.attempt_count), (r.last_error or "")[:80]
        )
    return table


@app.command("outbox-retry")
def outbox_retry_command(
    dsn: DsnOption = None,
    campaign_id: CampaignOption = None,
    seq: Annotated[
        int | None,
        typer.Option("--seq", min=1, help="With --campaign-id: that one row.", show_default=False),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=1,
            max=MAX_LIMIT,
            help="A batch: at most this many failed rows, oldest first (required unless "
            "--seq or --dry-run).",
            show_default=False,
        ),
    ] = None,
    event_type: Annotated[
        str | None, typer.Option("--event-type", help="Only this event type.", show_default=False)
    ] = None,
    fingerprint: Annotated[
        str | None,
        typer.Option(
            "--error",
            help="Only this error group (a fingerprint from outbox-failures).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show, change nothing.")] = False,
    reason: ReasonOption = None,
    projector: Annotated[
        str | None,
        typer.Option(
            "--projector",
            help="Only the rows this projector is failing on, and only its holds.",
            show_default=False,
        ),
    ] = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Failed rows due now, their attempts kept (audited): after a fix, rather than wait out
    the backoff. One row (--campaign-id and --seq) or a bounded batch (--limit)."""
    if seq is not None:
        if campaign_id is None:
            raise UsageError("--seq names a row with --campaign-id")
        if limit is not None or event_type or fingerprint or dry_run:
            raise UsageError(
                "--seq retries one row: --limit, --event-type, --error and --dry-run are a batch's"
            )
        one = pool_run(
            dsn,
            lambda pool: retry_one(pool, campaign_id, seq, reason=reason, projector=projector),
        )
        if as_json:
            emit_json("outbox-retry", one)
        else:
            stdout.print(f"retried {campaign_id} seq {seq}: due now")
        return
    if limit is None and not dry_run:
        raise UsageError("--limit is required to retry a batch (or name one row with --seq)")
    bound = limit or MAX_LIMIT
    result = pool_run(
        dsn,
        lambda pool: retry_failed(
            pool,
            limit=bound,
            campaign_id=campaign_id,
            event_type=event_type,
            fingerprint=fingerprint,
            dry_run=dry_run,
            reason=reason,
            projector=projector,
        ),
    )
    _render_batch(
        "outbox-retry", result, result.rows, bound=bound, dry_run=dry_run, quiet=quiet,
        as_json=as_json, verb="retry", done="retried", note=": due now",
    )  # fmt: skip


@app.command("outbox-discard")
def outbox_discard_command(
    campaign_id: Annotated[str, typer.Option("--campaign-id", help="The row's campaign.")],
    seq: Annotated[int, typer.Option("--seq", min=1, help="The row's seq.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why it will not be projected, for the audit.")
    ],
    app_path: AppOption = None,
    dsn: DsnOption = None,
    projector: ProjectorOption = None,
    as_json: JsonOption = False,
) -> None:
    """Discard one dead row (audited; its event stays in the journal): for one projector (its
    hold goes, an ordered one's checkpoint moves past the event; the others keep what they
    applied), or for the row's every holder; a row with no holder goes whole, and the ordered
    projectors' checkpoints move past it so the campaign's later rows apply."""
    check_reason(reason)  # before any connection
    result = app_run(
        app_path,
        dsn,
        lambda a, pool: discard_one(
            pool, a.registry, campaign_id, seq, reason=reason, projector=projector
        ),
    )
    if as_json:
        emit_json("outbox-discard", result)
        return
    moved = ", ".join(result.checkpoints_moved) or "none"
    stdout.print(f"discarded {campaign_id} seq {seq} ({result.event_type})")
    stdout.print(f"checkpoints moved past it: {moved}")


@app.command("audit")
def audit_command(
    dsn: DsnOption = None,
    campaign_id: CampaignOption = None,
    limit: LimitOption = 50,
    as_json: JsonOption = False,
) -> None:
    """Operators' actions on work rows (requeues, discards), newest first: who, when, why, and
    what each row was before."""

    result = pool_run(dsn, lambda pool: audit(pool, campaign_id=campaign_id, limit=limit))
    if as_json:
        emit_json("audit", result)
        return
    table = Table(
        "at",
        "action",
        "campaign",
        "seq",
        "actor",
        "reason",
        "was",
        "attempts",
        "last error",
        title=f"audit (newest {limit})",
    )
    for e in result.entries:
        table.add_row(
            when(e.at),
            e.action,
            e.campaign_id,
            str(e.seq),
            e.actor,
            e.reason or "",
            e.previous_status,
            str(e.previous_attempt_count),
            (e.previous_last_error or "")[:80],
        )
    stdout.print(table)


@app.command("outbox-replay")
def outbox_replay_command(
    campaign_id: Annotated[str, typer.Option("--campaign-id", help="The row's campaign.")],
    seq: Annotated[int, typer.Option("--seq", min=1, help="The row's seq.")],
    app_path: AppOption = None,
    dsn: DsnOption = None,
    as_json: JsonOption = False,
) -> None:
    """Apply one queued row now, in the foreground, and report the outcome."""
    result = app_run(app_path, dsn, lambda a, pool: replay(a, pool, campaign_id, seq))
    if as_json:
        failed = result.outcome == "failed"
        emit_json("outbox-replay", result, omit=() if failed else ("status", "attempt_count"))
    else:
        stdout.print(f"{campaign_id} seq {seq}: {result.outcome}")
    if result.outcome == "failed":
        raise OutboxError(f"replay failed ({result.status}): {result.error}")


@app.command("reconcile")
def reconcile_command(
    app_path: AppOption = None,
    dsn: DsnOption = None,
    campaign_id: CampaignOption = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1_000_000, help="At most this many rows.")
    ] = 1000,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show, enqueue nothing.")] = False,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Enqueue journal events that have no work row and are not applied yet."""
    result = app_run(
        app_path,
        dsn,
        lambda a, pool: reconcile(
            pool, a.registry, campaign_id=campaign_id, limit=limit, dry_run=dry_run
        ),
    )
    if as_json:
        emit_json("reconcile", result, omit=("rows",) if quiet else ())
        return
    if not quiet:
        title = "would enqueue" if dry_run else "enqueued"
        table = Table("campaign", "seq", "event type", title=title)
        for r in result.rows:
            table.add_row(r.campaign_id, str(r.seq), r.event_type)
        stdout.print(table)
    stderr.print(f"{'would enqueue' if dry_run else 'enqueued'} {result.matched} row(s)")
