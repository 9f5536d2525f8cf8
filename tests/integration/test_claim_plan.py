"""EXPLAIN guard (S6, docs/semantics.md): a claim never visits rows it cannot take.

Three backlogs of >= 100k work rows, each with a few claimable campaigns among them:
- `dead_and_not_due`: 100k dead rows and 100k rows not due yet, in their own campaigns;
- `blocked_heads`: half the campaigns have a dead head, the other half a head not due yet, and
  due rows queued behind every one of them;
- `hot_campaigns`: every due row in 10 campaigns of 10k rows each.
Neither claim may scan the work rows or the journal, whatever plan cache mode the session
uses (custom and generic plans are both forced and checked; a custom plan's scan of a slot
empty when it was made reads no block, and is allowed); the ordered claim's statements run
inside `outbox_claim`, so the plans checked are auto_explain's, of every statement the call ran.
The unordered claim reads its partial index; the ordered claim touches a number of buffers that
does not depend on the backlog (the claim before the campaign queue read thousands here, 2M at
1M rows). The campaign table may be scanned when it is tiny (10 rows); the buffer bound holds
either way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from helpers import queue_campaigns
from outbox import db
from outbox.buckets import DEFAULT_COUNT, bucket_of
from outbox.queue import settle as settle_queries
from outbox.queue.claim import Q
from outbox.queue.settle import refresh_campaigns

JOURNAL = """
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT outbox.outbox_bucket('c-' || (g % {campaigns})), 'c-' || (g % {campaigns}),
       g / {campaigns} + 1,
       'tick', '{{}}'::jsonb
FROM generate_series(0, {rows} - 1) g;
"""

LAYOUTS = {
    "dead_and_not_due": JOURNAL.format(campaigns=1000, rows=200_000)
    + """
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type, status,
                                     next_attempt_at)
SELECT bucket, campaign_id, seq, event_type,
       CASE WHEN seq <= 100 THEN 'dead' ELSE 'failed' END,
       CASE WHEN seq <= 100 THEN clock_timestamp() - interval '1 day'
            ELSE clock_timestamp() + interval '1 day' END
FROM outbox.event_journal;
""",
    "blocked_heads": JOURNAL.format(campaigns=1000, rows=200_000)
    + """
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type, status,
                                     next_attempt_at)
SELECT bucket, campaign_id, seq, event_type,
       CASE WHEN seq > 1 THEN 'pending' WHEN campaign_id < 'c-5' THEN 'dead' ELSE 'failed' END,
       CASE WHEN seq = 1 AND campaign_id >= 'c-5' THEN clock_timestamp() + interval '1 day'
            ELSE clock_timestamp() - interval '1 day' END
FROM outbox.event_journal;
""",
    "hot_campaigns": JOURNAL.format(campaigns=10, rows=100_000)
    + """
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT bucket, campaign_id, seq, event_type FROM outbox.event_journal;
""",
}

FRESH = """
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT outbox.outbox_bucket('fresh-' || g), 'fresh-' || g, 1, 'tick', '{}'::jsonb
FROM generate_series(1, 5) g;
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT bucket, campaign_id, seq, event_type FROM outbox.event_journal WHERE campaign_id LIKE
    'fresh-%';
"""

REFRESH = """
SELECT count(*) FROM outbox.projection_apply_campaigns;
ANALYZE outbox.projection_apply_outbox;
ANALYZE outbox.projection_apply_campaigns;
ANALYZE outbox.event_journal;
"""

AUTO_EXPLAIN = """
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on;
SET auto_explain.log_format = json;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
"""

FLUSH = "SELECT 'flush'"

# 15 per claimed row: index probes and the journal row (4 buffers a row), and a first run's
# visibility checks; a claim that walked the backlog behind the heads reads 100k and more.
MAX_BUFFERS = 1500


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


async def _explain_everything(conn: db.Connection) -> None:
    """auto_explain on this session: the plan of every statement, those a function runs
    included, with its buffers, sent to the client as a notice. Needs a superuser."""
    if not await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
        pytest.skip("auto_explain (the claim function's inner plans) needs a superuser")
    await conn.execute(AUTO_EXPLAIN)


async def _explained(
    conn: db.Connection, sql: str, *args: object
) -> tuple[list[db.Record], list[dict[str, Any]]]:
    """Run `sql` in a transaction rolled back after (a claim locks), returning its rows and the
    plans of the statements it ran inside functions, with its own plan unless it reads from a
    function (whose statements are there: the scan's buffers would count them twice)."""
    statement = await conn.prepare(sql)  # the driver's own lookups happen here, unexplained
    logged: list[dict[str, Any]] = []

    def collect(_conn: object, message: Any) -> None:
        _, found, plan = str(message.message).partition("plan:")
        if found:
            logged.append(orjson.loads(plan))

    conn.add_log_listener(collect)
    tx = conn.transaction()
    await tx.start()
    try:
        rows = await statement.fetch(*args)
        await conn.fetchval(FLUSH)  # every notice of the statement delivered by now
    finally:
        await tx.rollback()
        conn.remove_log_listener(collect)
    ran = [e for e in logged if e["Query Text"] != FLUSH]
    nested = [e["Plan"] for e in ran if e["Query Text"].strip() != sql.strip()]
    own = [
        e["Plan"]
        for e in ran
        if e["Query Text"].strip() == sql.strip()
        and not any(n["Node Type"] == "Function Scan" for n in nodes(e["Plan"]))
    ]
    return rows, own + nested


async def _settle_campaigns(conn: db.Connection) -> None:
    """Campaign rows as a worker leaves them: heads found, blocked campaigns marked."""
    ids = [
        r["campaign_id"]
        for r in await conn.fetch("SELECT DISTINCT campaign_id FROM outbox.event_journal")
    ]
    await refresh_campaigns(conn, ids, park=False, removable=())


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
async def test_claims_never_visit_the_backlog(pool: db.Pool, layout: str) -> None:
    await pool.execute(LAYOUTS[layout])
    async with pool.acquire() as conn:
        await _settle_campaigns(conn)
    hot = layout == "hot_campaigns"
    if not hot:
        await pool.execute(FRESH)
        await queue_campaigns(pool)  # fresh work, queued as new campaigns are
    await pool.execute(REFRESH)
    # A claim runs in one bucket: the one of the first fresh (or hot) campaign.
    names = [f"c-{i}" for i in range(10)] if hot else [f"fresh-{i}" for i in range(1, 6)]
    bucket = bucket_of(names[0], DEFAULT_COUNT)
    expected = [n for n in sorted(names) if bucket_of(n, DEFAULT_COUNT) == bucket]
    for mode in ("force_custom_plan", "force_generic_plan"):
        async with pool.acquire() as conn:
            await conn.execute(f"SET plan_cache_mode = {mode}")
            await _explain_everything(conn)
            _, plans = await _explained(conn, Q.claim_due_rows, 100, None, bucket)
            custom = mode == "force_custom_plan"
            _assert_no_backlog_scan(plans, f"{layout}/{mode}/claim_due_rows", custom=custom)
            used = await _indexes_used(conn, plans)
            assert "projection_apply_outbox_claim_idx" in used, f"{layout}/{mode}: {used}"
            for take in ("all", "live"):  # a background batch, one serving appends first
                args: tuple[object, ...] = (bucket, 100, 100, [], None, take)
                rows, plans = await _explained(conn, Q.claim_batch, *args)
                where = f"{layout}/{mode}/claim_batch/{take}"
                _assert_no_backlog_scan(plans, where, custom=custom)
                buffers = sum(p["Shared Hit Blocks"] + p["Shared Read Blocks"] for p in plans)
                assert buffers <= MAX_BUFFERS, f"{where}: the claim read {buffers} buffers"
                claimed = sorted({r["campaign_id"] for r in rows if r["seq"] is not None})
                assert claimed == expected
                if hot:
                    assert len(rows) == 100


# A partition's index, named for the partitioned index it belongs to (the queue's slots, S26).
PARENT_INDEX = """
SELECT c.relname::text AS child, p.relname::text AS parent
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
WHERE c.relkind = 'i' AND c.relnamespace = 'outbox'::regnamespace
"""


async def _indexes_used(conn: db.Connection, plans: list[dict[str, Any]]) -> set[str | None]:
    """The indexes `plans` read, a slot's index named as its partitioned index."""
    parents = {r["child"]: r["parent"] for r in await conn.fetch(PARENT_INDEX)}
    names = {n.get("Index Name") for plan in plans for n in nodes(plan)}
    return {parents.get(name, name) if name else name for name in names}


def _blocks_read(node: dict[str, Any]) -> int | None:
    """The shared blocks a plan node hit or read (auto_explain's buffers), None unknown."""
    keys = ("Shared Hit Blocks", "Shared Read Blocks")
    if not all(k in node for k in keys):
        return None
    return sum(int(node[k]) for k in keys)


def _assert_no_backlog_scan(
    plans: list[dict[str, Any]],
    what: str,
    tables: Sequence[str] = ("projection_apply_outbox", "event_journal"),
    *,
    custom: bool = False,
) -> None:
    """No plan in `plans` scans any of `tables` (by default the work rows and the journal).
    `custom`: the plans are custom ones, made with each slot's size as it was then, and a scan
    of theirs that read no block is no visit: such a plan may scan a slot that is empty (the
    other two hold the rows: a layout whose insert crossed a period's end), at no cost. A
    generic plan may not: it outlives the slot's emptiness."""
    assert plans, f"{what}: no plan was explained"
    scans = [
        (n["Relation Name"], n["Actual Rows"], n.get("Rows Removed by Filter", 0))
        for plan in plans
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan"
        and re.sub(r"_[0-2]$", "", n.get("Relation Name", "")) in tables  # a slot: its table
        and not (custom and _blocks_read(n) == 0)
    ]
    assert not scans, f"{what}: scans of {scans} (table, rows, rows removed)"


# A queue as a fresh deployment has it when its workers start: 40 campaigns, analyzed.
SMALL = """
INSERT INTO outbox.campaign_head_keys (bucket, campaign_id, last_seq)
SELECT outbox.outbox_bucket('c-' || g), 'c-' || g, 1 FROM generate_series(1, 40) g;
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT bucket, campaign_id, 1, 'tick', '{}' FROM outbox.campaign_heads;
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT bucket, campaign_id, seq, event_type FROM outbox.event_journal;
INSERT INTO outbox.projection_checkpoint_keys (bucket, campaign_id, projector, applied_seq)
SELECT bucket, campaign_id, 'p', 0 FROM outbox.campaign_heads;
ANALYZE;
"""
# Then an outage: 100k campaigns whose rows wait for a retry, not analyzed yet (autovacuum is
# off on these tables for the test, so no statistics refresh re-plans the cached statements).
GROWN = """
INSERT INTO outbox.campaign_head_keys (bucket, campaign_id, last_seq)
SELECT outbox.outbox_bucket('old-' || g), 'old-' || g, 1 FROM generate_series(1, 100000) g;
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT bucket, campaign_id, 1, 'tick', '{}' FROM outbox.campaign_heads WHERE campaign_id LIKE
    'old-%';
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type, status,
                                     next_attempt_at)
SELECT bucket, campaign_id, 1, 'tick', 'failed', clock_timestamp() + interval '1 day'
FROM outbox.campaign_heads WHERE campaign_id LIKE 'old-%';
INSERT INTO outbox.projection_checkpoint_keys (bucket, campaign_id, projector, applied_seq)
SELECT bucket, campaign_id, 'p', 0 FROM outbox.campaign_heads WHERE campaign_id LIKE 'old-%';
"""
SETTLE = settle_queries.Q.settle_batch
# A table, or its partitions when it has them.
PARTS = """
SELECT coalesce(i.inhrelid, $1::regclass)::regclass::text
FROM (SELECT $1::regclass AS t) x LEFT JOIN pg_inherits i ON i.inhparent = x.t
"""
NO_AUTOVACUUM = [
    "campaign_head_keys",
    "event_journal",
    "projection_apply_outbox",
    "projection_apply_campaigns",
    "projection_checkpoint_keys",
    "projection_checkpoint_moves",
]


def _settle_args(campaigns: list[str], bucket: int) -> list[object]:
    """A settle in `bucket` of one applied row per campaign, each campaign left with nothing
    live."""
    document = {
        "done": [{"campaign_id": c, "seq": 1} for c in campaigns],
        "failed": [],
        "campaigns": [
            {"campaign_id": c, "head_seq": 2, "due_at": None, "blocked": False, "gone": True}
            for c in campaigns
        ],
        "checkpoints": [{"campaign_id": c, "projector": "p", "applied_seq": 1} for c in campaigns],
        "now": None,
        "notify": False,
        "channel": "outbox_test",
    }
    return [bucket, orjson.dumps(document).decode()]


@pytest.mark.slow
async def test_plans_cached_while_small_stay_probes(pool: db.Pool) -> None:
    """A worker session caches the claim's and the settle's plans on a tiny queue, then a
    backlog grows: the same session's claim and settle still probe by campaign, never scanning
    the work rows, the journal, the checkpoints or the heads (each scan would cost the whole
    backlog per batch until a statistics refresh re-planned it)."""
    for table in NO_AUTOVACUUM:  # a partitioned table's storage is its partitions'
        for name in await pool.fetch(PARTS, f"outbox.{table}"):
            await pool.execute(f"ALTER TABLE {name[0]} SET (autovacuum_enabled = false)")
    await pool.execute(SMALL)
    await queue_campaigns(pool)
    bucket = bucket_of("c-1", DEFAULT_COUNT)  # a batch claims and settles in one bucket
    campaigns = [f"c-{g}" for g in range(1, 41) if bucket_of(f"c-{g}", DEFAULT_COUNT) == bucket]
    async with pool.acquire() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await _explain_everything(conn)
        await _explained(conn, Q.claim_batch, bucket, 20, 100, ["p"], None, "all")
        await _explained(conn, SETTLE, *_settle_args(campaigns, bucket))
        await pool.execute(GROWN)
        await queue_campaigns(pool)
        for what, sql, args in (
            ("claim", Q.claim_batch, [bucket, 20, 100, ["p"], None, "all"]),
            ("settle", SETTLE, _settle_args(campaigns, bucket)),
        ):
            rows, plans = await _explained(conn, sql, *args)
            _assert_no_backlog_scan(plans, f"{what}, planned on the small queue", NO_AUTOVACUUM)
            if what == "claim":  # the bucket's due campaigns, none of the backlog's
                assert {r["campaign_id"] for r in rows} == set(campaigns)


# --- operators' reads (the report, metrics and console) -------------------------------------

# A backlog of 200k pending rows in 1,000 campaigns; 5 campaigns with a dead head, 5 with a
# failed one (each with rows waiting behind), and 300 dead rows stepped over in one campaign.
TROUBLE = (
    JOURNAL.format(campaigns=1000, rows=200_000)
    + """
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type, status,
    last_error)
SELECT bucket, campaign_id, seq, event_type,
       CASE WHEN seq = 1 AND campaign_id IN ('c-1', 'c-2', 'c-3', 'c-4', 'c-5') THEN 'dead'
            WHEN seq = 1 AND campaign_id IN ('c-6', 'c-7', 'c-8', 'c-9', 'c-10') THEN 'failed'
            WHEN campaign_id = 'c-11' AND seq BETWEEN 50 AND 200 THEN 'dead'
            ELSE 'pending' END,
       'boom'
FROM outbox.event_journal;
ANALYZE outbox.projection_apply_outbox;
"""
)


@pytest.mark.slow
async def test_operator_reads_never_visit_the_pending_backlog(pool: db.Pool) -> None:
    """Counts by status (bounded), blocked campaigns and the oldest claimable head at 200k
    pending rows: no read scans the work rows (the pending count may read up to its bound).
    Counts and blocked campaigns read the attention
    index (failed, dead and leased rows only), so their cost does not depend on the pending
    backlog; the oldest head is one primary-key descent per campaign (a loose index scan)."""
    from outbox.queue.attention import Q as attention_q
    from outbox.queue.inspect import Q as inspect_q

    await pool.execute(TROUBLE)
    # A read that walked the backlog would touch every page of the table; these touch the few
    # rows of interest (and, unvacuumed, their heap pages): a small fraction of it.
    pages = await pool.fetchval(  # the work rows' slots (S26)
        "SELECT sum(c.relpages) FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid "
        "WHERE i.inhparent = 'outbox.projection_apply_outbox'::regclass"
    )
    assert pages > 1000
    for mode in ("force_custom_plan", "force_generic_plan"):
        async with pool.acquire() as conn:
            await conn.execute(f"SET plan_cache_mode = {mode}")
            await _explain_everything(conn)
            for what, sql, args in (
                ("counts", inspect_q.count_rows_bounded, [100]),
                (
                    "blocked",
                    inspect_q.list_blocked_campaigns,
                    [None, False, 3, 100, None, None, None],
                ),
                (
                    "blocked/park",
                    inspect_q.list_blocked_campaigns,
                    [None, True, 3, 100, None, None, None],
                ),
                ("oldest", inspect_q.get_oldest_claimable, [None, False, None]),
                (
                    "rows",  # the console's rows page: its first page, matches counted
                    attention_q.list_attention_rows,
                    [None, None, None, None, None, -1, "", 0, 101, 10_000],
                ),
            ):
                rows, plans = await _explained(conn, sql, *args)
                scanned = sum(
                    n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
                    for plan in plans
                    for n in nodes(plan)
                    if n["Node Type"] == "Seq Scan"
                )
                # The pending count may read the table from its start: it stops at the bound.
                assert scanned <= 1000, f"{mode}/{what}: a scan read {scanned} rows"
                used = await _indexes_used(conn, plans)
                if what != "oldest":
                    assert "projection_apply_outbox_attention_idx" in used, f"{what}: {used}"
                    buffers = sum(p["Shared Hit Blocks"] + p["Shared Read Blocks"] for p in plans)
                    assert buffers <= pages / 3, f"{mode}/{what}: {buffers} of {pages} pages"
                if what == "counts":
                    assert tuple(rows[0]) == (100, 0, 5, 100)
                if what == "blocked":  # dead heads, then failed ones: all 10, oldest first
                    assert rows[0]["total"] == 10
                    assert [r["waiting"] for r in rows] == [100, 100, 100]
                if what == "blocked/park":  # dead rows step aside: only the failed heads
                    assert rows[0]["total"] == 5
                    assert {r["status"] for r in rows} == {"failed"}
                if what == "oldest":
                    assert rows[0]["campaign_id"] == "c-0"
                if what == "rows":  # 5 dead, 5 failed heads, 151 dead rows of c-11
                    assert (rows[0]["total"], len(rows)) == (161, 101)
