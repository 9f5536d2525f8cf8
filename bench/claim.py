#!/usr/bin/env python3
"""Claim latency against backlog size: p50/p99 of one ordered claim of 100 rows at 10k and 1M
work rows, in three layouts, on one durable server (`outbox.queue.claim`:
lock campaigns, load rows).

Usage: python bench/claim.py [--sizes 10000,1000000] [--claims N]
- split: half the rows dead, half not due yet, in campaigns of their own; claimable work in
  50 fresh campaigns;
- blocked_heads: every campaign's head is dead (half) or not due yet (half), with due rows
  queued behind it; claimable work in 50 fresh campaigns;
- hot: every row due, in 10 campaigns.
Each claim runs in its own transaction and rolls back (the backlog stays as it is). The figure
that matters is the ratio of p50 at the largest size to p50 at the smallest, per layout: the
claim's cost must not grow with the backlog. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg
from _support import CLEAR, bench_database, percentiles, print_json

from outbox import db
from outbox.buckets import due_buckets
from outbox.queue.claim import claim
from outbox.queue.settle import refresh_campaigns

# $1 rows over $2 campaigns.
JOURNAL = """
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT outbox.outbox_bucket('c-' || (g % $2::integer)), 'c-' || (g % $2::integer),
       g / $2::integer + 1,
       'bench.tick', '{}'::jsonb
FROM generate_series(0, $1::integer - 1) g
"""
LAYOUTS = {
    "split": """
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type, status,
                                     next_attempt_at)
SELECT bucket, campaign_id, seq, event_type,
       CASE WHEN seq % 2 = 0 THEN 'dead' ELSE 'failed' END,
       CASE WHEN seq % 2 = 0 THEN now() - interval '1 day'
            ELSE now() + interval '1 day' END
FROM outbox.event_journal
""",
    "blocked_heads": """
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type, status,
                                     next_attempt_at)
SELECT bucket, campaign_id, seq, event_type,
       CASE WHEN seq > 1 THEN 'pending' WHEN campaign_id < 'c-5' THEN 'dead' ELSE 'failed' END,
       CASE WHEN seq = 1 AND campaign_id >= 'c-5' THEN now() + interval '1 day'
            ELSE now() - interval '1 day' END
FROM outbox.event_journal
""",
    "hot": """
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT bucket, campaign_id, seq, event_type FROM outbox.event_journal
""",
}
FRESH = """
WITH j AS (
    INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
    SELECT outbox.outbox_bucket('fresh-' || g || '-' || s), 'fresh-' || g || '-' || s, s,
        'bench.tick',
           '{}'::jsonb
    FROM generate_series(1, 50) g, generate_series(1, 4) s
    RETURNING bucket, campaign_id, seq, event_type
)
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT bucket, campaign_id, seq, event_type FROM j
"""


async def load(conn: asyncpg.Connection, layout: str, rows: int, *, clear: str = CLEAR) -> None:
    """`rows` work rows in `layout`, after `clear` (also on a Citus coordinator: bench/cluster)."""
    await conn.execute(clear)
    campaigns = 10 if layout == "hot" else max(10, rows // 1000)
    await conn.execute(JOURNAL, rows, campaigns)
    await conn.execute(LAYOUTS[layout])
    if layout != "hot":
        await conn.execute(FRESH)
    ids = [r[0] for r in await conn.fetch("SELECT DISTINCT campaign_id FROM outbox.event_journal")]
    # Campaign rows as workers leave them (heads found, blocked ones marked); rows inserted
    # by hand get theirs here, as `maintenance reconcile` gives them.
    for i in range(0, len(ids), 5000):
        await refresh_campaigns(conn, ids[i : i + 5000], park=False, removable=())
    for table in (
        "outbox.projection_apply_outbox",
        "outbox.projection_apply_campaigns",
        "outbox.event_journal",
    ):
        await conn.execute(f"VACUUM ANALYZE {table}")


async def measure(conn: db.Connection, claims: int) -> list[float]:
    """Claims in the first bucket with claimable work (a worker claims in one bucket)."""
    bucket = next(b for b, due_in in await due_buckets(conn, rows=False) if due_in <= 0)
    samples = []
    for _ in range(claims):
        tx = conn.transaction()
        await tx.start()
        started = time.perf_counter()
        campaigns = await claim(conn, bucket=bucket, limit=100, ordered=True)
        samples.append(time.perf_counter() - started)
        await tx.rollback()
        assert sum(len(c.rows) for c in campaigns) > 0, "nothing claimable"
    return samples


async def main(sizes: list[int], claims: int) -> None:
    figures: dict[str, dict[str, float]] = {}
    async with bench_database() as dsn:
        conn = await db.connect(dsn, server_settings={"plan_cache_mode": "force_custom_plan"})
        try:
            print(f"claim of 100 rows: p50/p99 over {claims} claims, durable server")
            for layout in LAYOUTS:
                for size in sizes:
                    await load(conn, layout, size)
                    await measure(conn, 10)  # warm the plan and the cache
                    p = percentiles(await measure(conn, claims))
                    figures[f"{layout}_{size}"] = {k: round(v, 3) for k, v in p.items()}
                    print(
                        f"  {layout:<14} {size:>9,} rows  p50 {p['p50_ms']:7.3f} ms"
                        f"  p99 {p['p99_ms']:7.3f} ms",
                        flush=True,
                    )
        finally:
            await conn.close()
    ratios = {
        layout: figures[f"{layout}_{max(sizes)}"]["p50_ms"]
        / figures[f"{layout}_{min(sizes)}"]["p50_ms"]
        for layout in LAYOUTS
    }
    for layout, ratio in ratios.items():
        print(f"  {layout:<14} p50 at {max(sizes):,} / at {min(sizes):,}: {ratio:5.2f}x")
    print_json(
        "claim",
        {"sizes": sizes, "claims": claims, "latency": figures, "p50_growth": ratios},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--claims", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.claims))
