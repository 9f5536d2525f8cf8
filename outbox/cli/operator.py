"""The `maintenance` app: its root options, and the options and runners its commands share."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, TypeVar

import typer

from outbox import db
from outbox.cli.common import (
    CONTEXT_SETTINGS,
    DsnOption,
    Invocation,
    LogFormatOption,
    VersionOption,
    prepare_app,
    require_dsn,
    run,
    settings_for,
)
from outbox.obs import log
from outbox.ops.report import MAX_LIMIT
from outbox.projection.app import Outbox
from outbox.retry import sole_error
from outbox.schema import check_current
from outbox.worker.runtime import open_pool

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
    log_format: LogFormatOption = "json",
    version: VersionOption = False,
) -> None:
    """Operator commands. Exit 0 on success, 1 on operational failure, 2 on bad usage."""
    # `maintenance --dsn X <command>`: a command without its own --dsn takes this one, before
    # OUTBOX_DSN (`settings_for`).
    Invocation.dsn = dsn
    try:
        log.configure(log_level, fmt=log_format)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-level/--log-format") from None


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
QuietOption = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="Only the summary: no row table, no `rows` in the JSON."),
]
ReasonOption = Annotated[
    str | None, typer.Option("--reason", help="Why, for the audit.", show_default=False)
]
ProjectorOption = Annotated[
    str | None,
    typer.Option(
        "--projector",
        help="Only this projector's failures (its holds); without it, all of a row's.",
        show_default=False,
    ),
]


def pool_run(dsn: str | None, body: Callable[[db.Pool], Awaitable[T]]) -> T:
    """Open a small pool (after all options are validated), run `body`, close the pool."""
    target = require_dsn(settings_for(dsn=dsn))

    async def runner() -> T:
        pool = await db.create_pool(target, min_size=1, max_size=2)
        try:
            return await body(pool)
        except Exception as exc:
            # A table or function missing: say why as every command does (health, the worker:
            # "not migrated ... run maintenance migrate"), not as the driver's error.
            if db.missing_object(sole_error(exc)):
                await check_current(pool)
            raise
        finally:
            await pool.close()

    return run(runner)


def age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.1f}s"


def when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


def app_run(
    app_path: str | None,
    dsn: str | None,
    body: Callable[[Outbox, db.Pool], Awaitable[T]],
    *,
    connections: int = 2,
) -> T:
    """Load and validate the app (usage errors before any connection), then run `body` with a
    pool of at most `connections`."""
    outbox_app = prepare_app(app_path, dsn=dsn)

    async def runner() -> T:
        pool = await open_pool(outbox_app.settings, max_size=connections)
        try:
            await check_current(pool)
            return await body(outbox_app, pool)
        finally:
            await pool.close()

    return run(runner)
