"""Issue 9 in process, against a real PostgreSQL: connection loss is transient everywhere, a
poison event fails its own row, appends say "outcome unknown", session timeouts are settings.

Faults are real: backends terminated with pg_terminate_backend, a session the server ends
for idling in a transaction, jsonb no float can hold. Waits are bounded waits on database or
service state, never sleeps that hope something happened.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager
from functools import partial

import anyio
import asyncpg
import pytest

from helpers import login_role, queue_campaigns, wait_for
from outbox import AppendOutcomeUnknown, Event, Settings, append, db
from outbox.db import connection_lost
from outbox.errors import EventUnavailable, TransientBatchError
from outbox.model import StoredEvent
from outbox.ops.report import outbox_report
from outbox.projection.app import Outbox
from outbox.retry import ErrorClass, classify
from outbox.worker.batch import Worker
from outbox.worker.runtime import drain_now, open_pool
from outbox.worker.service import Service, ServiceConfig


class Records(logging.Handler):
    """Every record of the `outbox` loggers, for assertions on what was logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("outbox")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def counting_app(settings: Settings) -> Outbox:
    """An unguarded projector writing one row per application: exactly-once rests on the
    queue alone, and the `applied` table is the oracle's evidence."""
    app = Outbox(settings)

    @app.projector("counted", events=["tick"], ordered=False)
    async def counted(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
        )

    return app


async def applied(pool: db.Pool) -> list[tuple[str, int]]:
    rows = await pool.fetch("SELECT campaign_id, seq FROM applied ORDER BY id")
    return [(r["campaign_id"], r["seq"]) for r in rows]


async def queue_rows(pool: db.Pool) -> dict[tuple[str, int], tuple[str, int, str | None]]:
    rows = await pool.fetch(
        "SELECT campaign_id, seq, status, attempt_count, last_error FROM "
        "outbox.projection_apply_outbox"
    )
    return {
        (r["campaign_id"], r["seq"]): (r["status"], r["attempt_count"], r["last_error"])
        for r in rows
    }


@pytest.fixture
async def applied_table(pool: db.Pool) -> None:
    await pool.execute(
        "CREATE TABLE applied (id bigserial PRIMARY KEY, campaign_id text NOT NULL, "
        "seq bigint NOT NULL)"
    )


async def terminate(pool: db.Pool, where: str) -> int:
    """Terminate the backends of this database matching `where`; how many."""
    n: int = await pool.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE datname = current_database() AND pid <> pg_backend_pid() AND ({where})"
    )
    return n


# --- item 1: classification ---------------------------------------------------------------


def test_internal_client_error_is_a_lost_connection_and_data_errors_are_not() -> None:
    stuck = asyncpg.InternalClientError(
        "cannot switch to state 15; another operation (2) is in progress"
    )
    assert connection_lost(stuck)
    assert classify(stuck) is ErrorClass.TRANSIENT
    bad_argument = asyncpg.exceptions.DataError("invalid input for query argument $1")
    assert not connection_lost(bad_argument)
    assert classify(bad_argument) is ErrorClass.FAILURE  # a projector's bug consumes attempts
    assert connection_lost(asyncpg.ConnectionDoesNotExistError("gone"))
    assert classify(asyncpg.exceptions.AdminShutdownError("bye")) is ErrorClass.TRANSIENT


# --- item 1: the batch, the pool and the loops ----------------------------------------------


@pytest.mark.usefixtures("applied_table")
async def test_a_backend_killed_mid_statement_discards_the_connection_and_loses_nothing(
    pool: db.Pool, settings: Settings, records: Records
) -> None:
    app = Outbox(settings)
    killed = False

    @app.projector("slow", events=["tick"], ordered=False)
    async def slow(tx: db.Connection, event: StoredEvent) -> None:
        nonlocal killed
        if not killed:
            killed = True
            pid = await tx.fetchval("SELECT pg_backend_pid()")
            async with anyio.create_task_group() as tg:
                # The statement is in flight when its backend dies: asyncpg's protocol is
                # mid-operation, the case that made releasing the connection raise (#784).
                tg.start_soon(tx.execute, "SELECT pg_sleep(30)")
                await wait_for(lambda: _active(pool, pid))
                await pool.execute("SELECT pg_terminate_backend($1)", pid)
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
        )

    await append(pool, "c", [Event("tick", {}), Event("tick", {})], settings=settings)
    worker = Worker(app, pool)
    with pytest.raises(TransientBatchError) as info:
        await worker.run_once()
    assert info.value.connection_lost
    assert await queue_rows(pool) == {
        ("c", 1): ("pending", 0, None),
        ("c", 2): ("pending", 0, None),
    }
    # The pool gave the dead connection up: the next batches run on fresh ones.
    assert (await worker.drain()).applied == 2
    assert await applied(pool) == [("c", 1), ("c", 2)]
    assert "apply.failed" not in records.events()


async def _active(pool: db.Pool, pid: int) -> bool:
    state = await pool.fetchval("SELECT state FROM pg_stat_activity WHERE pid = $1", pid)
    return bool(state == "active")


@asynccontextmanager
async def running(service: Service) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        await tg.start(partial(service.run, shutdown_timeout=5))
        yield
        service.stop()


@pytest.mark.usefixtures("applied_table")
async def test_the_service_rides_out_every_connection_dying_at_once(
    pool: db.Pool, dsn: str, records: Records
) -> None:
    settings = Settings(dsn=dsn, poll_interval=0.05)
    app = counting_app(settings)
    worker_pool = await open_pool(settings, max_size=4)
    try:
        service = Service(Worker(app, worker_pool), ServiceConfig(dsn=dsn, concurrency=2))
        async with running(service):
            await append(pool, "a", [Event("tick", {})] * 3, settings=settings)
            await wait_for(lambda: _queue_empty(pool))
            killed: set[int] = set()
            for _ in range(3):  # a failover: every worker session, the listener too
                await wait_for(partial(_listening, pool, killed))
                pids = await terminated(pool, "application_name LIKE 'outbox-%'")
                assert pids - killed
                killed.update(pids)
            await append(pool, "b", [Event("tick", {})] * 3, settings=settings)
            await wait_for(lambda: _queue_empty(pool))
            await wait_for(lambda: _listening(pool))
    finally:
        await worker_pool.close()
    assert sorted(await applied(pool)) == [
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 1),
        ("b", 2),
        ("b", 3),
    ]
    events = records.events()
    assert events.count("database.lost") == events.count("database.restored")
    assert events.count("database.lost") <= 3
    assert "batch.error" not in events


@pytest.mark.usefixtures("applied_table")
async def test_sessions_that_turn_read_only_are_replaced_until_one_can_write(
    pool: db.Pool, dsn: str, records: Records
) -> None:
    """What a worker meets when a failover leaves its reconnects on a server that cannot write
    (SQLSTATE 25006, as on a standby): each such session is discarded, the claim loops back
    off (`database.lost`, no `batch.error`), no attempt is consumed, and the first writable
    session applies. (A read-only session can serve a claim that finds nothing due, so the link
    may be restored and lost again before the role changes back: the lines come in pairs.)"""
    async with login_role(pool, dsn) as (role, as_role):
        settings = Settings(dsn=as_role, poll_interval=0.05)
        app = counting_app(settings)
        worker_pool = await open_pool(settings, max_size=3)
        try:
            service = Service(Worker(app, worker_pool), ServiceConfig(dsn=as_role, concurrency=2))
            async with running(service):
                await append(pool, "a", [Event("tick", {})], settings=settings)
                await wait_for(lambda: _queue_empty(pool))
                await pool.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
                await terminated(pool, f"usename = '{role}'")  # its reconnects are read-only
                await append(pool, "b", [Event("tick", {})] * 2, settings=settings)

                async def refused() -> bool:  # a claim met a session that cannot write
                    return any(
                        "read-only transaction" in str(r.__dict__.get("error", ""))
                        for r in records.records
                    )

                await wait_for(refused)
                assert await queue_rows(pool) == {
                    ("b", 1): ("pending", 0, None),
                    ("b", 2): ("pending", 0, None),
                }
                await pool.execute(f"ALTER ROLE {role} RESET default_transaction_read_only")
                await wait_for(lambda: _queue_empty(pool))
        finally:
            await worker_pool.close()
    assert sorted(await applied(pool)) == [("a", 1), ("b", 1), ("b", 2)]
    events = records.events()
    assert events.count("database.lost") >= 1
    assert events.count("database.lost") == events.count("database.restored")
    assert "batch.error" not in events


async def _queue_empty(pool: db.Pool) -> bool:
    return bool(await pool.fetchval("SELECT count(*) = 0 FROM outbox.projection_apply_outbox"))


async def _listening(pool: db.Pool, killed: Collection[int] = ()) -> bool:
    """A listener backend is up, other than those already terminated (a terminated backend
    stays in pg_stat_activity for a moment while it exits)."""
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-listener' "
            "AND datname = current_database() AND pid <> ALL ($1::int[])",
            list(killed),
        )
    )


async def terminated(pool: db.Pool, where: str) -> set[int]:
    """Terminate the backends of this database matching `where`; their pids."""
    rows = await pool.fetch(
        "WITH target AS MATERIALIZED (SELECT pid FROM pg_stat_activity "
        f"WHERE datname = current_database() AND pid <> pg_backend_pid() AND ({where})) "
        "SELECT pid FROM target WHERE pg_terminate_backend(pid)"
    )
    return {r["pid"] for r in rows}


async def test_a_listener_killed_twice_in_quick_succession_comes_back(
    pool: db.Pool, dsn: str, records: Records
) -> None:
    settings = Settings(dsn=dsn)
    service = Service(Worker(Outbox(settings), pool), ServiceConfig(dsn=dsn))
    async with running(service):
        killed: set[int] = set()
        for _ in range(4):
            await wait_for(partial(_listening, pool, killed))
            killed.update(await terminated(pool, "application_name = 'outbox-listener'"))
            # At once again: the new connection may be mid-LISTEN (the case that ended it).
            killed.update(await terminated(pool, "application_name = 'outbox-listener'"))
        await wait_for(partial(_listening, pool, killed))
        with anyio.fail_after(30):
            await service.wait_listening()
    assert records.events().count("listener.lost") >= 4


@pytest.mark.usefixtures("applied_table")
async def test_drain_rides_out_a_lost_connection(pool: db.Pool, dsn: str) -> None:
    settings = Settings(dsn=dsn, batch_size=5)
    app = Outbox(settings)
    kills = 0

    @app.projector("fragile", events=["tick"], ordered=False)
    async def fragile(tx: db.Connection, event: StoredEvent) -> None:
        nonlocal kills
        if event.seq % 4 == 0 and kills < 3:
            kills += 1
            await pool.execute(
                "SELECT pg_terminate_backend($1)", await tx.fetchval("SELECT pg_backend_pid()")
            )
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
        )

    await append(pool, "c", [Event("tick", {})] * 12, settings=settings)
    totals = await drain_now(app, pool, concurrency=2)
    assert kills == 3
    assert totals.applied == 12
    assert await applied(pool) == [("c", seq) for seq in range(1, 13)]


# --- item 2 and item 6: a frozen worker, session timeouts -----------------------------------


@pytest.mark.usefixtures("applied_table")
async def test_a_worker_frozen_past_its_idle_timeout_rolls_back_without_an_attempt(
    pool: db.Pool, dsn: str, records: Records
) -> None:
    settings = Settings(dsn=dsn, idle_in_transaction_timeout=0.2)
    app = Outbox(settings)
    frozen = anyio.Event()
    thawed = anyio.Event()

    @app.projector("freezer", events=["tick"], ordered=False)
    async def freezer(tx: db.Connection, event: StoredEvent) -> None:
        if not thawed.is_set():
            frozen.set()
            await thawed.wait()  # idle in the batch's transaction: the server ends the session
        await tx.execute(
            "INSERT INTO applied (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
        )

    await append(pool, "c", [Event("tick", {})], settings=settings)
    worker_pool = await open_pool(settings, max_size=2)
    try:
        worker = Worker(app, worker_pool)
        async with anyio.create_task_group() as tg:
            outcome: list[BaseException] = []

            async def batch() -> None:
                try:
                    await worker.run_once()
                except TransientBatchError as exc:
                    outcome.append(exc)

            tg.start_soon(batch)
            await frozen.wait()
            await wait_for(lambda: _no_worker_sessions(pool))  # the server ended it
            thawed.set()
        assert len(outcome) == 1
        assert await queue_rows(pool) == {("c", 1): ("pending", 0, None)}
        assert (await worker.drain()).applied == 1
    finally:
        await worker_pool.close()
    assert await applied(pool) == [("c", 1)]
    assert "apply.failed" not in records.events()


async def _no_worker_sessions(pool: db.Pool) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'outbox-worker' "
            "AND datname = current_database() AND state = 'idle in transaction'"
        )
    )


async def _session_values(settings: Settings) -> tuple[str, str, str]:
    worker_pool = await open_pool(settings, max_size=1)
    try:
        # Twice on the pool's one connection: the values must outlast a release (the pool's
        # reset once dropped the defaults after the first batch).
        values = []
        for _ in range(2):
            row = await worker_pool.fetchrow(
                "SELECT current_setting('statement_timeout') AS s, "
                "current_setting('lock_timeout') AS l, "
                "current_setting('idle_in_transaction_session_timeout') AS i"
            )
            assert row is not None
            values.append((row["s"], row["l"], row["i"]))
        assert values[0] == values[1]
        return values[0]
    finally:
        await worker_pool.close()


async def test_session_timeouts_default_explicit_and_the_servers_own_values(
    pool: db.Pool, dsn: str
) -> None:
    # Nothing set anywhere: the documented defaults.
    assert await _session_values(Settings(dsn=dsn)) == ("30s", "5s", "1min")
    # The operator's ALTER DATABASE ... SET and the DSN's own option beat the defaults.
    database = await pool.fetchval("SELECT current_database()")
    await pool.execute(f"ALTER DATABASE \"{database}\" SET statement_timeout = '7s'")
    with_option = dsn + ("&" if "?" in dsn else "?") + "lock_timeout=3000"
    assert await _session_values(Settings(dsn=with_option)) == ("7s", "3s", "1min")
    # An explicit OUTBOX_* value beats everything.
    explicit = Settings.from_env(
        {
            "OUTBOX_DSN": with_option,
            "OUTBOX_STATEMENT_TIMEOUT": "12",
            "OUTBOX_LOCK_TIMEOUT": "0.5",
            "OUTBOX_IDLE_IN_TRANSACTION_TIMEOUT": "0",
        }
    )
    assert await _session_values(explicit) == ("12s", "500ms", "0")


# --- item 4: poison rows --------------------------------------------------------------------

POISON = """
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
VALUES (outbox.outbox_bucket('poison'), 'poison', 1, 'tick', '{"v": 1e400}'::jsonb),
       (outbox.outbox_bucket('poison'), 'poison', 2, 'tick', '{}'::jsonb);
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT bucket, campaign_id, seq, event_type FROM outbox.event_journal WHERE campaign_id = 'poison';
"""


@pytest.mark.usefixtures("applied_table")
@pytest.mark.parametrize("policy", ["block", "park"])
async def test_an_undecodable_payload_fails_its_row_alone(
    pool: db.Pool, dsn: str, policy: str
) -> None:
    settings = Settings(dsn=dsn, dead_policy=policy, max_attempts=1)  # type: ignore[arg-type]
    app = counting_app(settings)
    await append(pool, "good", [Event("tick", {})] * 3, settings=settings)
    await pool.execute(POISON)
    await queue_campaigns(pool)
    await append(pool, "later", [Event("tick", {})], settings=settings)
    counts = await Worker(app, pool).drain()
    assert counts.dead == 1
    rows = await queue_rows(pool)
    status, attempts, error = rows[("poison", 1)]
    assert (status, attempts) == ("dead", 1)
    assert error is not None
    assert error.startswith("EventUnavailable: journal event 'poison' seq 1 cannot be decoded")
    expected = [("good", 1), ("good", 2), ("good", 3), ("later", 1)]
    if policy == "park":
        expected.append(("poison", 2))  # the dead head steps aside
        assert set(rows) == {("poison", 1)}
    else:
        assert rows[("poison", 2)] == ("pending", 0, None)  # behind its head, untouched
    assert sorted(await applied(pool)) == sorted(expected)
    report = await outbox_report(pool, status="dead")
    assert [(r.campaign_id, r.seq) for r in report.rows] == [("poison", 1)]
    assert "cannot be decoded" in (report.rows[0].last_error or "")


async def test_a_poison_row_never_stops_a_running_service(
    pool: db.Pool, dsn: str, records: Records
) -> None:
    await pool.execute(
        "CREATE TABLE applied (id bigserial PRIMARY KEY, campaign_id text NOT NULL, "
        "seq bigint NOT NULL)"
    )
    settings = Settings(dsn=dsn, poll_interval=0.05)
    await pool.execute(POISON)
    service = Service(Worker(counting_app(settings), pool), ServiceConfig(dsn=dsn))
    async with running(service):
        await append(pool, "good", [Event("tick", {})] * 2, settings=settings)
        await wait_for(lambda: _applied_count(pool, 2))
    assert sorted(await applied(pool)) == [("good", 1), ("good", 2)]
    assert "batch.error" not in records.events()


async def _applied_count(pool: db.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM applied") == n)


def test_decode_event_names_the_event() -> None:
    from datetime import UTC, datetime

    from outbox.append.journal import decode_event

    with pytest.raises(EventUnavailable, match="'c' seq 4 cannot be decoded"):
        decode_event("c", 4, "t", '{"v": 1e400}', "{}", datetime.now(UTC))
    with pytest.raises(EventUnavailable, match="metadata is not a JSON object"):
        decode_event("c", 4, "t", "{}", "[1]", datetime.now(UTC))


# --- item 5: appends ------------------------------------------------------------------------


async def test_an_append_on_a_dead_connection_is_outcome_unknown_and_a_keyed_retry_appends_once(
    pool: db.Pool, settings: Settings
) -> None:
    async with pool.acquire() as conn:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        await pool.execute("SELECT pg_terminate_backend($1)", pid)
        await wait_for(lambda: _gone(pool, pid))
        with pytest.raises(AppendOutcomeUnknown, match="retry with the same idempotency key"):
            await append(conn, "c", [Event("tick", {})], idempotency_key="k1", settings=settings)
    # Every idle connection of the pool dies (a restart): the pool's own append fails the same
    # way, and the retry with the key appends exactly once.
    await terminate(pool, "true")
    outcomes: list[str] = []
    for _ in range(3):
        try:
            result = await append(
                pool, "c", [Event("tick", {})], idempotency_key="k2", settings=settings
            )
        except AppendOutcomeUnknown:
            outcomes.append("unknown")
            continue
        outcomes.append("duplicate" if result.duplicate else "appended")
    assert outcomes.count("appended") == 1
    assert await pool.fetchval("SELECT count(*) FROM outbox.event_journal") == 1


async def _gone(pool: db.Pool, pid: int) -> bool:
    return bool(
        await pool.fetchval("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1", pid)
    )


async def test_an_inline_append_on_a_dead_connection_is_outcome_unknown(
    pool: db.Pool, dsn: str
) -> None:
    settings = Settings(dsn=dsn, inline_apply=True)
    app = Outbox(settings)
    app.ignore(["tick"])
    async with pool.acquire() as conn:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        await pool.execute("SELECT pg_terminate_backend($1)", pid)
        await wait_for(lambda: _gone(pool, pid))
        with pytest.raises(AppendOutcomeUnknown):
            await app.append(conn, "c", [Event("tick", {})])
