"""EXPLAIN guard (DESIGN section 12): the claim never scans the backlog.

With 100k dead rows and 100k rows not yet due, both claim statements must read the partial
claim index and never sequentially scan the outbox, whatever plan cache mode the session uses
(worker sessions force custom plans; the guard also checks the generic plan).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from outbox import db
from outbox.queue import Q

BACKLOG = """
INSERT INTO event_journal (campaign_id, seq, event_type, payload)
SELECT 'c-' || (g % 1000), g / 1000 + 1, 'tick', '{}'::jsonb FROM generate_series(0, 199999) g;
INSERT INTO projection_apply_outbox (campaign_id, seq, event_type, status, next_attempt_at)
SELECT campaign_id, seq, event_type,
       CASE WHEN seq <= 100 THEN 'dead' ELSE 'failed' END,
       CASE WHEN seq <= 100 THEN clock_timestamp() - interval '1 day'
            ELSE clock_timestamp() + interval '1 day' END
FROM event_journal;
-- A few claimable rows among them.
INSERT INTO event_journal (campaign_id, seq, event_type, payload)
SELECT 'fresh-' || g, 1, 'tick', '{}'::jsonb FROM generate_series(1, 5) g;
INSERT INTO projection_apply_outbox (campaign_id, seq, event_type)
SELECT campaign_id, seq, event_type FROM event_journal WHERE campaign_id LIKE 'fresh-%';
ANALYZE projection_apply_outbox;
ANALYZE event_journal;
"""


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_claims_use_the_partial_index_over_a_large_backlog(pool: db.Pool, mode: str) -> None:
    await pool.execute(BACKLOG)
    async with pool.acquire() as conn:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for sql, args in [
            (Q.claim_campaign_heads, (100, None, False)),
            (Q.claim_campaign_heads, (100, None, True)),
            (Q.claim_due_rows, (100, None)),
        ]:
            raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args)
            plan = orjson.loads(raw)[0]["Plan"] if isinstance(raw, str) else raw[0]["Plan"]
            all_nodes = nodes(plan)
            seq_scans = [
                n
                for n in all_nodes
                if n["Node Type"] == "Seq Scan"
                and n.get("Relation Name") == "projection_apply_outbox"
            ]
            assert not seq_scans, f"{mode}: the claim scans the outbox: {seq_scans}"
            assert any(
                n.get("Index Name") == "projection_apply_outbox_claim_idx" for n in all_nodes
            ), f"{mode}: claim index unused"
        rows = await conn.fetch(Q.claim_campaign_heads, 100, None, False)
        assert sorted(r["campaign_id"] for r in rows) == [f"fresh-{i}" for i in range(1, 6)]
