"""The apply worker's batch against a real PostgreSQL (S6-S9, S15, S16, S17, S18).

Time moves only through the injected `now` (the claim and the failure bookkeeping take it in
place of the database clock); the random source is seeded. Nothing sleeps.
"""

from __future__ import annotations

import logging
import os
import random
from datetime import UTC, datetime
from functools import partial

import anyio
import pytest
from campaigns_demo import campaigns as c
from campaigns_demo.app import build_app, install

from helpers import Clock, campaigns_in_one_bucket, queue_count
from outbox import Event, PermanentError, Settings, append, db, wait_applied
from outbox.errors import TransientBatchError
from outbox.model import BatchCounts, StoredEvent
from outbox.obs.metrics import Metrics
from outbox.projection.app import Outbox
from outbox.projection.dispatch import apply_event
from outbox.worker.batch import Worker
from outbox.worker.registration import HEARTBEAT_INTERVAL, Registration, listed_workers
from outbox.worker.service import Service, ServiceConfig


def demo(settings: Settings) -> Outbox:
    return build_app(Outbox(settings))


async def statuses(pool: db.Pool) -> dict[tuple[str, int], tuple[str, int]]:
    rows = await pool.fetch(
        "SELECT campaign_id, seq, status, attempt_count FROM outbox.projection_apply_outbox"
    )
    return {(r["campaign_id"], r["seq"]): (r["status"], r["attempt_count"]) for r in rows}


async def test_applies_and_deletes(pool: db.Pool, settings: Settings) -> None:
    await install(pool)
    app = demo(settings)
    await append(
        pool,
        "a",
        [Event(c.CHARACTER_JOINED, {"character": "Ada"}), Event(c.DICE_ROLLED, {"value": 5})],
        settings=settings,
    )
    counts = await Worker(app, pool).drain()
    assert (counts.claimed, counts.applied, counts.failed, counts.dead) == (2, 2, 0, 0)
    assert await statuses(pool) == {}
    assert await pool.fetchval("SELECT character FROM demo_roster") == "Ada"
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 5


async def test_a_failing_event_never_undoes_its_neighbours(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = demo(settings)
    good, bad = campaigns_in_one_bucket(2, "dice")  # one batch claims both
    await append(pool, good, [Event(c.DICE_ROLLED, {"value": 3})], settings=settings)
    await append(
        pool,
        bad,
        [Event(c.DICE_CURSED, {"sides": 13}), Event(c.DICE_ROLLED, {"value": 4})],
        settings=settings,
    )
    counts = await Worker(app, pool, now=Clock()).run_once()
    # `curse` failed on the cursed die and holds only itself (S24): the roll after it, which
    # `curse` does not take, applied in the same batch.
    assert (counts.applied, counts.failed) == (2, 1)
    rows = await statuses(pool)
    assert rows == {(bad, 1): ("failed", 1)}
    error = await pool.fetchval(
        "SELECT last_error FROM outbox.projection_apply_outbox WHERE seq = 1"
    )
    assert error.startswith("projector 'curse': CursedDice: a 13-sided die")
    total = "SELECT total FROM demo_dice_totals WHERE campaign_id = $1"
    assert await pool.fetchval(total, good) == 3
    assert await pool.fetchval(total, bad) == 4


async def test_backoff_bounds_then_dead_at_exactly_max_attempts(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = demo(settings)
    await append(pool, "cursed", [Event(c.DICE_CURSED, {})], settings=settings)
    clock = Clock()
    worker = Worker(app, pool, rand=random.Random(42).random, now=clock)
    for attempt in range(1, 9):
        counts = await worker.run_once()
        assert counts.claimed == 1
        row = await pool.fetchrow(
            "SELECT status, attempt_count, next_attempt_at FROM outbox.projection_apply_outbox"
        )
        assert row is not None
        assert row["attempt_count"] == attempt
        if attempt < 8:
            assert row["status"] == "failed"
            delay = (row["next_attempt_at"] - clock()).total_seconds()
            nominal = min(300.0, 2.0 ** (attempt - 1))
            assert nominal / 2 <= delay <= nominal, (attempt, delay)
            # Not due a moment before the delay is up, due once it is.
            clock.advance(delay / 2)
            assert (await worker.run_once()).claimed == 0
            clock.advance(delay)
        else:
            assert row["status"] == "dead"
    clock.advance(10_000)
    assert (await worker.run_once()).claimed == 0
    assert await statuses(pool) == {("cursed", 1): ("dead", 8)}


async def test_max_attempts_and_backoff_settings_are_honoured(pool: db.Pool, dsn: str) -> None:
    await install(pool)
    settings = Settings(dsn=dsn, max_attempts=3, backoff_base=10, backoff_cap=15)
    app = demo(settings)
    await append(pool, "c", [Event(c.DICE_CURSED, {})], settings=settings)
    clock = Clock()
    worker = Worker(app, pool, rand=lambda: 0.999, now=clock)
    delays = []
    for _ in range(3):
        await worker.run_once()
        at = await pool.fetchval("SELECT next_attempt_at FROM outbox.projection_apply_outbox")
        delays.append(round((at - clock()).total_seconds(), 1))
        clock.advance(1000)
    assert delays[:2] == [10.0, 15.0]  # 10 * 2**1 = 20, capped at 15
    assert await statuses(pool) == {("c", 1): ("dead", 3)}


async def test_permanent_error_is_dead_at_once(pool: db.Pool, settings: Settings) -> None:
    app = Outbox(settings)

    @app.projector("strict", events=["x"])
    async def strict(tx: db.Connection, event: StoredEvent) -> None:
        raise PermanentError("schema says no")

    await append(pool, "c", [Event("x", {})], settings=settings)
    counts = await Worker(app, pool).run_once()
    assert counts.dead == 1
    assert await statuses(pool) == {("c", 1): ("dead", 1)}
    assert await pool.fetchval("SELECT last_error FROM outbox.projection_apply_outbox") == (
        "projector 'strict': PermanentError: schema says no"
    )


async def test_transient_error_consumes_no_attempt(pool: db.Pool, settings: Settings) -> None:
    app = Outbox(settings)
    terminated = False

    @app.projector("fragile", events=["x"])
    async def fragile(tx: db.Connection, event: StoredEvent) -> None:
        nonlocal terminated
        if not terminated:
            terminated = True
            pid = await tx.fetchval("SELECT pg_backend_pid()")
            async with pool.acquire() as other:  # the backend dies under the worker
                await other.execute("SELECT pg_terminate_backend($1::integer)", pid)
        await tx.execute("CREATE TABLE IF NOT EXISTS fragile_applied (seq bigint)")
        await tx.execute("INSERT INTO fragile_applied VALUES ($1)", event.seq)

    await append(pool, "c", [Event("x", {}), Event("x", {})], settings=settings)
    worker = Worker(app, pool)
    with pytest.raises(TransientBatchError):
        await worker.run_once()
    assert await statuses(pool) == {("c", 1): ("pending", 0), ("c", 2): ("pending", 0)}
    counts = await worker.drain()
    assert counts.applied == 2
    assert await pool.fetchval("SELECT array_agg(seq ORDER BY seq) FROM fragile_applied") == [1, 2]


async def test_a_dead_projector_holds_only_itself_on_its_campaign_only(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = demo(settings)
    await append(
        pool,
        "blocked",
        [Event(c.DICE_CURSED, {}), Event(c.DICE_ROLLED, {"value": 1})],
        settings=settings,
    )
    await append(pool, "free", [Event(c.DICE_ROLLED, {"value": 2})] * 3, settings=settings)
    clock = Clock()
    worker = Worker(app, pool, now=clock)
    for _ in range(10):
        await worker.run_once()
        clock.advance(400)
    # `curse` is dead on the cursed die; the roll after it reached the dice totals (S24).
    assert await statuses(pool) == {("blocked", 1): ("dead", 8)}
    rolls = "SELECT rolls FROM demo_dice_totals WHERE campaign_id = $1"
    assert (await pool.fetchval(rolls, "free"), await pool.fetchval(rolls, "blocked")) == (3, 1)
    hold = await pool.fetchrow("SELECT projector, seq, status FROM outbox.projection_holds")
    assert hold is not None
    assert tuple(hold) == ("curse", 1, "dead")


async def test_park_lets_the_campaign_continue_and_keeps_the_dead_row(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, dead_policy="park")
    app = Outbox(settings)
    await pool.execute("CREATE TABLE seen (seq bigint)")

    @app.projector("sum", events=["ok", "boom"], ordered=False, idempotent=True)
    async def summing(tx: db.Connection, event: StoredEvent) -> None:
        if event.type == "boom":
            raise PermanentError("boom")
        # Only writes on tx count: a piece of a batch that rolled back is applied again.
        await tx.execute("INSERT INTO seen VALUES ($1)", event.seq)

    await append(
        pool,
        "c",
        [Event("ok", {}), Event("boom", {}), Event("ok", {}), Event("ok", {})],
        settings=settings,
    )
    worker = Worker(app, pool)
    await worker.drain()
    assert await statuses(pool) == {("c", 2): ("dead", 1)}
    assert await pool.fetchval("SELECT array_agg(seq ORDER BY seq) FROM seen") == [1, 3, 4]


async def test_ordering_none_lets_any_due_row_go(pool: db.Pool, dsn: str) -> None:
    settings = Settings(dsn=dsn, ordering="none")
    app = Outbox(settings)

    @app.projector("sum", events=["ok", "boom"], ordered=False, idempotent=True)
    async def summing(tx: db.Connection, event: StoredEvent) -> None:
        if event.type == "boom":
            raise RuntimeError("boom")

    await append(pool, "c", [Event("boom", {}), Event("ok", {})], settings=settings)
    counts = await Worker(app, pool).run_once()
    assert (counts.applied, counts.failed) == (1, 1)
    assert await statuses(pool) == {("c", 1): ("failed", 1)}


async def test_duplicates_are_skipped_by_checkpoint_and_marker(
    pool: db.Pool, settings: Settings
) -> None:
    await install(pool)
    app = demo(settings)
    await append(
        pool,
        "c",
        [Event(c.CHARACTER_JOINED, {"character": "Ada"}), Event(c.DICE_ROLLED, {"value": 6})],
        settings=settings,
    )
    # Applied once already (say, inline) but the work rows are still queued.
    async with pool.acquire() as conn:
        for seq, type_, payload in [
            (1, c.CHARACTER_JOINED, {"character": "Ada"}),
            (2, c.DICE_ROLLED, {"value": 6}),
        ]:
            async with conn.transaction():
                await apply_event(
                    conn, app.registry, StoredEvent("c", seq, type_, payload, {}, datetime.now(UTC))
                )
    counts = await Worker(app, pool).drain()
    assert (counts.applied, counts.skipped) == (0, 2)
    assert await pool.fetchval("SELECT rolls FROM demo_dice_totals") == 1
    assert (
        await pool.fetchval(
            "SELECT events FROM demo_event_counts WHERE event_type = $1", c.DICE_ROLLED
        )
        == 1
    )


async def test_unknown_type_fails_and_ignored_type_completes(
    pool: db.Pool, settings: Settings
) -> None:
    app = Outbox(settings.replace(unsubscribed="retry"))  # writers deployed before workers
    app.ignore(["noise"])
    a, b = campaigns_in_one_bucket(2)  # one batch claims both
    await append(pool, a, [Event("noise", {})], settings=settings)
    await append(pool, b, [Event("from.a.newer.deploy", {})], settings=settings)
    counts = await Worker(app, pool).run_once()
    assert (counts.skipped, counts.failed) == (1, 1)
    assert await statuses(pool) == {(b, 1): ("failed", 1)}
    assert "from.a.newer.deploy" in await pool.fetchval(
        "SELECT last_error FROM outbox.projection_apply_outbox"
    )


async def test_unsubscribed_events_are_skipped_counted_and_announced_once(
    pool: db.Pool, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    app = Outbox(settings)  # OUTBOX_UNSUBSCRIBED=skip, the default

    @app.projector("orders", events=["order.placed"])
    async def orders(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute("SELECT 1")

    for campaign in ("a", "b"):
        await append(pool, campaign, [Event("audit.noted", {})] * 2, settings=settings)
        await append(pool, campaign, [Event("order.placed", {})], settings=settings)
    metrics = Metrics()
    worker = Worker(app, pool, metrics=metrics)
    with caplog.at_level(logging.INFO, logger="outbox"):
        counts = await worker.drain()
    assert (counts.applied, counts.skipped, counts.failed, counts.dead) == (2, 4, 0, 0)
    assert await statuses(pool) == {}
    by_type = {"event_type": "audit.noted"}
    assert metrics.registry.get_sample_value("outbox_unsubscribed_events_total", by_type) == 4
    announced = [r for r in caplog.records if getattr(r, "event", r.msg) == "apply.unsubscribed"]
    assert len(announced) <= 1  # once per type per process (another test may have said it)


async def test_concurrent_loops_keep_campaign_order_and_apply_exactly_once(
    pool: db.Pool, settings: Settings
) -> None:
    """4 workers x 4 loops on 5 hot campaigns while bursts are appended; oracle from the journal."""
    app = Outbox(settings.replace(batch_size=7))
    await pool.execute(
        "CREATE TABLE applied_log (id bigserial PRIMARY KEY, campaign_id text, seq bigint);"
        "CREATE TABLE sums (campaign_id text PRIMARY KEY, n bigint NOT NULL)"
    )

    @app.projector("order_log", events=["tick"])
    async def order_log(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO applied_log (campaign_id, seq) VALUES ($1, $2)",
            event.campaign_id,
            event.seq,
        )

    @app.projector("additive", events=["tick"], ordered=False, idempotent=True)
    async def additive(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO sums VALUES ($1, 1) ON CONFLICT (campaign_id) "
            "DO UPDATE SET n = sums.n + 1",
            event.campaign_id,
        )

    appending = True
    totals = BatchCounts()

    async def appender(campaign: str, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            burst = rng.randint(1, 12)
            await append(pool, campaign, [Event("tick", {})] * burst, settings=app.settings)

    async def loop(worker: Worker) -> None:
        while appending:
            totals.add(await worker.run_once())
        totals.add(await worker.drain())

    async with anyio.create_task_group() as workers:
        for _ in range(4):
            worker = Worker(app, pool)
            for _ in range(4):
                workers.start_soon(loop, worker)
        async with anyio.create_task_group() as appenders:
            for i in range(5):
                appenders.start_soon(appender, f"hot-{i}", i)
        appending = False

    journal = {
        r["campaign_id"]: r["n"]
        for r in await pool.fetch(
            "SELECT campaign_id, count(*) AS n FROM outbox.event_journal GROUP BY campaign_id"
        )
    }
    sums = {r["campaign_id"]: r["n"] for r in await pool.fetch("SELECT * FROM sums")}
    assert sums == journal
    assert totals.applied == sum(journal.values())
    assert await queue_count(pool) == 0
    rows = await pool.fetch("SELECT campaign_id, seq FROM applied_log ORDER BY id")
    for campaign, n in journal.items():
        assert [r["seq"] for r in rows if r["campaign_id"] == campaign] == list(range(1, n + 1))


async def test_wait_applied_reads_your_writes(pool: db.Pool, settings: Settings) -> None:
    await install(pool)
    app = demo(settings)
    result = await append(pool, "c", [Event(c.DICE_ROLLED, {"value": 2})] * 3, settings=settings)
    assert not await wait_applied(pool, "c", result.last_seq, timeout=0)

    async def apply_soon() -> None:
        await Worker(app, pool).drain()

    async with anyio.create_task_group() as tg:
        tg.start_soon(apply_soon)
        assert await wait_applied(pool, "c", result.last_seq, timeout=30)
    assert await pool.fetchval("SELECT rolls FROM demo_dice_totals") == 3


async def test_idle_loop_wakes_when_a_retry_falls_due_not_at_the_poll(
    pool: db.Pool, dsn: str
) -> None:
    """S10: with a 30 s poll and a ~0.2 s backoff, the retry runs long before the poll would."""
    settings = Settings(dsn=dsn, poll_interval=30, backoff_base=0.2, backoff_cap=0.2)
    app = Outbox(settings)
    attempts: list[int] = []

    @app.projector("flaky", events=["x"])
    async def flaky(tx: db.Connection, event: StoredEvent) -> None:
        attempts.append(event.seq)
        if len(attempts) == 1:
            raise RuntimeError("first time unlucky")

    await append(pool, "c", [Event("x", {})], settings=settings)
    service = Service(Worker(app, pool), ServiceConfig(dsn=dsn))
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        with anyio.fail_after(15):
            await service.signals.batch_done.wait_until(lambda: service.totals.applied == 1)
        service.stop()
    assert attempts == [1, 1]
    assert await queue_count(pool) == 0


async def test_a_running_worker_is_registered_and_signs_off(pool: db.Pool, dsn: str) -> None:
    app = Outbox(Settings(dsn=dsn))
    service = Service(Worker(app, pool), ServiceConfig(dsn=dsn, concurrency=3))
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        (live,) = await listed_workers(pool)
        assert (live.worker_id, live.mode, live.concurrency) == (
            service.worker_id,
            "apply",
            3,
        )
        assert live.pid == os.getpid()
        assert live.state == "live"
        service.stop()
    assert await listed_workers(pool) == []
    stopped = await pool.fetchval(
        "SELECT stopped_at IS NOT NULL FROM outbox.outbox_workers WHERE worker_id = $1",
        service.worker_id,
    )
    assert stopped


async def test_a_worker_silent_for_three_heartbeats_is_listed_stale_then_not_at_all(
    pool: db.Pool,
) -> None:
    """A worker killed (no sign-off) is listed `stale` once silent for three heartbeats, then
    goes from the list after an hour; the console's overview counts only the live ones."""
    registration = Registration(pool, "w-killed", "apply", 2)
    await registration.register()
    [fresh] = await listed_workers(pool)
    assert fresh.state == "live"
    await pool.execute(
        "UPDATE outbox.outbox_workers SET heartbeat_at = clock_timestamp() - "
        "make_interval(secs => $1)",
        3 * HEARTBEAT_INTERVAL + 1,
    )
    [killed] = await listed_workers(pool)
    assert (killed.worker_id, killed.state) == ("w-killed", "stale")
    await pool.execute(
        "UPDATE outbox.outbox_workers SET heartbeat_at = clock_timestamp() - interval '2 hours'"
    )
    assert await listed_workers(pool) == []
