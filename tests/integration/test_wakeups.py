"""What wakes a claim loop and how much one claim takes (S6, S10, S20).

The services run with a poll interval of an hour unless the test is about polling: work that
gets applied then was found by a NOTIFY or by the loop claiming again on its own, never by a
poll. Every wait is for database state, with a deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial

import anyio
import pytest
from factories import make_dead, make_failed

from helpers import campaigns_in_one_bucket
from outbox import Event, Outbox, Settings, StoredEvent, append, db, wait_applied
from outbox.queue.settle import refresh_campaigns
from outbox.worker.batch import Worker
from outbox.worker.service import Service, ServiceConfig

HOUR = 3600.0


@pytest.fixture
async def applied_table(pool: db.Pool) -> None:
    await pool.execute(
        "CREATE TABLE applied (id bigserial PRIMARY KEY, campaign_id text NOT NULL, "
        "seq bigint NOT NULL)"
    )


def recording_app(settings: Settings) -> Outbox:
    app = Outbox(settings)

    @app.projector("recorder", events=["tick"], batch=True)
    async def recorder(tx: db.Connection, events: Sequence[StoredEvent]) -> None:
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) SELECT * FROM unnest($1::text[], $2::bigint[])",
            [e.campaign_id for e in events],
            [e.seq for e in events],
        )

    return app


async def applied(pool: db.Pool) -> list[tuple[str, int]]:
    rows = await pool.fetch("SELECT campaign_id, seq FROM applied ORDER BY id")
    return [(r["campaign_id"], r["seq"]) for r in rows]


async def until_applied(service: Service, n: int) -> None:
    """Until the service's batches applied `n` events (its own signal, no polling)."""
    with anyio.fail_after(30):
        await service.signals.batch_done.wait_until(lambda: service.totals.applied >= n)


@asynccontextmanager
async def serving(service: Service) -> AsyncIterator[Service]:
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        yield service
        service.stop()


def ticks(n: int) -> list[Event]:
    return [Event("tick", {})] * n


@pytest.mark.usefixtures("applied_table")
async def test_a_notify_wakes_an_idle_loop(pool: db.Pool, dsn: str) -> None:
    settings = Settings(dsn=dsn, poll_interval=HOUR)
    async with serving(
        Service(Worker(recording_app(settings), pool), ServiceConfig(dsn=dsn))
    ) as service:
        with anyio.fail_after(30):
            await service.wait_listening()
        await append(pool, "first", ticks(1), settings=settings)
        await until_applied(service, 1)
        # The loop is idle now, for an hour unless woken: the new campaign's NOTIFY wakes it.
        await append(pool, "second", ticks(1), settings=settings)
        await until_applied(service, 2)
    assert await applied(pool) == [("first", 1), ("second", 1)]


@pytest.mark.usefixtures("applied_table")
async def test_an_idle_loop_takes_new_work_while_the_other_is_busy(pool: db.Pool, dsn: str) -> None:
    """Two loops: one is held inside a projector (its batch open); a NOTIFY wakes the idle one,
    which applies the new campaign at once, not after the busy batch."""
    settings = Settings(dsn=dsn, poll_interval=HOUR)
    app = Outbox(settings)
    entered, release = anyio.Event(), anyio.Event()

    @app.projector("recorder", events=["tick"], batch=True)
    async def recorder(tx: db.Connection, events: Sequence[StoredEvent]) -> None:
        if any(e.campaign_id == "busy" for e in events):
            entered.set()
            await release.wait()
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) SELECT * FROM unnest($1::text[], $2::bigint[])",
            [e.campaign_id for e in events],
            [e.seq for e in events],
        )

    async with serving(
        Service(Worker(app, pool), ServiceConfig(dsn=dsn, concurrency=2))
    ) as service:
        with anyio.fail_after(30):
            await service.wait_listening()
            await append(pool, "busy", ticks(1), settings=settings)
            await entered.wait()
            await append(pool, "new", ticks(1), settings=settings)
        await until_applied(service, 1)
        assert await applied(pool) == [("new", 1)]  # while the busy batch is still open
        release.set()
        await until_applied(service, 2)
    assert await applied(pool) == [("new", 1), ("busy", 1)]


@pytest.mark.usefixtures("applied_table")
async def test_a_retry_in_backoff_wakes_the_loop_when_it_falls_due(pool: db.Pool, dsn: str) -> None:
    """A batch that scheduled a retry looks up when it falls due and sleeps until then: no
    NOTIFY comes for a retry, and the poll is an hour away."""
    settings = Settings(dsn=dsn, poll_interval=HOUR, backoff_base=0.2, backoff_cap=0.2)
    app = Outbox(settings)

    @app.projector("recorder", events=["tick"], batch=True)
    async def recorder(tx: db.Connection, events: Sequence[StoredEvent]) -> None:
        attempts = await tx.fetchval(
            "SELECT attempt_count FROM outbox.projection_apply_outbox WHERE campaign_id = 'flaky'"
        )
        if attempts == 0:
            raise RuntimeError("the first attempt fails")
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) SELECT * FROM unnest($1::text[], $2::bigint[])",
            [e.campaign_id for e in events],
            [e.seq for e in events],
        )

    async with serving(Service(Worker(app, pool), ServiceConfig(dsn=dsn))) as service:
        with anyio.fail_after(30):
            await service.wait_listening()
        await append(pool, "flaky", ticks(1), settings=settings)
        await until_applied(service, 1)
    assert service.totals.failed == 1
    assert await applied(pool) == [("flaky", 1)]


@pytest.mark.usefixtures("applied_table")
async def test_without_notifications_the_poll_finds_the_work(pool: db.Pool, dsn: str) -> None:
    settings = Settings(dsn=dsn, poll_interval=0.05)
    service = Service(
        Worker(recording_app(settings), pool), ServiceConfig(dsn=dsn, notifications=False)
    )
    async with serving(service):
        await append(pool, "c", ticks(3), settings=settings)
        await until_applied(service, 3)
        assert not service.listener_connected
    assert await applied(pool) == [("c", 1), ("c", 2), ("c", 3)]


@pytest.mark.usefixtures("applied_table")
async def test_a_loop_keeps_claiming_while_batches_come_back_full(pool: db.Pool, dsn: str) -> None:
    settings = Settings(dsn=dsn, poll_interval=HOUR, batch_size=10)
    for c in range(25):  # 25 campaigns: 10, 10 and 5 rows, each batch empties its campaigns
        await append(pool, f"c{c:02}", ticks(1), settings=settings)
    service = Service(
        Worker(recording_app(settings), pool), ServiceConfig(dsn=dsn, notifications=False)
    )
    async with serving(service):
        await until_applied(service, 25)
    assert service.totals.claimed == 25


@pytest.mark.usefixtures("applied_table")
async def test_a_loop_claims_again_while_campaigns_are_left_due(pool: db.Pool, dsn: str) -> None:
    settings = Settings(dsn=dsn, poll_interval=HOUR, batch_size=10)
    # Two campaigns share the budget: 5 rows of `hot` and `one`'s row, a batch of 6 (not
    # full), and `hot` left due: the loop must claim again without a poll or a NOTIFY.
    await append(pool, "hot", ticks(30), settings=settings)
    await append(pool, "one", ticks(1), settings=settings)
    service = Service(
        Worker(recording_app(settings), pool), ServiceConfig(dsn=dsn, notifications=False)
    )
    async with serving(service):
        await until_applied(service, 31)
    hot = [seq for cid, seq in await applied(pool) if cid == "hot"]
    assert hot == list(range(1, 31))


@pytest.mark.usefixtures("applied_table")
async def test_a_claim_takes_at_most_batch_size_oldest_first_across_campaigns(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, batch_size=3)
    a, b, c, d, hot = campaigns_in_one_bucket(5, "w")  # a batch claims in one bucket
    names = [a, b, c, d]
    for name in names:
        await append(pool, name, ticks(5), settings=settings)
    # Oldest first by next_attempt_at (the heads'), whatever the campaign ids say: d, b, then
    # a or c (not yet due: an hour ahead) never.
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox SET next_attempt_at = clock_timestamp() + CASE "
        "campaign_id WHEN $1 THEN interval '-3 hours' WHEN $2 THEN interval '-2 hours' "
        "WHEN $3 THEN interval '-1 hour' ELSE interval '1 hour' END",
        d,
        b,
        a,
    )
    async with pool.acquire() as conn:
        await refresh_campaigns(conn, names, park=False, removable=())
    worker = Worker(recording_app(settings), pool)
    counts = await worker.run_once()
    assert counts.claimed == 3
    first = await applied(pool)
    assert sorted({cid for cid, _ in first}) == sorted([a, b, d])
    assert all(cid != c for cid, _ in await applied(pool))
    counts = await worker.run_once()
    assert counts.claimed == 3
    assert len(await applied(pool)) == 6
    # One hot campaign gets the whole budget, never more.
    await append(pool, hot, ticks(50), settings=settings)
    await pool.execute("DELETE FROM outbox.projection_apply_outbox WHERE campaign_id <> $1", hot)
    async with pool.acquire() as conn:  # nothing live: their campaign rows go
        await refresh_campaigns(conn, names, park=False)
    assert (await worker.run_once()).claimed == 3


async def test_wait_applied_is_false_when_its_timeout_runs_out(
    pool: db.Pool, settings: Settings
) -> None:
    result = await append(pool, "c", ticks(2), settings=settings)
    # Long enough for several looks at the queue: the row stays outstanding throughout.
    assert not await wait_applied(pool, "c", result.last_seq, timeout=0.3)
    assert not await wait_applied(pool, "c", 1, timeout=0.3)
    assert await wait_applied(pool, "other", 1, timeout=0.3)  # nothing outstanding


@pytest.mark.usefixtures("applied_table")
async def test_wait_applied_says_what_holds_the_events(
    pool: db.Pool, dsn: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = await append(pool, "c", ticks(3), settings=settings)
    pending = await wait_applied(pool, "c", 2, timeout=0.05)  # no worker runs
    assert (bool(pending), pending.state, pending.seq, pending.blocked) == (
        False,
        "pending",
        1,
        False,
    )
    await make_dead(pool, "c", 1, error="projector 'x': KeyError: 'k'")
    with anyio.fail_after(10):  # a dead head: no point waiting out the minute
        dead = await wait_applied(pool, "c", result.last_seq, timeout=60)
    assert (dead.state, dead.seq, dead.attempts, dead.blocked) == ("dead", 1, 8, True)
    assert dead.last_error == "projector 'x': KeyError: 'k'"
    await make_failed(pool, "c", 1, due_in=3600)
    with anyio.fail_after(10):  # its retry falls due after the timeout: said at once
        failed = await wait_applied(pool, "c", result.last_seq, timeout=60)
    assert (failed.state, failed.attempts, failed.next_attempt_at is not None) == (
        "failed",
        2,
        True,
    )
    # Woken by the workers' notification alone: no look again for an hour.
    monkeypatch.setattr("outbox.queue.applied.RECHECK", 3600.0)
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox "
        "SET status = 'pending', attempt_count = 0, next_attempt_at = clock_timestamp()"
    )
    await pool.execute(
        "UPDATE outbox.projection_apply_campaigns SET due_at = statement_timestamp()"
    )
    fast = settings.replace(poll_interval=0.05)
    async with serving(Service(Worker(recording_app(fast), pool), ServiceConfig(dsn=dsn))):
        with anyio.fail_after(30):
            applied = await wait_applied(pool, "c", result.last_seq, timeout=60)
    assert (bool(applied), applied.state) == (True, "applied")
