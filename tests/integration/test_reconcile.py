"""Enqueue-gap repair: `maintenance reconcile` against a real PostgreSQL (issue 4, part 4)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from campaigns_demo import campaigns as c
from campaigns_demo.app import build_app, install
from campaigns_demo.campaigns import DemoStream

from helpers import queue_count, run_cli
from outbox import Event, Outbox, Settings, append, db
from outbox.model import StoredEvent
from outbox.ops.reconcile import reconcile
from outbox.projection.dispatch import apply_event
from outbox.worker.batch import Worker

APP = "campaigns_demo.app:app"


def reconcile_cli(dsn: str, *args: str) -> Any:
    proc = run_cli("maintenance", "reconcile", "--app", APP, "--json", *args, dsn=dsn)
    assert proc.returncode == 0, proc.stderr
    return orjson.loads(proc.stdout)


async def append_without_enqueue(pool: db.Pool, dsn: str, campaigns: int = 3) -> None:
    off = Settings(dsn=dsn, enabled=False)
    stream = DemoStream()  # no cursed dice: every event can be applied
    for i in range(campaigns):
        for batch in stream.batches(f"off-{i}", 40):
            await append(pool, f"off-{i}", batch, settings=off)


async def oracle_holds(pool: db.Pool) -> bool:
    rolls = await pool.fetchval(
        "SELECT count(*) FROM outbox.event_journal WHERE event_type = $1", c.DICE_ROLLED
    )
    projected = await pool.fetchval("SELECT coalesce(sum(rolls), 0) FROM demo_dice_totals")
    counts = await pool.fetch(
        "SELECT campaign_id, event_type, count(*) AS n FROM outbox.event_journal GROUP BY 1, 2 "
        "EXCEPT SELECT campaign_id, event_type, events FROM demo_event_counts"
    )
    return bool(rolls == projected and not counts)


async def test_reconcile_after_enqueue_off_applies_each_event_exactly_once(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    await append_without_enqueue(pool, dsn)
    journal = await pool.fetchval("SELECT count(*) FROM outbox.event_journal")
    assert await queue_count(pool) == 0
    dry = reconcile_cli(dsn, "--dry-run")
    assert (dry["mode"], dry["dry_run"], dry["enqueued"], len(dry["rows"])) == (
        "reconcile",
        True,
        0,
        journal,
    )
    assert await queue_count(pool) == 0
    done = reconcile_cli(dsn)
    assert done["enqueued"] == journal
    # Rows exist now: a second reconcile enqueues nothing, before and after the drain.
    assert reconcile_cli(dsn)["enqueued"] == 0
    counts = await Worker(build_app(Outbox(settings)), pool).drain()
    assert (counts.applied, counts.failed) == (journal, 0)
    assert await oracle_holds(pool)
    assert reconcile_cli(dsn)["enqueued"] == 0


async def test_reconcile_skips_what_projectors_already_applied(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    await append_without_enqueue(pool, dsn, campaigns=1)
    app = build_app(Outbox(settings))
    events = await pool.fetch(
        "SELECT seq, event_type, payload FROM outbox.event_journal WHERE campaign_id = 'off-0' "
        "ORDER BY seq LIMIT 25"
    )
    async with pool.acquire() as conn:  # applied already (say, inline) but never enqueued
        for e in events:
            async with conn.transaction():
                await apply_event(
                    conn,
                    app.registry,
                    StoredEvent(
                        "off-0", e["seq"], e["event_type"], e["payload"], {}, datetime.now(UTC)
                    ),
                )
    result = await reconcile(pool, app.registry, limit=10_000)
    assert [r.seq for r in result.rows] == list(range(26, 41))
    await Worker(app, pool).drain()
    assert await oracle_holds(pool)


async def test_reconcile_restores_rows_deleted_by_hand_with_filters_and_limit(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    for campaign in ("a", "b"):
        await append(pool, campaign, [Event(c.DICE_ROLLED, {"value": 2})] * 3, settings=settings)
    await pool.execute("DELETE FROM outbox.projection_apply_outbox")
    assert reconcile_cli(dsn, "--campaign-id", "x' OR '1'='1")["rows"] == []
    one = reconcile_cli(dsn, "--campaign-id", "b", "--limit", "2")
    assert [(r["campaign_id"], r["seq"]) for r in one["rows"]] == [("b", 1), ("b", 2)]
    rest = reconcile_cli(dsn)
    assert [(r["campaign_id"], r["seq"]) for r in rest["rows"]] == [
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 3),
    ]
    await Worker(build_app(Outbox(settings)), pool).drain()
    assert await pool.fetchval("SELECT sum(total) FROM demo_dice_totals") == 12
