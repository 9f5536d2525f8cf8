"""Buckets: the SQL function and its Python twin, the keys that lead with the bucket, the number
fixed at the first migration, the ring a worker's claims move over, and a drain across every
bucket checked against the generator's own counts. (An install from before buckets is brought
over by tests/integration/test_upgrade.py.)"""

from __future__ import annotations

from datetime import datetime

import asyncpg
import pytest

from helpers import campaigns_in_one_bucket, run_cli
from outbox import Event, Outbox, Settings, append, db
from outbox.buckets import DEFAULT_COUNT, SPAN, bucket_count, bucket_of, due_buckets
from outbox.buckets.distribution import PLAN
from outbox.buckets.ring import BucketRing
from outbox.errors import MigrationError, TransientBatchError
from outbox.model import EventBatch, StoredEvent
from outbox.queue.settle import notify_work
from outbox.schema import load_migrations, migrate, script
from outbox.worker.batch import Worker

# The tables keyed by bucket: the cluster plan's (one list of them).
CAMPAIGN_TABLES = tuple(p.table for p in PLAN if p.column == "bucket")


async def test_the_python_twin_computes_the_sql_bucket(pool: db.Pool) -> None:
    ids = ["a", "campaign-42", "ü-ß-漢字", "x" * 256, " spaced ", "0", "-1", "c-0", "c-1"]
    ids += [f"order-{i}" for i in range(500)]
    rows = await pool.fetch("SELECT c, outbox.outbox_bucket(c) AS b FROM unnest($1::text[]) c", ids)
    assert {r["c"]: r["b"] for r in rows} == {c: bucket_of(c, DEFAULT_COUNT) for c in ids}
    # Spread: 500 ids leave no bucket of 64 empty.
    assert len({bucket_of(f"order-{i}", DEFAULT_COUNT) for i in range(500)}) == DEFAULT_COUNT


async def test_every_campaign_key_leads_with_the_bucket_and_a_wrong_one_is_refused(
    pool: db.Pool,
) -> None:
    # The catalog's tables with both key columns are the plan's bucket-keyed ones, no more
    # (a partitioned table's partitions follow it).
    keyed = await pool.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND ("
        "SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid "
        "AND a.attname IN ('bucket', 'campaign_id') AND NOT a.attisdropped) = 2"
    )
    assert sorted(r["relname"] for r in keyed) == sorted(CAMPAIGN_TABLES)
    for table in CAMPAIGN_TABLES:
        key = await pool.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = $1::regclass AND contype = 'p'",
            f"outbox.{table}",
        )
        assert key.startswith("PRIMARY KEY (bucket, campaign_id"), (table, key)
    wrong = (bucket_of("c", DEFAULT_COUNT) + 1) % DEFAULT_COUNT
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload) "
            "VALUES ($1, 'c', 1, 't', '{}')",
            wrong,
        )


async def test_the_number_of_buckets_is_fixed_by_the_first_migration(fresh_db: str) -> None:
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, buckets=8)
        assert await bucket_count(conn) == 8
        await append(conn, "acct", [Event("t", {})])
        stored = await conn.fetchval(
            "SELECT bucket FROM outbox.event_journal WHERE campaign_id = 'acct'"
        )
        assert stored == bucket_of("acct", 8)
        assert await migrate(conn, buckets=8) == []  # the same number: nothing to do
        with pytest.raises(MigrationError, match="OUTBOX_BUCKETS is 16 but the schema was given 8"):
            await migrate(conn, buckets=16)
    finally:
        await conn.close()
    with pytest.raises(MigrationError, match="between 1 and 4096"):
        await _migrate_fresh(fresh_db, buckets=5000)


async def _migrate_fresh(dsn: str, *, buckets: int) -> None:
    conn = await db.connect(dsn)
    try:
        await conn.execute("DROP SCHEMA outbox CASCADE")
        try:
            await migrate(conn, buckets=buckets)
        except asyncpg.RaiseError as exc:
            raise MigrationError(str(exc)) from exc
    finally:
        await conn.close()


def test_the_schema_script_sets_the_number_of_buckets() -> None:
    assert "SET outbox.buckets = 16;" in script(load_migrations(), buckets=16)
    assert "SET outbox.buckets = 64;" in script(load_migrations())


async def test_the_ring_moves_over_due_buckets_and_follows_wakeups(
    pool: db.Pool, settings: Settings
) -> None:
    names = ["r-a", "r-b", "r-c", "r-d"]
    wanted = sorted({bucket_of(n, DEFAULT_COUNT) for n in names})
    for name in names:
        await append(pool, name, [Event("t", {})], settings=settings)
    assert sorted(b for b, due_in in await due_buckets(pool, rows=False) if due_in <= 0) == wanted
    ring = BucketRing(rows=False, poll_interval=3600, may_span=False)  # as on Citus
    taken = [await ring.take(pool) for _ in range(len(wanted) + 1)]
    assert taken == [*wanted, wanted[0]]  # round-robin, from the lowest
    for bucket in wanted:
        await ring.found(pool, bucket, more=False, empty=False)  # each batch took all it could
    assert not ring.due_now()
    ring.wake(str(wanted[-1]))  # an append's NOTIFY names its bucket
    assert ring.due_now()
    assert await ring.take(pool) == wanted[-1]
    await ring.found(pool, wanted[-1], more=False, empty=False)
    async with pool.acquire() as conn:
        await notify_work(conn)
    ring.wake("")  # a requeue's NOTIFY names none: read every bucket again
    assert await ring.take(pool) == wanted[0]


async def test_a_wake_up_is_claimed_once_and_a_batch_never_drops_a_later_one(
    pool: db.Pool, settings: Settings
) -> None:
    """A live ring (a service's loops): a wake-up that a later take covered sends no second
    loop to claim, nor to read the buckets (both would find the first claim's campaign); one
    that came after the take outlives the batch's report; between reads only news, reports
    and `expect` move it."""
    await append(pool, "w-a", [Event("t", {})], settings=settings)
    clock = [0.0]
    ring = BucketRing(rows=False, poll_interval=3600, clock=lambda: clock[0], live=True)
    reads: list[float] = []
    read = ring.refresh

    async def counted(executor: db.Executor, now: datetime | None = None) -> None:
        reads.append(clock[0])
        await read(executor, now)

    ring.refresh = counted  # type: ignore[method-assign]
    key = await ring.take(pool)  # the first read finds w-a due
    bucket = bucket_of("w-a", DEFAULT_COUNT)
    assert key == (SPAN if ring.span else bucket)  # one server: every bucket is one
    assert reads == [0.0]
    clock[0] = 1.0
    await ring.found(pool, key, more=False, empty=False)  # the batch took all it could
    assert not ring.due_now()

    clock[0] = 2.0
    ring.wake(str(bucket))  # an append's NOTIFY: loop A is rung, loop B takes first
    clock[0] = 3.0
    assert await ring.take_next(pool) == (key, True)  # B's claim serves it
    assert not ring.due_now()
    assert await ring.take(pool) is None  # A, rung for it: no claim, no read
    assert reads == [0.0]

    clock[0] = 4.0
    ring.wake(str(bucket))  # news after B's take, while B's batch runs
    clock[0] = 5.0
    await ring.found(pool, key, more=False, empty=False)  # B's report keeps it
    assert ring.due_now()
    assert await ring.take(pool) == key  # A claims it at once, without a read
    await ring.found(pool, key, more=False, empty=True)  # empty: a live ring does not read
    assert reads == [0.0]
    assert await ring.take(pool) is None

    ring.expect(2.0)  # an idle loop looked up a retry due at 7.0
    clock[0] = 6.0
    assert await ring.take(pool) is None
    assert reads == [0.0]
    clock[0] = 7.0
    assert await ring.take(pool) == key  # the read it owed finds w-a still due
    assert reads == [0.0, 7.0]


async def test_a_bucket_whose_batch_failed_waits_for_the_next_read(
    pool: db.Pool, settings: Settings
) -> None:
    """The batch after a failed one claims in another bucket (under Citus: the buckets of the
    nodes still up); the failed bucket comes back with the next read."""
    failing, other = (
        "drop-a",
        next(f"drop-{i}" for i in range(100) if bucket_of(f"drop-{i}", DEFAULT_COUNT) > 0),
    )
    if bucket_of(failing, DEFAULT_COUNT) > bucket_of(other, DEFAULT_COUNT):
        failing, other = other, failing  # the ring takes the lowest bucket first
    for name in (failing, other):
        await append(pool, name, [Event("t", {})], settings=settings)
    app = Outbox(settings)
    applied: list[str] = []
    lost_once = {failing}

    @app.projector("log", events=["t"])
    async def log(conn: db.Connection, event: StoredEvent) -> None:
        if event.campaign_id in lost_once:
            lost_once.discard(event.campaign_id)
            raise asyncpg.DeadlockDetectedError("a transient failure: the batch rolls back")
        applied.append(event.campaign_id)

    worker = Worker(app, pool)
    worker.ring.may_span = False  # a batch per bucket, as on Citus
    with pytest.raises(TransientBatchError):
        await worker.run_once()
    assert bucket_of(failing, DEFAULT_COUNT) not in worker.ring.due
    assert (await worker.run_once()).applied == 1
    assert applied == [other]
    await worker.drain()
    assert applied == [other, failing]


def _counting_app(
    settings: Settings, applied: dict[str, int], batched: dict[str, int] | None = None
) -> Outbox:
    """`count` (per event) into `applied`, and `count_batch` (a batch projector) into
    `batched` (a dict of its own when not given)."""
    app = Outbox(settings)
    into = {} if batched is None else batched

    @app.projector("count", events=["counted"])
    async def count(conn: db.Connection, event: StoredEvent) -> None:
        applied[event.campaign_id] = applied.get(event.campaign_id, 0) + 1

    @app.projector("count_batch", events=["counted"], batch=True)
    async def count_batch(conn: db.Connection, events: EventBatch) -> None:
        for campaign_id in events.campaign_ids:
            into[campaign_id] = into.get(campaign_id, 0) + 1

    return app


async def _spread_load(pool: db.Pool, settings: Settings) -> dict[str, int]:
    together = campaigns_in_one_bucket(3, "together")
    spread = [f"spread-{i}" for i in range(40)]
    expected: dict[str, int] = {}
    for name in [*together, *spread]:
        await append(pool, name, [Event("counted", {})] * 2, settings=settings)
        expected[name] = 2
    return expected


async def test_one_batch_claims_in_one_bucket_and_a_drain_covers_them_all(
    pool: db.Pool, settings: Settings
) -> None:
    """Citus's way (and a ring told not to span): a batch per bucket, the ring over them."""
    expected = await _spread_load(pool, settings)
    applied: dict[str, int] = {}
    worker = Worker(_counting_app(settings, applied), pool)
    worker.ring.may_span = False
    first = await worker.run_once()
    buckets_seen = {bucket_of(c, DEFAULT_COUNT) for c in applied}
    assert len(buckets_seen) == 1
    assert first.applied == sum(applied.values())
    await worker.drain()
    assert applied == expected


async def test_a_batch_on_one_server_claims_across_buckets(
    pool: db.Pool, settings: Settings, citus: object
) -> None:
    """On one server the first batch takes the campaigns due first in every bucket (S10): 43
    campaigns over many buckets in one batch, each campaign's rows, checkpoints and settle read
    in its own bucket; every event applied once by each projector."""
    if citus is not None:
        pytest.skip("on Citus a batch claims in one bucket, on its shard")
    expected = await _spread_load(pool, settings)
    applied: dict[str, int] = {}
    batched: dict[str, int] = {}
    worker = Worker(_counting_app(settings, applied, batched), pool)
    first = await worker.run_once()
    assert worker.ring.span
    assert len({bucket_of(c, DEFAULT_COUNT) for c in applied}) > 10
    assert first.claimed == sum(expected.values())  # all 86 rows: the batch holds 100
    await worker.drain()
    assert applied == expected
    assert batched == expected
    async with pool.acquire() as conn:
        left = await conn.fetchval(
            "SELECT (SELECT count(*) FROM outbox.projection_apply_outbox)"
            " + (SELECT count(*) FROM outbox.projection_apply_campaigns)"
        )
        moved = await conn.fetch(
            "SELECT campaign_id, projector, applied_seq FROM outbox.outbox_checkpoints_of("
            "-1, $1::text[])",
            list(expected),
        )
    assert left == 0
    assert {(r["campaign_id"], r["projector"]): r["applied_seq"] for r in moved} == {
        (c, p): 2 for c in expected for p in ("count", "count_batch")
    }


def test_distribute_on_plain_postgresql_is_a_one_line_refusal(dsn: str) -> None:
    result = run_cli("maintenance", "distribute", dsn=dsn)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "maintenance: error: not a Citus database: CREATE EXTENSION citus (on every node) and "
        "add the worker nodes first"
    ]
    result = run_cli("maintenance", "distribute", "--shard-count", "0", dsn=dsn)
    assert result.returncode == 2
    assert "--shard-count" in result.stderr
