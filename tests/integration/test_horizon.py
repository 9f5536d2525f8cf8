"""A snapshot held elsewhere is named where operators look: the report's summary, the console's
overview and its fragment name the oldest holder, and the worker's gauges carry its age
(docs/operations.md, "A snapshot held elsewhere")."""

from __future__ import annotations

import httpx
import pytest

from helpers import run_cli
from outbox import Event, append, db
from outbox.console import create_app
from outbox.console.overview import read_overview
from outbox.obs.metrics import Metrics
from outbox.ops.report import outbox_report
from outbox.queue.horizon import horizon_holder
from outbox.worker.gauges import refresh_gauges

pytestmark = pytest.mark.asyncio


async def test_the_report_and_the_console_name_the_oldest_snapshot_held(
    pool: db.Pool, dsn: str
) -> None:
    holder = await db.connect(dsn)
    try:
        await holder.execute("SET application_name = 'nightly-dump'")
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM outbox.event_journal")
        pid = await holder.fetchval("SELECT pg_backend_pid()")
        for n in range(3):  # three transactions younger than the held snapshot
            await append(pool, f"h-{n}", [Event("noted", {})])
        summary = (await outbox_report(pool)).summary
        assert summary.snapshot is not None
        assert (summary.snapshot.kind, summary.snapshot.pid, summary.snapshot.name) == (
            "session", pid, "nightly-dump",
        )  # fmt: skip
        assert summary.snapshot.state == "idle in transaction"
        assert summary.snapshot.held_seconds is not None
        assert summary.snapshot.held_seconds >= 0
        assert summary.snapshot.xmin_age >= 3
        metrics = Metrics()
        await refresh_gauges(metrics, pool, park=False)
        sample = metrics.registry.get_sample_value
        assert (sample("outbox_oldest_snapshot_xmin_age") or 0) >= 3
        assert sample("outbox_oldest_snapshot_seconds") is not None
        shown = run_cli("maintenance", "outbox-report", dsn=dsn)
        assert shown.returncode == 0, shown.stderr
        assert (
            f"oldest snapshot: session nightly-dump (pid {pid}), idle in transaction"
            in " ".join(shown.stdout.split())
        )
        overview = await read_overview(pool, park=False, bound=10)
        assert overview.snapshot is not None
        assert overview.snapshot.pid == pid
        console = create_app(pool)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=console), base_url="http://console"
        ) as client:
            page = await client.get("/fragments/overview")
            assert page.status_code == 200
            assert f"nightly-dump (pid {pid}), idle in transaction" in page.text
        await holder.execute("ROLLBACK")
        after = await horizon_holder(pool)
        assert after is None or after.pid != pid  # released: no longer the holder
    finally:
        await holder.close()
