"""`maintenance migrate` and `maintenance schema`: the schema's migrations and definitions."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from outbox import db
from outbox import schema as migrations
from outbox.buckets import distribution
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
from outbox.cli.operator import (
    app,
)
from outbox.errors import UsageError


@app.command("migrate")
def migrate_command(
    dsn: DsnOption = None,
    show_status: Annotated[
        bool, typer.Option("--status", help="List applied and pending files; change nothing.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Apply pending migrations, then changed function definitions (idempotent, under an
    advisory lock), in the schema OUTBOX_SCHEMA names (default `outbox`)."""
    settings = settings_for(dsn=dsn)
    target = require_dsn(settings)

    async def body() -> Any:
        conn = await db.connect(target)
        try:
            if show_status:
                return (
                    await migrations.status(conn, schema=settings.schema),
                    await migrations.definition_status(conn, schema=settings.schema),
                )
            return await migrations.migrate(conn, buckets=settings.buckets, schema=settings.schema)
        finally:
            await conn.close()

    result = run(body)
    if show_status:
        files, functions = result
        rows = [
            {"name": s.name, "state": s.state, "checksum": s.checksum, "applied_at": s.applied_at}
            for s in files
        ]
        definitions = [
            {
                "name": d.name,
                "state": d.state,
                "checksum": d.checksum,
                "version": d.version,
                "applied_at": d.applied_at,
            }
            for d in functions
        ]
        if as_json:
            emit_json("migrate-status", {"migrations": rows, "definitions": definitions})
            return
        table = Table("file", "state", "applied at")
        for r in [*rows, *definitions]:
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


@app.command("schema")
def schema_command(
    sql: Annotated[
        bool,
        typer.Option(
            "--sql",
            help="Print the install (migrations, then definitions) as one SQL script for your "
            "own migration tool.",
        ),
    ] = False,
    only_definitions: Annotated[
        bool,
        typer.Option(
            "--definitions",
            help="With --sql: the function definitions alone (an upgrade ends with them).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """The migrations and function definitions this version ships (no database needed)."""
    shipped = migrations.load_migrations()
    functions = migrations.load_definitions()
    settings = settings_for()
    if only_definitions and not sql:
        raise UsageError("--definitions goes with --sql")
    if sql:
        sys.stdout.write(
            migrations.script(
                shipped,
                functions,
                buckets=settings.buckets,
                schema=settings.schema,
                only_definitions=only_definitions,
            )
        )
        return
    if as_json:
        emit_json(
            "schema",
            {
                "migrations": [{"name": m.name, "checksum": m.checksum} for m in shipped],
                "definitions": [
                    {"name": d.name, "checksum": d.checksum, "functions": list(d.functions)}
                    for d in functions
                ],
            },
        )
        return
    table = Table("file", "sha256", title="shipped migrations and definitions")
    for name, checksum in [
        *((m.name, m.checksum) for m in shipped),
        *((d.name, d.checksum) for d in functions),
    ]:
        table.add_row(name, checksum)
    stdout.print(table)


@app.command("distribute")
def distribute_command(
    dsn: DsnOption = None,
    shard_count: Annotated[
        int | None,
        typer.Option(
            "--shard-count",
            min=1,
            help="Shards per table (default: one per bucket; at most the number of buckets).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """On a Citus coordinator: distribute the outbox's tables by bucket, co-located (idempotent)."""
    target = require_dsn(settings_for(dsn=dsn))

    async def body() -> distribution.Distributed:
        conn = await db.connect(target)
        try:
            return await distribution.distribute(conn, shard_count=shard_count)
        finally:
            await conn.close()

    result = run(body)
    if as_json:
        emit_json("distribute", result)
        return
    table = Table("table", "by", "co-located with", "shards", "state")
    for t in result.tables:
        table.add_row(t.table, t.column, t.colocated_with or "-", str(t.shards), t.state)
    stdout.print(table)
    stderr.print(
        f"Citus {result.citus_version}: {result.buckets} buckets over {result.shard_count} shards "
        f"per table, on {result.nodes} node(s)"
    )
