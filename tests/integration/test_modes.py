"""Rollout modes (issue 4): the flag matrix of docs/configuration.md, row by row, and the
shadow worker (S14)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import partial

import anyio
import orjson
import pytest
from campaigns_demo import campaigns as c
from campaigns_demo.app import build_app, install
from factories import make_failed

from helpers import ROOT, queue_count, run_cli
from outbox import ConfigError, Event, Outbox, Settings, append, db
from outbox.config import resolve_worker_mode
from outbox.model import StoredEvent
from outbox.projection.dispatch import apply_event
from outbox.worker.batch import Worker
from outbox.worker.registration import listed_workers
from outbox.worker.service import Service, ServiceConfig
from outbox.worker.shadow import Shadow

DOC = (ROOT / "docs" / "configuration.md").read_text()
ROW = re.compile(r"^\| (true|false) \| (true|false) \| (true|false) \| (\S+) \| (.+) \|$", re.M)
MATRIX = ROW.findall(DOC)


def test_the_documented_matrix_is_complete() -> None:
    combos = {(e, w, s, m) for e, w, s, m, _ in MATRIX}
    assert len(MATRIX) == len(combos) == 24


@pytest.mark.parametrize(("enabled", "worker", "shadow", "mode", "outcome"), MATRIX)
def test_every_flag_combination_resolves_as_documented(
    enabled: str, worker: str, shadow: str, mode: str, outcome: str
) -> None:
    settings = Settings.from_env(
        {
            "OUTBOX_ENABLED": enabled,
            "OUTBOX_WORKER_ENABLED": worker,
            "OUTBOX_SHADOW_WORKER_ENABLED": shadow,
        }
    )
    requested = None if mode == "—" else mode
    if outcome.startswith("refuses"):
        with pytest.raises(ConfigError) as info:
            resolve_worker_mode(settings, requested)  # type: ignore[arg-type]
        expected = "OUTBOX_ENABLED is off" if "enqueueing" in outcome else "no worker is enabled"
        assert expected in str(info.value)
        # Every refusal is one a worker started without --mode meets too: the report says off.
        assert settings.resolved_mode() == "off"
        return
    resolution = resolve_worker_mode(settings, requested)  # type: ignore[arg-type]
    assert f"{resolution.mode} worker" == outcome.split(",")[0]
    assert (resolution.warning is not None) == ("warning" in outcome)
    # OUTBOX_MODE (Settings.mode) is the same request as --mode.
    as_setting = resolve_worker_mode(settings.replace(mode=requested))
    assert (as_setting.mode, as_setting.warning) == (resolution.mode, resolution.warning)


def test_cli_refuses_without_enqueueing_and_warns_when_both_workers_are_on(dsn: str) -> None:
    base = ("outbox-worker", "--app", "campaigns_demo.app:app", "--drain")
    off = run_cli(*base, dsn=dsn, env={"OUTBOX_ENABLED": "false"})
    assert off.returncode == 2
    assert len(off.stderr.strip().splitlines()) == 1
    assert "OUTBOX_ENABLED is off" in off.stderr
    none = run_cli(*base, dsn=dsn, env={"OUTBOX_WORKER_ENABLED": "no"})
    assert none.returncode == 2
    assert "no worker is enabled" in none.stderr
    both = run_cli(*base, dsn=dsn, env={"OUTBOX_SHADOW_WORKER_ENABLED": "on"})
    assert both.returncode == 0, both.stderr
    warnings = [orjson.loads(ln) for ln in both.stderr.splitlines() if '"warning"' in ln]
    assert [w["event"] for w in warnings] == ["worker.mode_conflict"]
    started = [orjson.loads(ln) for ln in both.stderr.splitlines() if "worker.started" in ln]
    assert started[0]["mode"] == "apply"
    shadow = run_cli(*base, "--mode", "shadow", dsn=dsn)
    assert shadow.returncode == 0, shadow.stderr
    assert '"mode":"shadow"' in shadow.stderr


async def test_shadow_passes_never_consume_attempts_nor_kill(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    await append(
        pool, "c", [Event(c.DICE_CURSED, {}), Event(c.DICE_ROLLED, {"value": 1})], settings=settings
    )
    await make_failed(pool, "c", 1, error="earlier", attempts=7)
    clock = [datetime.now(UTC)]
    shadow = Worker(build_app(Outbox(settings)), pool, now=lambda: clock[0], strategy=Shadow())
    for _ in range(50):
        counts = await shadow.run_once()
        assert counts.applied == counts.failed == counts.dead == 0
        clock[0] += timedelta(hours=1)
    rows = await pool.fetch(
        "SELECT seq, status, attempt_count, last_error, seen_count, "
        "first_seen_at < last_seen_at AS spread FROM outbox.projection_apply_outbox "
        "ORDER BY seq"
    )
    assert [(r["seq"], r["status"], r["attempt_count"], r["last_error"]) for r in rows] == [
        (1, "failed", 7, "earlier"),
        (2, "pending", 0, None),
    ]
    assert [r["seen_count"] for r in rows] == [50, 50]
    assert all(r["spread"] for r in rows)
    assert await pool.fetchval("SELECT count(*) FROM demo_dice_totals") == 0
    report = run_cli("maintenance", "outbox-report", "--json", dsn=settings.dsn)
    assert orjson.loads(report.stdout)["summary"]["shadow"]["sightings"] == 100


async def test_shadow_completes_rows_already_applied(pool: db.Pool, settings: Settings) -> None:
    await install(pool)
    app = build_app(Outbox(settings))
    await append(pool, "c", [Event(c.DICE_ROLLED, {"value": 3})] * 4, settings=settings)
    async with pool.acquire() as conn:
        for seq in (1, 2):
            async with conn.transaction():
                await apply_event(
                    conn,
                    app.registry,
                    StoredEvent("c", seq, c.DICE_ROLLED, {"value": 3}, {}, datetime.now(UTC)),
                )
    counts = await Worker(app, pool, strategy=Shadow()).run_once()
    assert (counts.skipped, counts.observed) == (2, 2)
    assert await pool.fetchval(
        "SELECT array_agg(seq ORDER BY seq) FROM outbox.projection_apply_outbox"
    ) == [3, 4]


async def test_shadow_then_apply_applies_each_event_exactly_once(
    pool: db.Pool, settings: Settings
) -> None:
    """Half the events applied inline first, a shadow phase, then the apply worker."""
    await install(pool)
    app = build_app(Outbox(settings.replace(inline_apply=True)))
    for v in range(1, 21):  # inline for the first half, queued for the rest
        await app.append(pool, "c", [Event(c.DICE_ROLLED, {"value": v})], apply_inline=v <= 10)
    assert await pool.fetchval("SELECT min(seq) FROM outbox.projection_apply_outbox") == 11
    far = datetime.now(UTC) + timedelta(days=1)
    shadow = Worker(app, pool, now=lambda: far, strategy=Shadow())
    for _ in range(3):
        await shadow.run_once()
    apply_clock = far + timedelta(days=1)
    counts = await Worker(app, pool, now=lambda: apply_clock).drain()
    assert (counts.applied, counts.failed) == (10, 0)
    row = await pool.fetchrow("SELECT rolls, total FROM demo_dice_totals")
    assert row is not None
    assert (row["rolls"], row["total"]) == (20, sum(range(1, 21)))  # oracle: the journal's 20
    assert await queue_count(pool) == 0


async def test_a_shadow_worker_registers_its_mode(pool: db.Pool, dsn: str) -> None:
    service = Service(
        Worker(Outbox(Settings(dsn=dsn)), pool, strategy=Shadow()),
        ServiceConfig(dsn=dsn, mode="shadow"),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        assert [w.mode for w in await listed_workers(pool)] == ["shadow"]
        service.stop()
