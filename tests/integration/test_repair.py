"""The repair paths: outbox-replay (one row now) and projections-rebuild (S19), CLI and API."""

from __future__ import annotations

import subprocess
from typing import Any

import anyio
import orjson
from campaigns_demo import campaigns as c
from campaigns_demo.app import build_app, install
from campaigns_demo.campaigns import DemoStream

from helpers import queue_campaigns, queue_count, run_cli
from outbox import Event, Outbox, Settings, append, db
from outbox.append.journal import list_campaigns
from outbox.projection.rebuild import rebuild_campaign
from outbox.worker.batch import Worker

APP = "campaigns_demo.app:app"
SNAPSHOT = {
    "demo_roster": "SELECT campaign_id, character, class FROM demo_roster ORDER BY 1, 2",
    "demo_event_counts": "SELECT * FROM demo_event_counts ORDER BY 1, 2",
    "demo_dice_totals": "SELECT * FROM demo_dice_totals ORDER BY 1",
}


def cli(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    return run_cli("maintenance", *args, dsn=dsn)


async def snapshot(pool: db.Pool) -> dict[str, list[Any]]:
    return {t: [tuple(r) for r in await pool.fetch(q)] for t, q in SNAPSHOT.items()}


async def seed_demo(
    pool: db.Pool, settings: Settings, campaigns: int = 4, events: int = 60
) -> None:
    await install(pool)
    stream = DemoStream()
    for i in range(campaigns):
        for batch in stream.batches(f"camp-{i}", events):
            await append(pool, f"camp-{i}", batch, settings=settings)


async def test_replay_outcomes(pool: db.Pool, dsn: str, settings: Settings) -> None:
    await install(pool)
    await append(
        pool,
        "a",
        [Event(c.DICE_ROLLED, {"value": 4}), Event(c.DICE_ROLLED, {"value": 1})],
        settings=settings,
    )
    await append(pool, "b", [Event(c.DICE_CURSED, {"sides": 13})], settings=settings)
    blocked = cli("outbox-replay", "--app", APP, "--campaign-id", "a", "--seq", "2", dsn=dsn)
    assert blocked.returncode == 1
    assert "waits behind seq 1" in blocked.stderr
    applied = cli(
        "outbox-replay", "--app", APP, "--campaign-id", "a", "--seq", "1", "--json", dsn=dsn
    )
    assert applied.returncode == 0, applied.stderr
    assert orjson.loads(applied.stdout) == {
        "schema_version": 1,
        "mode": "outbox-replay",
        "campaign_id": "a",
        "seq": 1,
        "outcome": "applied",
        "error": None,
    }
    failed = cli(
        "outbox-replay", "--app", APP, "--campaign-id", "b", "--seq", "1", "--json", dsn=dsn
    )
    assert failed.returncode == 1
    body = orjson.loads(failed.stdout)
    assert (body["outcome"], body["status"], body["attempt_count"]) == ("failed", "failed", 1)
    assert body["error"].startswith("projector 'curse': CursedDice")
    assert "replay failed" in failed.stderr
    missing = cli("outbox-replay", "--app", APP, "--campaign-id", "zz", "--seq", "1", dsn=dsn)
    assert missing.returncode == 1
    assert "no queued row" in missing.stderr
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 4


async def test_replay_of_an_already_applied_event_is_skipped(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    await append(pool, "a", [Event(c.DICE_ROLLED, {"value": 6})], settings=settings)
    await Worker(build_app(Outbox(settings)), pool).drain()
    # The row comes back (say, restored by hand) although the projection already has it.
    await pool.execute(
        "INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type) "
        "VALUES (outbox.outbox_bucket('a'), 'a', 1, $1)",
        c.DICE_ROLLED,
    )
    await queue_campaigns(pool)
    proc = cli("outbox-replay", "--app", APP, "--campaign-id", "a", "--seq", "1", dsn=dsn)
    assert proc.returncode == 0, proc.stderr
    assert "skipped" in proc.stdout
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 6


async def test_rebuild_equals_a_fresh_apply_of_the_journal(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await seed_demo(pool, settings)
    await Worker(build_app(Outbox(settings)), pool).drain()
    fresh = await snapshot(pool)
    assert all(fresh.values())
    # Damage every projection, then repair from the journal.
    await pool.execute(
        "DELETE FROM demo_roster WHERE campaign_id = 'camp-1';"
        "UPDATE demo_dice_totals SET total = total * 3, rolls = 0;"
        "UPDATE demo_event_counts SET events = 999"
    )
    dry = cli("projections-rebuild", "--app", APP, dsn=dsn)
    assert dry.returncode == 0
    assert "pass --yes" in dry.stderr
    assert await snapshot(pool) != fresh
    proc = cli("projections-rebuild", "--app", APP, "--yes", "--json", dsn=dsn)
    assert proc.returncode == 0, proc.stderr
    *ticks, body = map(orjson.loads, proc.stdout.splitlines())
    assert (body["mode"], body["campaigns"], body["rebuilt"]) == ("projections-rebuild", 4, True)
    # On the engine: a progress line for each ordered projector's rebuild, at least.
    assert {t["mode"] for t in ticks} == {"projections-rebuild.progress"}
    assert await snapshot(pool) == fresh
    # One projector, one campaign.
    await pool.execute("UPDATE demo_dice_totals SET total = 0 WHERE campaign_id = 'camp-2'")
    one = cli(
        "projections-rebuild",
        "--app",
        APP,
        "--projector",
        "dice_totals",
        "--campaign-id",
        "camp-2",
        "--yes",
        dsn=dsn,
    )
    assert one.returncode == 0, one.stderr
    assert await snapshot(pool) == fresh


async def test_rebuild_refuses_a_projector_without_reset_or_unknown(dsn: str) -> None:
    proc = cli("projections-rebuild", "--app", APP, "--projector", "curse", "--yes", dsn=dsn)
    assert proc.returncode == 2
    assert "no reset hook" in proc.stderr
    proc = cli("projections-rebuild", "--app", APP, "--projector", "nope", dsn=dsn)
    assert proc.returncode == 2
    assert "no projector named 'nope'" in proc.stderr


async def test_rebuild_beside_running_workers_applies_nothing_twice(
    pool: db.Pool, settings: Settings
) -> None:
    """Queued rows, a rebuild and 4 claim loops at once; oracles from the journal."""
    await seed_demo(pool, settings, campaigns=6, events=80)
    app = build_app(Outbox(settings.replace(batch_size=5)))
    rebuilt = ["roster", "event_counts", "dice_totals"]
    done = anyio.Event()

    async def loop() -> None:
        worker = Worker(app, pool)
        while not done.is_set():
            await worker.run_once()
        await worker.drain()

    async def rebuild() -> None:
        for name in rebuilt:
            for campaign in await list_campaigns(pool, None):
                await rebuild_campaign(pool, app.registry.projectors[name], campaign)
        done.set()

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(loop)
        tg.start_soon(rebuild)

    assert await queue_count(pool) == 0
    rolls = await pool.fetchval(
        "SELECT count(*) FROM outbox.event_journal WHERE event_type = $1", c.DICE_ROLLED
    )
    assert await pool.fetchval("SELECT sum(rolls) FROM demo_dice_totals") == rolls
    counts = {
        (r["campaign_id"], r["event_type"]): r["n"]
        for r in await pool.fetch(
            "SELECT campaign_id, event_type, count(*) AS n FROM outbox.event_journal "
            "WHERE event_type <> $1 GROUP BY 1, 2",
            c.DICE_CURSED,
        )
    }
    projected = {
        (r["campaign_id"], r["event_type"]): r["events"]
        for r in await pool.fetch("SELECT * FROM demo_event_counts")
    }
    assert projected == counts
