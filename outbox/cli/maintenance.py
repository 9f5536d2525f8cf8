"""`maintenance`: operator commands; each parses options, calls one operation, renders."""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.progress import Progress
from rich.table import Table

from outbox import db, log, maintenance
from outbox import migrate as migrations
from outbox.cli.common import (
    CONTEXT_SETTINGS,
    AppOption,
    DsnOption,
    JsonOption,
    UsageError,
    VersionOption,
    emit_json,
    prepare_app,
    require_dsn,
    run,
    settings_for,
    stderr,
    stdout,
)
from outbox.cli.common import (
    main as run_main,
)
from outbox.errors import ConfigError, OutboxError
from outbox.maintenance import MAX_LIMIT
from outbox.migrate import check_current
from outbox.projectors import Outbox
from outbox.rebuild import campaigns_to_rebuild, rebuild_campaign, rebuildable
from outbox.reconcile import reconcile
from outbox.replay import replay
from outbox.service import open_pool
from outbox.worker import Worker

T = TypeVar("T")

app = typer.Typer(
    name="maintenance",
    help="Operate the outbox: migrate the schema, inspect and repair the queue.",
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    dsn: DsnOption = None,
    log_level: Annotated[
        str, typer.Option("--log-level", envvar="OUTBOX_LOG_LEVEL", help="debug/info/warning/error")
    ] = "warning",
    version: VersionOption = False,
) -> None:
    """Operator commands. Exit 0 on success, 1 on operational failure, 2 on bad usage."""
    if dsn:
        # `maintenance --dsn X <command>`: the command parses after this callback, and its own
        # --dsn option falls back to OUTBOX_DSN, so the global value reaches every command.
        os.environ["OUTBOX_DSN"] = dsn
    try:
        log.configure(log_level)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-level") from None


@app.command("migrate")
def migrate_command(
    dsn: DsnOption = None,
    show_status: Annotated[
        bool, typer.Option("--status", help="List applied and pending files; change nothing.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Apply pending schema migrations in order (idempotent, under an advisory lock)."""
    target = require_dsn(settings_for(dsn=dsn))

    async def body() -> Any:
        conn = await db.connect(target)
        try:
            if show_status:
                return await migrations.status(conn)
            return await migrations.migrate(conn)
        finally:
            await conn.close()

    result = run(body)
    if show_status:
        rows = [
            {
                "name": s.name,
                "state": s.state,
                "checksum": s.checksum,
                "applied_at": s.applied_at,
            }
            for s in result
        ]
        if as_json:
            emit_json("migrate-status", {"migrations": rows})
            return
        table = Table("migration", "state", "applied at")
        for r in rows:
            applied_at = r["applied_at"].isoformat(timespec="seconds") if r["applied_at"] else "-"
            table.add_row(r["name"], r["state"], applied_at)
        stdout.print(table)
        return
    if as_json:
        emit_json("migrate", {"applied": result})
        return
    for name in result:
        typer.echo(f"applied {name}")
    stderr.print(f"schema current ({len(result)} migration(s) applied now)")


class Status(enum.StrEnum):
    pending = "pending"
    processing = "processing"
    failed = "failed"
    dead = "dead"


LimitOption = Annotated[
    int,
    typer.Option("--limit", "--outbox-limit", min=1, max=MAX_LIMIT, help="Rows to list."),
]
CampaignOption = Annotated[
    str | None, typer.Option("--campaign-id", help="Only this campaign.", show_default=False)
]
ReasonOption = Annotated[
    str | None, typer.Option("--reason", help="Why, for the audit.", show_default=False)
]


def _pool_run(dsn: str | None, body: Callable[[db.Pool], Awaitable[T]]) -> T:
    """Open a small pool (after all options are validated), run `body`, close the pool."""
    target = require_dsn(settings_for(dsn=dsn))

    async def runner() -> T:
        pool = await db.create_pool(target, min_size=1, max_size=2)
        try:
            return await body(pool)
        finally:
            await pool.close()

    return run(runner)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.1f}s"


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


def _render_report(report: dict[str, Any]) -> None:
    summary = report["summary"]
    counts = Table("status", "rows", title="outbox queue")
    for status, n in summary["counts"].items():
        counts.add_row(status, str(n))
    counts.add_row("total", str(summary["total"]))
    stdout.print(counts)
    oldest = summary["oldest_claimable"]
    if oldest:
        stdout.print(
            f"oldest claimable: {oldest['campaign_id']} seq {oldest['seq']}, "
            f"enqueued {_when(oldest['enqueued_at'])}, age {_age(oldest['age_seconds'])}"
        )
    stdout.print(f"earliest next attempt: {_when(summary['earliest_next_attempt_at'])}")
    if summary["blocked_campaigns"]:
        blocked = Table(
            "campaign", "blocking seq", "status", "waiting", "age", title="blocked campaigns"
        )
        for b in summary["blocked_campaigns"]:
            blocked.add_row(
                b["campaign_id"],
                str(b["blocking_seq"]),
                b["status"],
                str(b["waiting"]),
                _age(b["age_seconds"]),
            )
        stdout.print(blocked)
    if summary["parked_rows"]:
        parked = Table("campaign", "seq", "event type", "last error", title="parked rows")
        for r in summary["parked_rows"]:
            parked.add_row(r["campaign_id"], str(r["seq"]), r["event_type"], r["last_error"] or "")
        stdout.print(parked)
    if summary["leases"]:
        leases = Table(
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
        for r in summary["leases"]:
            leases.add_row(
                r["campaign_id"],
                str(r["seq"]),
                r["event_type"],
                r["lease_owner"],
                str(r["claim_epoch"]),
                str(r["attempt_count"]),
                _age(r["lease_age_seconds"]),
                _age(r["expires_in_seconds"]) if r["expires_in_seconds"] >= 0 else "expired",
            )
        stdout.print(leases)
    workers = Table("worker", "mode", "loops", "heartbeat age", title="live workers")
    for w in summary["workers"]:
        workers.add_row(
            w["worker_id"], w["mode"], str(w["concurrency"]), _age(w["heartbeat_age_seconds"])
        )
    stdout.print(workers)
    rows = Table(
        "campaign",
        "seq",
        "event type",
        "status",
        "attempts",
        "next attempt",
        "enqueued",
        "last error",
        title=f"rows (limit {report['limit']})",
    )
    for r in report["rows"]:
        rows.add_row(
            r["campaign_id"],
            str(r["seq"]),
            r["event_type"],
            r["status"],
            str(r["attempt_count"]),
            _when(r["next_attempt_at"]),
            _when(r["enqueued_at"]),
            (r["last_error"] or "")[:80],
        )
    stdout.print(rows)


@app.command("schema")
def schema_command(
    sql: Annotated[
        bool,
        typer.Option(
            "--sql", help="Print the migrations as one SQL script for your own migration tool."
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """The schema migrations this version ships (no database needed)."""
    shipped = migrations.load_migrations()
    if sql:
        sys.stdout.write(migrations.script(shipped))
        return
    if as_json:
        emit_json(
            "schema", {"migrations": [{"name": m.name, "checksum": m.checksum} for m in shipped]}
        )
        return
    table = Table("migration", "sha256", title="shipped migrations")
    for m in shipped:
        table.add_row(m.name, m.checksum)
    stdout.print(table)


@app.command("outbox-report")
def outbox_report_command(
    dsn: DsnOption = None,
    status: Annotated[
        Status | None,
        typer.Option("--status", "--outbox-status", help="Only rows in this status."),
    ] = None,
    limit: LimitOption = 50,
    campaign_id: CampaignOption = None,
    as_json: JsonOption = False,
) -> None:
    """Counts per status, the oldest claimable row, blocked campaigns, workers, then rows."""
    settings = settings_for(dsn=dsn)
    report = _pool_run(
        dsn,
        lambda pool: maintenance.outbox_report(
            pool,
            status=status.value if status else None,
            limit=limit,
            campaign_id=campaign_id,
            park=settings.dead_policy == "park",
        ),
    )
    report["summary"]["resolved_mode"] = settings.resolved_mode()
    if as_json:
        emit_json("outbox", report)
    else:
        _render_report(report)


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
    as_json: JsonOption = False,
) -> None:
    """One dead row back to pending, due now, with a fresh attempt budget (audited)."""
    result = _pool_run(
        dsn, lambda pool: maintenance.requeue_one(pool, campaign_id, seq, reason=reason)
    )
    if as_json:
        emit_json("outbox-requeue", result)
    else:
        stdout.print(f"requeued {campaign_id} seq {seq}")


@app.command("outbox-requeue-dead")
def outbox_requeue_dead_command(
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            "--outbox-requeue-dead-limit",
            min=1,
            max=MAX_LIMIT,
            help="At most this many rows, oldest first.",
        ),
    ],
    dsn: DsnOption = None,
    campaign_id: CampaignOption = None,
    event_type: Annotated[
        str | None, typer.Option("--event-type", help="Only this event type.", show_default=False)
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show, change nothing.")] = False,
    reason: ReasonOption = None,
    as_json: JsonOption = False,
) -> None:
    """Dead rows back to pending in a bounded batch, oldest first by next_attempt_at, seq."""

    async def body(pool: db.Pool) -> list[dict[str, Any]]:
        with Progress(console=stderr, transient=True, disable=limit <= 1000) as bar:
            task = bar.add_task("requeueing", total=limit)
            return await maintenance.requeue_dead(
                pool,
                limit=limit,
                campaign_id=campaign_id,
                event_type=event_type,
                dry_run=dry_run,
                reason=reason,
                progress=lambda n: bar.advance(task, n),
            )

    rows = _pool_run(dsn, body)
    requeued = 0 if dry_run else len(rows)
    if dry_run:
        stderr.print(f"dry run: {len(rows)} row(s) would be requeued, none was")
    if as_json:
        emit_json(
            "outbox-requeue-dead",
            {"limit": limit, "requeued": requeued, "rows": rows},
        )
        return
    table = Table(
        "campaign",
        "seq",
        "event type",
        "attempts",
        "last error",
        title="would requeue" if dry_run else "requeued",
    )
    for r in rows:
        table.add_row(
            r["campaign_id"],
            str(r["seq"]),
            r["event_type"],
            str(r["attempt_count"]),
            (r["last_error"] or "")[:80],
        )
    stdout.print(table)
    if not dry_run:
        stderr.print(f"requeued {len(rows)} row(s)")


def _app_run(
    app_path: str | None, dsn: str | None, body: Callable[[Outbox, db.Pool], Awaitable[T]]
) -> T:
    """Load and validate the app (usage errors before any connection), then run `body`."""
    outbox_app = prepare_app(app_path, dsn=dsn)

    async def runner() -> T:
        pool = await open_pool(outbox_app.settings, max_size=2)
        try:
            await check_current(pool)
            return await body(outbox_app, pool)
        finally:
            await pool.close()

    return run(runner)


@app.command("outbox-replay")
def outbox_replay_command(
    campaign_id: Annotated[str, typer.Option("--campaign-id", help="The row's campaign.")],
    seq: Annotated[int, typer.Option("--seq", min=1, help="The row's seq.")],
    app_path: AppOption = None,
    dsn: DsnOption = None,
    as_json: JsonOption = False,
) -> None:
    """Apply one queued row now, in the foreground, and report the outcome."""
    result = _app_run(app_path, dsn, lambda a, pool: replay(Worker(a, pool), campaign_id, seq))
    if as_json:
        emit_json("outbox-replay", result)
    else:
        stdout.print(f"{campaign_id} seq {seq}: {result['outcome']}")
    if result["outcome"] == "failed":
        raise OutboxError(f"replay failed ({result['status']}): {result['error']}")


@app.command("projections-rebuild")
def projections_rebuild_command(
    app_path: AppOption = None,
    dsn: DsnOption = None,
    projector: Annotated[
        list[str] | None,
        typer.Option(
            "--projector", help="Rebuild this projector (repeatable; default: all with reset=)."
        ),
    ] = None,
    campaign_id: CampaignOption = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Do it (without: say what would happen).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Reset projections and re-apply them from the journal in seq order (the final repair)."""

    async def body(outbox_app: Outbox, pool: db.Pool) -> dict[str, Any]:
        registry = outbox_app.registry
        # By default every projector that has a projection to rebuild (a reset hook).
        names = projector or sorted(n for n, p in registry.projectors.items() if p.reset)
        if not names:
            raise UsageError("no projector has a reset hook: nothing can be rebuilt")
        try:
            chosen = [rebuildable(registry, n) for n in names]
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        campaigns = await campaigns_to_rebuild(pool, campaign_id)
        applied = dict.fromkeys(names, 0)
        if yes:
            with Progress(console=stderr, transient=True) as bar:
                task = bar.add_task("rebuilding", total=len(campaigns) * len(chosen))
                for p in chosen:
                    for c in campaigns:
                        applied[p.name] += await rebuild_campaign(pool, p, c)
                        bar.advance(task)
        return {
            "projectors": names,
            "campaigns": len(campaigns),
            "rebuilt": yes,
            "applied": applied,
        }

    result = _app_run(app_path, dsn, body)
    if as_json:
        emit_json("projections-rebuild", result)
    elif result["rebuilt"]:
        for name, n in result["applied"].items():
            stdout.print(f"{name}: {n} event(s) re-applied over {result['campaigns']} campaign(s)")
    else:
        stderr.print(
            f"would rebuild {', '.join(result['projectors'])} over {result['campaigns']} "
            "campaign(s); pass --yes to do it"
        )


@app.command("reconcile")
def reconcile_command(
    app_path: AppOption = None,
    dsn: DsnOption = None,
    campaign_id: CampaignOption = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1_000_000, help="At most this many rows.")
    ] = 1000,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show, enqueue nothing.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Enqueue journal events that have no work row and are not applied yet."""
    rows = _app_run(
        app_path,
        dsn,
        lambda a, pool: reconcile(
            pool, a.registry, campaign_id=campaign_id, limit=limit, dry_run=dry_run
        ),
    )
    enqueued = 0 if dry_run else len(rows)
    if as_json:
        emit_json(
            "reconcile", {"limit": limit, "dry_run": dry_run, "enqueued": enqueued, "rows": rows}
        )
        return
    table = Table("campaign", "seq", "event type", title="would enqueue" if dry_run else "enqueued")
    for r in rows:
        table.add_row(r["campaign_id"], str(r["seq"]), r["event_type"])
    stdout.print(table)
    stderr.print(f"{'would enqueue' if dry_run else 'enqueued'} {len(rows)} row(s)")


@app.command("cleanup")
def cleanup_command(
    dsn: DsnOption = None,
    markers_retention_hours: Annotated[
        int, typer.Option(min=1, max=24 * 3660, help="Keep processed markers this long.")
    ] = 168,
    claims_retention_days: Annotated[
        int,
        typer.Option(
            min=1,
            max=3660,
            help="Keep consumer dedup claims this many days past the end of their event's week.",
        ),
    ] = maintenance.CLAIMS_RETENTION_DAYS,
    batch_size: Annotated[int, typer.Option(min=1, max=1_000_000, help="Rows per DELETE.")] = 5000,
    as_json: JsonOption = False,
) -> None:
    """Prune old markers, expired append keys, old consumer claims, stale worker rows."""
    removed = _pool_run(
        dsn,
        lambda pool: maintenance.cleanup(
            pool,
            markers_retention_hours=markers_retention_hours,
            claims_retention_days=claims_retention_days,
            batch_size=batch_size,
        ),
    )
    if as_json:
        emit_json("cleanup", {"removed": removed})
        return
    table = Table("table", "rows removed", title="cleanup")
    for name, n in removed.items():
        table.add_row(name, str(n))
    stdout.print(table)


@app.command("health")
def health_command(
    dsn: DsnOption = None,
    max_oldest_age: Annotated[
        float | None,
        typer.Option(min=0, help="Unhealthy when the oldest claimable row is older (seconds)."),
    ] = None,
    max_dead: Annotated[
        int, typer.Option(min=0, help="Unhealthy when more rows than this are dead.")
    ] = 0,
    max_blocked: Annotated[
        int,
        typer.Option(min=0, help="Unhealthy when more campaigns than this are blocked."),
    ] = 0,
    as_json: JsonOption = False,
) -> None:
    """Exit 0 when the database answers, migrations are current, no more rows are dead and no
    more campaigns blocked than allowed, and the backlog is young; else exit 1 with reasons."""
    settings = settings_for(dsn=dsn)
    result = _pool_run(
        dsn,
        lambda pool: maintenance.health(
            pool,
            max_oldest_age=max_oldest_age,
            max_dead=max_dead,
            max_blocked=max_blocked,
            park=settings.dead_policy == "park",
        ),
    )
    if as_json:
        emit_json("health", result)
    elif result["healthy"]:
        stdout.print("healthy")
    if not result["healthy"]:
        raise OutboxError("unhealthy: " + "; ".join(result["reasons"]))


def main(argv: list[str] | None = None, prog: str = "maintenance") -> NoReturn:
    run_main(app, prog, argv, help_without_args=True)
