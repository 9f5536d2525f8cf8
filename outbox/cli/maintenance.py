"""`maintenance`: operator commands; each parses options, calls one operation, renders."""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table

from outbox import db, log
from outbox import migrate as migrations
from outbox.cli.common import (
    DsnOption,
    JsonOption,
    emit_json,
    require_dsn,
    run,
    settings_for,
    stderr,
    stdout,
)
from outbox.cli.common import (
    main as run_main,
)

app = typer.Typer(
    name="maintenance",
    help="Operate the outbox: migrate the schema, inspect and repair the queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    log_level: Annotated[
        str, typer.Option("--log-level", envvar="OUTBOX_LOG_LEVEL", help="debug/info/warning/error")
    ] = "warning",
) -> None:
    """Operator commands. Exit 0 on success, 1 on operational failure, 2 on bad usage."""
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


def main() -> NoReturn:
    run_main(app, "maintenance", help_without_args=True)
