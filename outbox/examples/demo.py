"""`make demo`: get a database, migrate, append demo events, show what the outbox holds.

The database is OUTBOX_DSN when set; otherwise a local PostgreSQL kept under `.outbox/` (created
on the first run, reused after, stopped by `make clean` or `--stop`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, NoReturn

import anyio
import typer
from rich.table import Table

from outbox import db, log
from outbox.cli.common import main as run_main
from outbox.cli.common import run, settings_for, stderr, stdout
from outbox.config import Settings
from outbox.examples.campaigns import DemoStream, campaign_ids
from outbox.journal import append
from outbox.localpg import LocalCluster
from outbox.migrate import migrate

LOCAL_DIR = Path(".outbox")

app = typer.Typer(name="demo", add_completion=False, pretty_exceptions_enable=False)


def _local_cluster() -> LocalCluster:
    return LocalCluster(LOCAL_DIR.resolve(), durable=True)


async def _append_all(pool: db.Pool, settings: Settings, campaigns: int, events: int) -> int:
    stream = DemoStream(cursed_every=400)
    appended = 0

    async def one(campaign_id: str) -> None:
        nonlocal appended
        for batch in stream.batches(campaign_id, events):
            result = await append(pool, campaign_id, batch, settings=settings)
            appended += len(result.seqs)

    async with anyio.create_task_group() as tg:
        for campaign_id in campaign_ids(campaigns):
            tg.start_soon(one, campaign_id)
    return appended


async def _queue_counts(pool: db.Pool) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT status, count(*) AS n FROM projection_apply_outbox GROUP BY status"
    )
    counts = {"pending": 0, "processing": 0, "failed": 0, "dead": 0}
    counts.update({r["status"]: r["n"] for r in rows})
    return counts


@app.command()
def demo(
    campaigns: Annotated[int, typer.Option(min=1, max=10_000)] = 40,
    events: Annotated[int, typer.Option(help="Events per campaign.", min=1, max=100_000)] = 100,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the local cluster and exit.")] = False,
) -> None:
    """Append demo campaign events through the outbox and show the queue."""
    log.configure(os.environ.get("OUTBOX_LOG_LEVEL", "warning"))
    if stop:
        _local_cluster().stop()
        stderr.print("local PostgreSQL under .outbox/ stopped")
        return
    settings = settings_for()
    if not settings.dsn:
        cluster = _local_cluster()
        stderr.print(f"OUTBOX_DSN unset: using the local PostgreSQL under {LOCAL_DIR}/")
        settings = settings.replace(dsn=cluster.start())

    async def body() -> tuple[int, float, dict[str, int]]:
        pool = await db.create_pool(settings.dsn, min_size=2, max_size=20)
        try:
            applied = await migrate(pool)
            if applied:
                stderr.print(f"migrated: {', '.join(applied)}")
            started = time.perf_counter()
            appended = await _append_all(pool, settings, campaigns, events)
            return appended, time.perf_counter() - started, await _queue_counts(pool)
        finally:
            await pool.close()

    appended, seconds, queue = run(body)
    stderr.print(f"appended {appended} events in {seconds:.2f}s ({appended / seconds:,.0f}/s)")
    table = Table("status", "rows", title="outbox queue")
    for status, n in queue.items():
        table.add_row(status, str(n))
    stdout.print(table)


def main() -> NoReturn:
    run_main(app, "demo")
