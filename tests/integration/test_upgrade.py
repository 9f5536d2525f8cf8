"""From 0.1.0 to this release: an install of 0.1.0 holding data, upgraded in place by
`maintenance migrate`, keeps every row and reaches the catalog a fresh install has, which is
`sql/schema.sql`; a worker then drains what 0.1.0 left, exactly once, against the test's own
record of what it appended.

0.1.0 shipped migrations 0001-0003 (tests/unit/test_sql_home.py pins their checksums). Its
install lives in the schema its migrator's search_path named first: `public`. The data is
written by 0.1.0's own statements (its runner's bookkeeping and its append, from
outbox/sql/migrate.sql and outbox/sql/journal.sql at the release, commit eb3d513), then aged
the way its workers and operators left rows: failed, dead, checkpointed, marked, audited.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest
from schema_snapshot import SNAPSHOT, body, dump, dump_major, pg_dump, snapshot_major

import outbox
from helpers import TABLES_0_1_0, run_cli
from outbox import Event, MigrationError, Outbox, SchemaNotReady, Settings, StoredEvent, db
from outbox.schema import check_current, load_migrations, migrate
from outbox.worker.batch import Worker

RELEASED = [m for m in load_migrations() if m.name < "0004"]

# 0.1.0's migrator: its bookkeeping table, then each file and the row that records it.
BOOKKEEPING_0_1_0 = """
CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
RECORD_0_1_0 = "INSERT INTO outbox_schema_migrations (name, checksum) VALUES ($1::text, $2::text)"

# 0.1.0's keyed append takes its key first, then appends (journal.sql: claim_append_key,
# append_events). The work rows' trigger (0003) queues the campaign.
CLAIM_KEY_0_1_0 = """
INSERT INTO append_idempotency_keys AS k (campaign_id, idem_key, expires_at)
VALUES ($1::text, $2::text, clock_timestamp() + make_interval(secs => $3::double precision))
ON CONFLICT (campaign_id, idem_key) DO UPDATE
    SET first_seq = NULL, last_seq = NULL, created_at = clock_timestamp(),
        expires_at = excluded.expires_at
    WHERE k.expires_at <= clock_timestamp()
RETURNING true AS claimed
"""
APPEND_0_1_0 = """
WITH moved AS (
    UPDATE campaign_heads AS h
    SET last_seq = h.last_seq + cardinality($2::text[]), updated_at = clock_timestamp()
    WHERE $5::bigint > 0 AND h.campaign_id = $1::text AND h.last_seq = $5::bigint
    RETURNING h.last_seq
), created AS (
    INSERT INTO campaign_heads AS h (campaign_id, last_seq)
    SELECT $1::text, cardinality($2::text[])
    WHERE $5::bigint IS NULL OR $5::bigint = 0
    ON CONFLICT (campaign_id) DO UPDATE
        SET last_seq = h.last_seq + excluded.last_seq, updated_at = clock_timestamp()
        WHERE $5::bigint IS NULL
    RETURNING h.last_seq
), head AS (
    SELECT last_seq FROM moved UNION ALL SELECT last_seq FROM created
), journal AS (
    INSERT INTO event_journal (campaign_id, seq, event_type, payload, metadata)
    SELECT $1::text, head.last_seq - cardinality($2::text[]) + e.ord,
           e.event_type, e.payload::jsonb, e.metadata::jsonb
    FROM head, unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY
        AS e(event_type, payload, metadata, ord)
    RETURNING campaign_id, seq, event_type
), work AS (
    INSERT INTO projection_apply_outbox (campaign_id, seq, event_type)
    SELECT campaign_id, seq, event_type FROM journal WHERE $6::boolean
), idem AS (
    UPDATE append_idempotency_keys AS k
    SET first_seq = head.last_seq - cardinality($2::text[]) + 1, last_seq = head.last_seq
    FROM head
    WHERE k.campaign_id = $1::text AND k.idem_key = $7::text
)
SELECT head.last_seq FROM head
"""
# What 0.1.0's workers, operators and consumers left beside the appends.
AGED_0_1_0 = """
UPDATE projection_apply_outbox SET status = 'dead', attempt_count = 8,
    last_error = 'projector ''roster'': ValueError: bad', updated_at = clock_timestamp()
WHERE campaign_id = 'camp-3' AND seq = 2;
UPDATE projection_apply_outbox SET status = 'failed', attempt_count = 2,
    last_error = 'projector ''roster'': TimeoutError: slow',
    next_attempt_at = clock_timestamp() - interval '1 minute'
WHERE campaign_id = 'camp-4' AND seq = 1;
DELETE FROM projection_apply_outbox WHERE campaign_id = 'camp-0' AND seq <= 2;
INSERT INTO projection_checkpoints (campaign_id, projector, applied_seq)
VALUES ('camp-0', 'roster', 2);
INSERT INTO processed_markers (campaign_id, seq, handler)
VALUES ('camp-0', 1, 'dice'), ('camp-0', 2, 'dice');
INSERT INTO consumer_claims (scope, event_id, bucket, event_time)
VALUES ('billing', 'msg-1', date '2026-11-23', timestamptz '2026-11-23 10:00+00');
INSERT INTO outbox_workers (worker_id, host, pid, mode) VALUES ('w-0.1.0', 'old-host', 7, 'apply');
INSERT INTO outbox_requeue_audit (campaign_id, seq, actor, reason, previous_status,
                                  previous_attempt_count)
VALUES ('camp-3', 1, 'ops', 'fixed the projector', 'dead', 8);
"""


async def install_0_1_0(conn: db.Connection) -> dict[str, list[int]]:
    """An install of 0.1.0 in `public`, with data; returns the seqs appended per campaign."""
    await conn.execute(BOOKKEEPING_0_1_0)
    for m in RELEASED:
        async with conn.transaction():
            await conn.execute(m.sql)
            await conn.execute(RECORD_0_1_0, m.name, m.checksum)
    appended: dict[str, list[int]] = {}
    for i in range(6):
        campaign = f"camp-{i}"
        for n in range(2):  # two appends of two events each, the second one keyed
            types = ["character.joined", "dice.rolled"]
            payloads = [orjson.dumps({"n": n, "i": i}).decode()] * 2
            metadata = ["{}"] * 2
            key = f"req-{i}-{n}" if n == 1 else None
            if key is not None:
                assert await conn.fetchval(CLAIM_KEY_0_1_0, campaign, key, 86400.0)
            head = await conn.fetchval(
                APPEND_0_1_0, campaign, types, payloads, metadata, None, True, key
            )
            appended.setdefault(campaign, []).extend([head - 1, head])
    await conn.execute(AGED_0_1_0)
    return appended


async def _rows(conn: db.Connection, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of 0.1.0's tables, in key order, as 0.1.0's columns hold it."""
    found = {}
    for table in TABLES_0_1_0:
        # The campaign queue's due time and blocked flag are its bookkeeping: 0006 makes a
        # campaign that a projector's dead row blocked due for its other projectors (S24);
        # its slot (0008) is where it is kept (S26). A head's `updated_at` is when its last
        # event was recorded since 0010 (S28), not when the head row was last written.
        queue = {
            "projection_apply_campaigns": ["due_at", "blocked", "updated_at"],
            "campaign_heads": ["updated_at"],
        }.get(table, [])
        columns = await conn.fetchval(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
            "WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attname NOT IN ('bucket', 'fingerprint', 'source_topic', 'source_partition', "
            "'source_offset', 'lease_owner', 'claim_epoch', 'leased_at', 'lease_expires_at', "
            "'action', 'projector', 'projectors', 'slot', 'version') "
            "AND NOT attname = ANY ($2::text[])",
            f"{schema}.{table}",
            queue,
        )
        order = ", ".join(str(i + 1) for i in range(min(3, columns.count(",") + 1)))
        rows = await conn.fetch(f"SELECT {columns} FROM {schema}.{table} ORDER BY {order}")
        found[table] = [tuple(r) for r in rows]
    return found


@pytest.fixture
async def old_install(fresh_db: str) -> dict[str, Any]:
    conn = await db.connect(fresh_db)
    try:
        appended = await install_0_1_0(conn)
        before = await _rows(conn, "public")
    finally:
        await conn.close()
    return {"dsn": fresh_db, "appended": appended, "rows": before}


async def test_an_upgrade_keeps_every_row_and_reaches_the_fresh_catalog(
    old_install: dict[str, Any], fresh_db: str
) -> None:
    dsn = old_install["dsn"]
    conn = await db.connect(dsn)
    try:
        applied = await migrate(conn, schema="public")
        assert applied[0] == "0004_buckets_leases_operators.sql"
        assert await _rows(conn, "public") == old_install["rows"]
        wrong = await conn.fetchval(
            "SELECT count(*) FROM public.projection_apply_outbox "
            "WHERE bucket <> public.outbox_bucket(campaign_id)"
        )
        assert wrong == 0
        # Every event journaled before versions existed is version 1 (issue 62).
        versions = await conn.fetch("SELECT DISTINCT version FROM public.event_journal")
        assert [r["version"] for r in versions] == [1]
        action = await conn.fetchval("SELECT action FROM public.outbox_requeue_audit")
        assert action == "requeue"
        assert await migrate(conn, schema="public") == []
        with outbox.using_schema("public"):
            await check_current(conn)
        # Nothing of the outbox is created in the default schema by the upgrade.
        assert await conn.fetchval("SELECT to_regnamespace('outbox')") is None
    finally:
        await conn.close()
    binary = pg_dump()
    if binary is None or dump_major(binary) != snapshot_major():
        pytest.skip("sql/schema.sql was dumped by another pg_dump major version")
    assert dump(dsn, "public") == body(SNAPSHOT.read_text())


async def test_a_fresh_install_is_what_sql_schema_sql_describes(dsn: str) -> None:
    binary = pg_dump()
    if binary is None or dump_major(binary) != snapshot_major():
        pytest.skip("sql/schema.sql was dumped by another pg_dump major version")
    assert dump(dsn) == body(SNAPSHOT.read_text()), "sql/schema.sql is stale: run `make schema`"


async def test_after_the_upgrade_a_worker_drains_what_0_1_0_left_exactly_once(
    old_install: dict[str, Any],
) -> None:
    dsn = old_install["dsn"]
    settings = Settings(dsn=dsn, schema="public")
    conn = await db.connect(dsn)
    try:
        await migrate(conn, schema="public")
    finally:
        await conn.close()
    app = Outbox(settings)
    roster: Counter[tuple[str, int]] = Counter()
    dice: Counter[tuple[str, int]] = Counter()

    @app.projector("roster", events=["character.joined"])
    async def on_joined(tx: db.Connection, event: StoredEvent) -> None:
        roster[(event.campaign_id, event.seq)] += 1

    @app.projector("dice", events=["dice.rolled"], ordered=False, idempotent=True)
    async def on_rolled(tx: db.Connection, event: StoredEvent) -> None:
        dice[(event.campaign_id, event.seq)] += 1

    pool = await db.create_pool(dsn)
    try:
        with outbox.using_schema("public"):
            await Worker(app, pool).drain()
        # The oracle: what install_0_1_0 appended (odd seqs joined, even rolled), less what
        # 0.1.0 had applied (camp-0 up to seq 2), the dead row (camp-3 seq 2: now a dead hold
        # of `roster`, the projector its error names) and `roster`'s event after it (camp-3
        # seq 3, in that hold), applied once each: `dice` goes on (S24).
        appended = old_install["appended"]
        expected = {
            (c, s)
            for c, seqs in appended.items()
            for s in seqs
            if not (c == "camp-0" and s <= 2) and not (c == "camp-3" and s in (2, 3))
        }
        assert set(roster) | set(dice) == expected
        assert set(roster.values()) | set(dice.values()) == {1}
        left = await pool.fetch(
            "SELECT campaign_id, seq, status FROM public.projection_apply_outbox ORDER BY 1, 2"
        )
        assert [tuple(r) for r in left] == [("camp-3", 2, "dead")]
        holds = await pool.fetch(
            "SELECT campaign_id, projector, seq, status FROM public.projection_holds"
        )
        assert [tuple(r) for r in holds] == [("camp-3", "roster", 2, "dead")]
        # A retry of a keyed 0.1.0 append is still answered with the first result (0.1.0 kept
        # no fingerprint: the key is honoured as before until it expires).
        again = await outbox.append(
            pool,
            "camp-5",
            [Event("character.joined", {"n": 9}), Event("dice.rolled", {"n": 9})],
            idempotency_key="req-5-1",
            settings=settings,
        )
        assert (again.first_seq, again.last_seq, again.duplicate) == (3, 4, True)
    finally:
        await pool.close()


async def test_the_default_schema_is_refused_where_an_older_install_lives(
    old_install: dict[str, Any],
) -> None:
    """A migrate without OUTBOX_SCHEMA does not start a second install beside 0.1.0's: it says
    where the install is, in one line, and writes nothing; workers say the same."""
    dsn = old_install["dsn"]
    result = run_cli("maintenance", "migrate", dsn=dsn)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "maintenance: error: the outbox is not installed in schema 'outbox', but this database "
        "has an install in public: set OUTBOX_SCHEMA=public to use it (docs/operations.md, "
        "'The schema')"
    ]
    conn = await db.connect(dsn)
    try:
        assert await conn.fetchval("SELECT to_regnamespace('outbox')") is None
        with pytest.raises(MigrationError, match="OUTBOX_SCHEMA=public"):
            await migrate(conn)
        with pytest.raises(SchemaNotReady, match="OUTBOX_SCHEMA=public"):
            await check_current(conn)
    finally:
        await conn.close()
    upgraded = run_cli("maintenance", "migrate", dsn=dsn, env={"OUTBOX_SCHEMA": "public"})
    assert upgraded.returncode == 0, upgraded.stderr
    assert "applied 0004_buckets_leases_operators.sql" in upgraded.stdout
