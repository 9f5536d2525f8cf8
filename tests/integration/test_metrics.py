"""Prometheus metrics: outcomes, shadow observations, queue gauges, /metrics over HTTP."""

from __future__ import annotations

import urllib.request
from functools import partial

import anyio
from campaigns_demo import campaigns as c
from campaigns_demo.app import build_app, install

from outbox import Event, Outbox, Settings, append, db
from outbox.model import BatchCounts
from outbox.obs.metrics import Metrics
from outbox.worker.batch import Worker
from outbox.worker.gauges import refresh_gauges
from outbox.worker.service import Service, ServiceConfig
from outbox.worker.shadow import Shadow


async def test_service_metrics_count_outcomes_and_serve_them(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    await append(pool, "c", [Event(c.DICE_ROLLED, {"value": 1})] * 3, settings=settings)
    service = Service(Worker(build_app(Outbox(settings)), pool), ServiceConfig(dsn=dsn))
    _, port = service.metrics.serve(0, addr="127.0.0.1")
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        with anyio.fail_after(15):
            await service.signals.batch_done.wait_until(lambda: service.totals.applied == 3)
            await service.wait_listening()
        service.stop()
    sample = service.metrics.registry.get_sample_value
    assert sample("outbox_events_total", {"outcome": "applied"}) == 3
    # Every registered projector has its series from the start, failed ones at 0.
    names = service.worker.app.registry.projectors
    assert len(names) > 1
    for name in names:
        assert sample("outbox_apply_total", {"projector": name, "outcome": "failed"}) == 0
    assert (sample("outbox_batch_size_count") or 0) >= 1
    await append(pool, "d", [Event(c.DICE_CURSED, {})], settings=settings)
    await refresh_gauges(service.metrics, pool, park=False)
    assert sample("outbox_queue_rows", {"status": "pending"}) == 1
    assert sample("outbox_blocked_campaigns") == 0
    body = await anyio.to_thread.run_sync(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    )
    text = body.decode()
    assert 'outbox_events_total{outcome="applied"} 3.0' in text
    assert 'outbox_queue_rows{status="pending"} 1.0' in text
    assert "outbox_listener_connected" in text


async def test_shadow_observations_show_in_the_metrics(pool: db.Pool, settings: Settings) -> None:
    await install(pool)
    before = await pool.fetchval("SELECT clock_timestamp()")
    await append(pool, "c", [Event(c.DICE_ROLLED, {"value": 1})] * 2, settings=settings)
    metrics = Metrics()
    shadow = Worker(build_app(Outbox(settings)), pool, strategy=Shadow())
    counts: BatchCounts = await shadow.run_once()
    after = await pool.fetchval("SELECT clock_timestamp()")
    metrics.record_batch(counts)
    await refresh_gauges(metrics, pool, park=False)
    assert metrics.registry.get_sample_value("outbox_events_total", {"outcome": "observed"}) == 2
    lag = metrics.registry.get_sample_value("outbox_shadow_max_lag_seconds")
    # Enqueue to first sighting, in seconds by the database clock: within the test's own span.
    assert lag is not None
    assert 0 < lag <= (after - before).total_seconds()


async def test_a_held_projector_has_its_own_series(pool: db.Pool, settings: Settings) -> None:
    await install(pool)
    await append(pool, "d", [Event(c.DICE_CURSED, {}), Event(c.DICE_ROLLED, {"value": 2})],
                 settings=settings)  # fmt: skip
    app = build_app(Outbox(settings))
    metrics = Metrics()
    metrics.register_projectors(app.registry.projectors)
    await Worker(app, pool).run_once()  # `curse` fails on the cursed die: a hold of its own
    await refresh_gauges(metrics, pool, park=False)
    sample = metrics.registry.get_sample_value
    assert sample("outbox_projector_holds", {"projector": "curse", "state": "failed"}) == 1
    assert sample("outbox_projector_held_campaigns", {"projector": "curse"}) == 1
    assert (sample("outbox_projector_held_seconds", {"projector": "curse"}) or 0) >= 0
    # The others hold nothing: their series read 0, and no campaign is blocked.
    others = [n for n in app.registry.projectors if n != "curse"]
    assert others
    for name in others:
        assert sample("outbox_projector_holds", {"projector": name, "state": "failed"}) == 0
    assert sample("outbox_blocked_campaigns") == 0
    await pool.execute("DELETE FROM outbox.projection_holds")
    await refresh_gauges(metrics, pool, park=False)
    assert sample("outbox_projector_holds", {"projector": "curse", "state": "failed"}) == 0
