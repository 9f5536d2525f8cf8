"""The outbox's own schema: nothing in `public`, functions that pin their path, objects planted
on a caller's path that hijack nothing, two installs in one database that never touch each
other, and the documented move of an older install out of `public`. (The whole suite runs
with the outbox in `outbox`, which no test connection's search_path names.)"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import pytest

import outbox
from helpers import ROOT, run_cli
from outbox import Event, Outbox, Settings, StoredEvent, db, sync
from outbox.queue.settle import work_channel
from outbox.schema import check_current, migrate
from outbox.worker.batch import Worker


def move_sql() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    found = re.search(
        r"```sql\n(-- move the outbox from public to its own schema\n.*?)```", text, re.S
    )
    assert found, "docs/operations.md lost its move block"
    return found.group(1)


async def test_nothing_of_the_outbox_is_in_public(pool: db.Pool) -> None:
    public = await pool.fetch(
        "SELECT 'table' AS kind, relname::text AS name FROM pg_class "
        "WHERE relnamespace = 'public'::regnamespace "
        "UNION ALL SELECT 'function', proname::text FROM pg_proc "
        "WHERE pronamespace = 'public'::regnamespace "
        "UNION ALL SELECT 'type', typname::text FROM pg_type "
        "WHERE typnamespace = 'public'::regnamespace"
    )
    assert [tuple(r) for r in public] == []
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'outbox'::regnamespace"
        )
        > 20
    )


async def test_every_function_pins_its_path_or_binds_its_names_when_created(pool: db.Pool) -> None:
    """A function either runs with `search_path = outbox, pg_temp`, or has a SQL-standard body,
    whose names PostgreSQL resolved when it was created."""
    functions = await pool.fetch(
        "SELECT proname, proconfig, prosqlbody IS NOT NULL AS bound FROM pg_proc "
        "WHERE pronamespace = 'outbox'::regnamespace ORDER BY proname"
    )
    assert len(functions) > 10
    loose = [
        f["proname"]
        for f in functions
        if not f["bound"] and "search_path=outbox, pg_temp" not in (f["proconfig"] or [])
    ]
    assert loose == []


# Objects of the outbox's names on a caller's search_path: a table in `public` for each of the
# append's and the worker's tables, functions the outbox calls, and a temporary table (first
# on any path for relations unless the path says otherwise).
DECOYS = """
CREATE TABLE public.event_journal (campaign_id text, seq bigint, event_type text, payload jsonb,
                                   metadata jsonb, recorded_at timestamptz, bucket integer);
CREATE TABLE public.campaign_heads (campaign_id text, last_seq bigint, bucket integer);
CREATE TABLE public.projection_apply_outbox (campaign_id text, seq bigint);
CREATE TABLE public.projection_apply_campaigns (campaign_id text);
CREATE TABLE public.projection_checkpoints (campaign_id text, projector text, applied_seq bigint);
CREATE FUNCTION public.outbox_bucket(text) RETURNS integer LANGUAGE sql RETURN 0;
CREATE FUNCTION public.outbox_fingerprint(jsonb) RETURNS bytea LANGUAGE sql RETURN '\\x00'::bytea;
CREATE FUNCTION public.outbox_lock_heads(integer, text[]) RETURNS TABLE (campaign_id text)
    LANGUAGE sql AS $$ SELECT NULL::text WHERE false $$;
CREATE FUNCTION public.jsonb_array_length(jsonb) RETURNS integer LANGUAGE sql RETURN 0;
"""


async def test_objects_planted_on_the_callers_path_hijack_nothing(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await pool.execute(DECOYS)
    async with pool.acquire() as conn:
        # A temporary table is searched before every schema for relations on this session.
        await conn.execute("CREATE TEMP TABLE event_journal (campaign_id text, seq bigint)")
        await outbox.append(
            conn, "c", [Event("t", {"n": 1})] * 2, idempotency_key="k", settings=settings
        )
        assert await conn.fetchval("SELECT count(*) FROM pg_temp.event_journal") == 0
    import psycopg

    with psycopg.connect(dsn) as blocking:
        sync.append(blocking, "c", [Event("t", {"n": 2})], settings=settings)
    app = Outbox(settings)
    seen: list[tuple[str, int]] = []

    @app.projector("counted", events=["t"])
    async def counted(tx: db.Connection, event: StoredEvent) -> None:
        seen.append((event.campaign_id, event.seq))

    await Worker(app, pool).drain()
    assert seen == [("c", 1), ("c", 2), ("c", 3)]
    for decoy in (
        "event_journal",
        "campaign_heads",
        "projection_apply_outbox",
        "projection_apply_campaigns",
        "projection_checkpoints",
    ):
        assert await pool.fetchval(f"SELECT count(*) FROM public.{decoy}") == 0, decoy
    assert await pool.fetchval("SELECT count(*) FROM outbox.event_journal") == 3
    assert await pool.fetchval("SELECT applied_seq FROM outbox.projection_checkpoints") == 3


@pytest.fixture
async def two_installs(fresh_db: str) -> AsyncIterator[db.Pool]:
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, schema="tenant_a", buckets=8)
        await migrate(conn, schema="tenant_b", buckets=16)
    finally:
        await conn.close()
    pool = await db.create_pool(fresh_db, max_size=10)
    try:
        yield pool
    finally:
        await pool.close()


async def test_two_installs_in_one_database_stay_independent(
    two_installs: db.Pool, fresh_db: str
) -> None:
    pool = two_installs
    apps, applied = {}, {}
    for schema in ("tenant_a", "tenant_b"):
        settings = Settings(dsn=fresh_db, schema=schema)
        app = Outbox(settings)
        tally: Counter[tuple[str, int]] = Counter()

        @app.projector("count", events=["t"])
        async def count(
            tx: db.Connection, event: StoredEvent, tally: Counter[tuple[str, int]] = tally
        ) -> None:
            tally[(event.campaign_id, event.seq)] += 1

        apps[schema], applied[schema] = app, tally
    for i in range(5):
        await apps["tenant_a"].append(pool, f"a-{i}", [Event("t", {})] * 2)
    for i in range(3):
        await apps["tenant_b"].append(pool, f"shared-{i}", [Event("t", {})])
    await apps["tenant_a"].append(pool, "shared-0", [Event("t", {})] * 4)

    assert (await outbox.drain_now(apps["tenant_a"], pool)).applied == 14
    assert applied["tenant_b"] == Counter()
    assert await pool.fetchval("SELECT count(*) FROM tenant_b.projection_apply_outbox") == 3
    assert (await outbox.drain_now(apps["tenant_b"], pool)).applied == 3
    assert set(applied["tenant_a"].values()) == set(applied["tenant_b"].values()) == {1}
    # One campaign id, two installs: two journals, each with its own seqs.
    assert sorted(k for k in applied["tenant_a"] if k[0] == "shared-0") == [
        ("shared-0", s) for s in range(1, 5)
    ]
    assert [k for k in applied["tenant_b"] if k[0] == "shared-0"] == [("shared-0", 1)]
    for schema, buckets in (("tenant_a", 8), ("tenant_b", 16)):
        assert await pool.fetchval(f"SELECT {schema}.outbox_bucket_count()") == buckets
    # Each install's report reads its own queue.
    report = run_cli(
        "maintenance", "outbox-report", "--json", dsn=fresh_db, env={"OUTBOX_SCHEMA": "tenant_b"}
    )
    assert report.returncode == 0, report.stderr
    assert '"total":0' in report.stdout.replace(" ", "")


async def test_an_install_wakes_only_its_own_workers(two_installs: db.Pool, fresh_db: str) -> None:
    """An append notifies its install's channel; the other install's workers hear nothing (a
    sentinel sent after it on their channel arrives first and alone)."""
    heard: list[tuple[str, str]] = []
    arrived = anyio.Event()

    def on(_c: object, _pid: int, channel: str, payload: object) -> None:
        heard.append((channel, str(payload)))
        if payload == "sentinel":
            arrived.set()

    listener = await db.connect(fresh_db)
    try:
        channels = {}
        for schema in ("tenant_a", "tenant_b"):
            with outbox.using_schema(schema):
                channels[schema] = work_channel()
            await listener.add_listener(channels[schema], on)
        await outbox.append(
            two_installs, "x", [Event("t", {})], settings=Settings(schema="tenant_a")
        )
        await two_installs.execute("SELECT pg_notify($1, 'sentinel')", channels["tenant_b"])
        with anyio.fail_after(10):
            await arrived.wait()
    finally:
        await listener.close()
    assert channels == {"tenant_a": "tenant_a.outbox_work", "tenant_b": "tenant_b.outbox_work"}
    with outbox.using_schema("tenant_a"):
        bucket = str(await two_installs.fetchval("SELECT tenant_a.outbox_bucket('x')"))
    assert heard == [("tenant_a.outbox_work", bucket), ("tenant_b.outbox_work", "sentinel")]


async def test_an_older_install_moves_out_of_public_as_documented(fresh_db: str) -> None:
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, schema="public")
        public = Settings(dsn=fresh_db, schema="public")
        await outbox.append(conn, "moved", [Event("t", {"n": 1})] * 3, settings=public)
        await conn.execute(move_sql())
        with pytest.raises(outbox.SchemaNotReady, match="out of date"):
            await check_current(conn)
        applied = await migrate(conn)
        assert applied
        assert all(name.endswith("_fn.sql") for name in applied)
        await check_current(conn)
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace"
        ) + await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
        )
        assert left == 0
    finally:
        await conn.close()
    app = Outbox(Settings(dsn=fresh_db))
    seen: list[int] = []

    @app.projector("count", events=["t"])
    async def count(tx: db.Connection, event: StoredEvent) -> None:
        seen.append(event.seq)

    pool = await db.create_pool(fresh_db)
    try:
        await outbox.append(pool, "moved", [Event("t", {"n": 2})], settings=app.settings)
        await outbox.drain_now(app, pool)
    finally:
        await pool.close()
    assert seen == [1, 2, 3, 4]
