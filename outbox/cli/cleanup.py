"""`maintenance cleanup`: prune what the guards and the registry no longer need."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer
from rich.table import Table

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
from outbox.ops.cleanup import CLAIMS_RETENTION_DAYS, cleanup


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
    ] = CLAIMS_RETENTION_DAYS,
    batch_size: Annotated[int, typer.Option(min=1, max=1_000_000, help="Rows per DELETE.")] = 5000,
    as_json: JsonOption = False,
) -> None:
    """Prune old markers, expired append keys, old consumer claims, stale worker rows."""
    result = pool_run(
        dsn,
        lambda pool: cleanup(
            pool,
            markers_retention_hours=markers_retention_hours,
            claims_retention_days=claims_retention_days,
            batch_size=batch_size,
        ),
    )
    if as_json:
        emit_json("cleanup", result)
        return
    table = Table("table", "rows removed", title="cleanup")
    for name, n in dataclasses.asdict(result.removed).items():
        table.add_row(name, str(n))
    stdout.print(table)
