"""EXPLAIN guard (S6, docs/semantics.md): a claim never visits rows it cannot take.

Three backlogs of >= 100k work rows, each with a few claimable campaigns among them:
- `dead_and_not_due`: 100k dead rows and 100k rows not due yet, in their own campaigns;
- `blocked_heads`: half the campaigns have a dead head, the other half a head not due yet, and
  due rows queued behind every one of them;
- `hot_campaigns`: every due row in 10 campaigns of 10k rows each.
Neither claim statement may scan the work rows, whatever plan cache mode the session uses
(worker sessions force custom plans; the generic plan is checked too); the unordered claim reads
its partial index; and the ordered claim touches a number of buffers that does not depend on the
backlog (the claim before the campaign queue read thousands here, 2M at 1M rows). The campaign
table may be scanned when it is tiny (10 rows); the buffer bound holds either way.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from helpers import queue_campaigns
from outbox import db
from outbox.queue.claim import Q
from outbox.queue.settle import refresh_campaigns

JOURNAL = """
INSERT INTO event_journal (campaign_id, seq, event_type, payload)
SELECT 'c-' || (g % {campaigns}), g / {campaigns} + 1, 'tick', '{{}}'::jsonb
FROM generate_series(0, {rows} - 1) g;
"""

LAYOUTS = {
    "dead_and_not_due": JOURNAL.format(campaigns=1000, rows=200_000)
    + """
INSERT INTO projection_apply_outbox (campaign_id, seq, event_type, status, next_attempt_at)
SELECT campaign_id, seq, event_type,
       CASE WHEN seq <= 100 THEN 'dead' ELSE 'failed' END,
       CASE WHEN seq <= 100 THEN clock_timestamp() - interval '1 day'
            ELSE clock_timestamp() + interval '1 day' END
FROM event_journal;
""",
    "blocked_heads": JOURNAL.format(campaigns=1000, rows=200_000)
    + """
INSERT INTO projection_apply_outbox (campaign_id, seq, event_type, status, next_attempt_at)
SELECT campaign_id, seq, event_type,
       CASE WHEN seq > 1 THEN 'pending' WHEN campaign_id < 'c-5' THEN 'dead' ELSE 'failed' END,
       CASE WHEN seq = 1 AND campaign_id >= 'c-5' THEN clock_timestamp() + interval '1 day'
            ELSE clock_timestamp() - interval '1 day' END
FROM event_journal;
""",
    "hot_campaigns": JOURNAL.format(campaigns=10, rows=100_000)
    + """
INSERT INTO projection_apply_outbox (campaign_id, seq, event_type)
SELECT campaign_id, seq, event_type FROM event_journal;
""",
}

FRESH = """
INSERT INTO event_journal (campaign_id, seq, event_type, payload)
SELECT 'fresh-' || g, 1, 'tick', '{}'::jsonb FROM generate_series(1, 5) g;
INSERT INTO projection_apply_outbox (campaign_id, seq, event_type)
SELECT campaign_id, seq, event_type FROM event_journal WHERE campaign_id LIKE 'fresh-%';
"""

REFRESH = """
SELECT count(*) FROM projection_apply_campaigns;
ANALYZE projection_apply_outbox;
ANALYZE projection_apply_campaigns;
ANALYZE event_journal;
"""

# 15 per claimed row: index probes and the journal row (4 buffers a row), and a first run's
# visibility checks; a claim that walked the backlog behind the heads reads 100k and more.
MAX_BUFFERS = 1500


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


async def _explain(conn: db.Connection, sql: str, *args: object, analyze: bool) -> dict[str, Any]:
    options = "ANALYZE, BUFFERS, " if analyze else ""
    raw = await conn.fetchval(f"EXPLAIN ({options}FORMAT JSON) " + sql, *args)
    plan: dict[str, Any] = (orjson.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return plan


async def _settle_campaigns(conn: db.Connection) -> None:
    """Campaign rows as a worker leaves them: heads found, blocked campaigns marked."""
    ids = [
        r["campaign_id"] for r in await conn.fetch("SELECT DISTINCT campaign_id FROM event_journal")
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
    for mode in ("force_custom_plan", "force_generic_plan"):
        async with pool.acquire() as conn:
            await conn.execute(f"SET plan_cache_mode = {mode}")
            for sql, args in [
                (Q.claim_campaigns, (100, None)),
                (Q.claim_due_rows, (100, None)),
                (Q.load_campaigns, (["c-1", "c-2"], [], [1, 1], 50, None)),
            ]:
                all_nodes = nodes(await _explain(conn, sql, *args, analyze=False))
                scans = [
                    n
                    for n in all_nodes
                    if n["Node Type"] == "Seq Scan"
                    and n.get("Relation Name") == "projection_apply_outbox"
                ]
                assert not scans, f"{layout}/{mode}: the claim scans the work rows: {scans}"
                used = {n.get("Index Name") for n in all_nodes}
                if sql is Q.claim_due_rows:
                    assert "projection_apply_outbox_claim_idx" in used, f"{layout}/{mode}: {used}"
            tx = conn.transaction()  # EXPLAIN ANALYZE locks; the rollback releases
            await tx.start()
            try:
                plan = await _explain(conn, Q.claim_campaigns, 100, None, analyze=True)
                buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
                held = await conn.fetch(Q.claim_campaigns, 100, None)
                args = (
                    [r["campaign_id"] for r in held],
                    [],
                    [r["head_seq"] for r in held],
                    -(-100 // max(len(held), 1)),
                    None,
                )
                plan = await _explain(conn, Q.load_campaigns, *args, analyze=True)
                buffers += plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
                assert buffers <= MAX_BUFFERS, f"{layout}/{mode}: the claim read {buffers} buffers"
                rows = await conn.fetch(Q.load_campaigns, *args)
            finally:
                await tx.rollback()
            claimed = sorted({r["campaign_id"] for r in rows if r["seq"] is not None})
            if hot:
                assert len(claimed) == 10
                assert len(rows) == 100
            else:
                assert claimed == [f"fresh-{i}" for i in range(1, 6)]
