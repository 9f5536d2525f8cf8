"""`maintenance cleanup`: prune what the guards and the registry no longer need."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from outbox import maintenance
from outbox.cli.common import (
    DsnOption,
    JsonOption,
    emit_json,
    stdout,
)
from outbox.cli.operator import (
    app,
    pool_run,
)


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
    removed = pool_run(
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
