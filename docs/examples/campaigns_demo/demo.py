"""`make demo`: get a database, migrate, append demo events, show what the outbox holds.

The database is OUTBOX_DSN when set; otherwise a local PostgreSQL kept under `.outbox/` (created
on the first run, reused after, stopped by `make clean` or `--stop`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn
from urllib.parse import urlsplit, urlunsplit

import anyio
import typer
from rich.table import Table

from campaigns_demo.app import build_app, install
from campaigns_demo.campaigns import DICE_ROLLED, DemoStream, campaign_ids
from outbox import db
from outbox.append.api import append
from outbox.cli.common import main as run_main
from outbox.cli.common import run, settings_for, stderr, stdout
from outbox.config import Settings
from outbox.model import BatchCounts
from outbox.obs import log
from outbox.projection.app import Outbox
from outbox.queue.inspect import StatusCounts, count_rows
from outbox.redact import redact_dsn
from outbox.schema import migrate
from outbox.testing.localpg import LocalCluster, find_bindir
from outbox.worker.runtime import drain_now, open_pool

LOCAL_DIR = Path(".outbox")

app = typer.Typer(name="demo", add_completion=False, pretty_exceptions_enable=False)


def local_cluster() -> LocalCluster:
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


async def fresh_database(admin_dsn: str, name: str) -> str:
    """Recreate `name` on the server of `admin_dsn` (the local demo cluster, or OUTBOX_DSN's
    server for the idempotency examples), so every run starts empty; returns its DSN."""
    admin = await db.connect(admin_dsn, codecs=False)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return urlunsplit(urlsplit(admin_dsn)._replace(path=f"/{name}"))


@dataclass
class DemoResult:
    appended: int
    append_seconds: float
    drained: BatchCounts
    drain_seconds: float
    queue: StatusCounts
    rolls_projected: int
    rolls_in_journal: int


async def _run(settings: Settings, campaigns: int, events: int, concurrency: int) -> DemoResult:
    assert settings.dsn is not None
    pool = await open_pool(settings, max_size=concurrency + 10)
    try:
        applied = await migrate(pool)
        if applied:
            stderr.print(f"migrated: {', '.join(applied)}")
        await install(pool)
        started = time.perf_counter()
        appended = await _append_all(pool, settings, campaigns, events)
        append_seconds = time.perf_counter() - started
        app = build_app(Outbox(settings))
        started = time.perf_counter()
        drained = await drain_now(app, pool, concurrency=concurrency)
        drain_seconds = time.perf_counter() - started
        projected = await pool.fetchval("SELECT coalesce(sum(rolls), 0) FROM demo_dice_totals")
        # The oracle, from the journal: rolls whose work row is gone (applied).
        journal = await pool.fetchval(
            "SELECT count(*) FROM outbox.event_journal j WHERE j.event_type = $1 AND NOT EXISTS ("
            "SELECT 1 FROM outbox.projection_apply_outbox o "
            "WHERE o.campaign_id = j.campaign_id AND o.seq = j.seq)",
            DICE_ROLLED,
        )
        return DemoResult(
            appended,
            append_seconds,
            drained,
            drain_seconds,
            await count_rows(pool),
            projected,
            journal,
        )
    finally:
        await pool.close()


@app.command()
def demo(
    campaigns: Annotated[int, typer.Option(min=1, max=10_000)] = 40,
    events: Annotated[int, typer.Option(help="Events per campaign.", min=1, max=100_000)] = 100,
    concurrency: Annotated[int, typer.Option(help="Worker claim loops.", min=1, max=64)] = 4,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the local cluster and exit.")] = False,
    remove: Annotated[
        bool, typer.Option("--remove", help="Stop the local cluster, delete it and exit.")
    ] = False,
) -> None:
    """Append demo campaign events, drain them through the apply worker, show the outcome."""
    log.configure(os.environ.get("OUTBOX_LOG_LEVEL", "error"))
    if stop or remove:
        cluster = local_cluster()
        if remove:
            cluster.destroy()
        else:
            cluster.stop()
        where = cluster.directory
        stderr.print(f"local PostgreSQL in {where} {'removed' if remove else 'stopped'}")
        return
    settings = settings_for()
    if not settings.dsn:
        cluster = local_cluster()
        stderr.print(
            f"OUTBOX_DSN unset: using the local PostgreSQL in {cluster.directory} "
            f"(binaries: {find_bindir()})"
        )
        admin_dsn = cluster.start()
        settings = settings.replace(dsn=run(lambda: fresh_database(admin_dsn, "outbox_demo")))

    r = run(lambda: _run(settings, campaigns, events, concurrency))
    stderr.print(
        f"appended {r.appended} events in {r.append_seconds:.2f}s "
        f"({r.appended / r.append_seconds:,.0f}/s)"
    )
    d = r.drained
    stderr.print(
        f"worker drained in {r.drain_seconds:.2f}s: applied={d.applied} skipped={d.skipped} "
        f"failed={d.failed} dead={d.dead} ({d.applied / max(r.drain_seconds, 1e-9):,.0f}/s)"
    )
    table = Table("status", "rows", title="outbox queue")
    for status, n in dataclasses.asdict(r.queue).items():
        table.add_row(status, str(n))
    stdout.print(table)
    verdict = "exactly once" if r.rolls_projected == r.rolls_in_journal else "MISMATCH"
    stdout.print(
        f"dice rolls projected {r.rolls_projected}, applied rolls in the journal "
        f"{r.rolls_in_journal}: {verdict}"
    )
    stdout.print(
        "rows left are cursed dice (a projector that always fails) and the events behind them "
        "in their campaigns; see them with:"
    )
    stdout.print(f"  .venv/bin/maintenance outbox-report --dsn '{redact_dsn(settings.dsn or '')}'")


def main() -> NoReturn:
    run_main(app, "demo")
