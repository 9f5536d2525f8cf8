"""A worker's claim loops follow the backlog (S11): more while one lasts, back to the
concurrency after it; exactly once and in order per campaign whatever their number."""

from __future__ import annotations

import random

import anyio

import outbox
from outbox import Event, Settings, db
from outbox.model import StoredEvent

CAMPAIGNS = 30


def logging_app(settings: Settings) -> outbox.Outbox:
    """An ordered projector that logs what it applies (the order oracle) and adds into a
    per-campaign count (the exactly-once oracle, against the generator's own counts)."""
    app = outbox.Outbox(settings)

    @app.projector("loop_log", events=["tick"])
    async def loop_log(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO loop_log (campaign_id, seq) VALUES ($1, $2);",
            event.campaign_id,
            event.seq,
        )
        await tx.execute(
            "INSERT INTO loop_sums VALUES ($1, 1) ON CONFLICT (campaign_id) "
            "DO UPDATE SET n = loop_sums.n + 1",
            event.campaign_id,
        )

    return app


async def backlog(pool: db.Pool, app: outbox.Outbox) -> dict[str, int]:
    """Appends made while no worker runs (an outage); returns the events per campaign."""
    await pool.execute(
        "CREATE TABLE loop_log (id bigserial PRIMARY KEY, campaign_id text, seq bigint);"
        "CREATE TABLE loop_sums (campaign_id text PRIMARY KEY, n bigint NOT NULL)"
    )
    rng = random.Random(7)
    sent: dict[str, int] = {}
    for i in range(CAMPAIGNS):
        campaign = f"outage-{i}"
        for _ in range(rng.randint(1, 4)):
            burst = rng.randint(1, 6)
            await app.append(pool, campaign, [Event("tick", {"i": i})] * burst)
            sent[campaign] = sent.get(campaign, 0) + burst
    return sent


async def assert_exact(pool: db.Pool, sent: dict[str, int]) -> None:
    sums = {r["campaign_id"]: r["n"] for r in await pool.fetch("SELECT * FROM loop_sums")}
    assert sums == sent
    rows = await pool.fetch("SELECT campaign_id, seq FROM loop_log ORDER BY id")
    for campaign, n in sent.items():
        assert [r["seq"] for r in rows if r["campaign_id"] == campaign] == list(range(1, n + 1))


async def test_loops_grow_with_a_backlog_and_shrink_after_it(
    pool: db.Pool, settings: Settings
) -> None:
    app = logging_app(settings.replace(batch_size=5, max_concurrency=3, poll_interval=0.05))
    sent = await backlog(pool, app)
    total = sum(sent.values())
    async with outbox.running_worker(app, pool) as service:
        loops = service.loops
        with anyio.fail_after(60):
            await service.signals.batch_done.wait_until(lambda: service.totals.applied >= total)
            # The elastic loops end at their first batch that finds no backlog.
            await loops.changed.wait_until(lambda: loops.running == 1)
        assert (loops.floor, loops.ceiling) == (1, 3)
        assert loops.peak > 1  # full batches of a backlog started more loops
        assert loops.peak <= 3
        gauge = service.metrics.registry.get_sample_value("outbox_claim_loops")
        assert gauge == 1
    assert service.totals.applied == total
    await assert_exact(pool, sent)


async def test_an_embedded_worker_keeps_its_concurrency_without_a_ceiling(
    pool: db.Pool, settings: Settings
) -> None:
    """On the application's pool the loops do not grow unless OUTBOX_MAX_CONCURRENCY says so:
    the application sized that pool and uses it too."""
    app = logging_app(settings.replace(batch_size=5, poll_interval=0.05))
    sent = await backlog(pool, app)
    total = sum(sent.values())
    async with outbox.running_worker(app, pool) as service:
        with anyio.fail_after(60):
            await service.signals.batch_done.wait_until(lambda: service.totals.applied >= total)
        assert (service.loops.floor, service.loops.ceiling, service.loops.peak) == (1, 1, 1)
    await assert_exact(pool, sent)
