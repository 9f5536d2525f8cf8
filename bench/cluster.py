#!/usr/bin/env python3
"""The outbox on a three-node Citus cluster beside one plain server, in one run: drain
events/s, append appends/s, and the claim's p50 in one bucket as the backlog grows.

Usage: python bench/cluster.py [--events N] [--appends N] [--sizes 10000,1000000] [--claims N]
Needs Citus in the machine's PostgreSQL (found, or built from CITUS_SRC by
tests/citus/ensure-citus.sh); without it, says so and exits 0. Four durable servers on this
machine: the plain one, and the cluster's coordinator and two workers (loopback). Both
databases carry the same schema and the same projection, placed as docs/scaling.md says (a
`bucket` column; on the cluster distributed by it, co-located with the outbox's tables).
- drain: a backlog of N events over 1,000 campaigns drained by the worker (batch 100, 2 and 4
  claim loops, the best) with a batch projector (one set-wise upsert per batch: INSERT ...
  SELECT from the arrays, which Citus commits by two-phase commit), the same batch projector
  with its upsert in routed statements ("batch routed": a function updating from the arrays and
  inserting the missing rows by VALUES) and a statement projector (one upsert per event,
  pipelined); totals checked against the generator's sums;
- append: 8 writers of one-event appends, enqueueing off (journal only) and on;
- claim: bench/claim.py's layouts at each size, p50 of an ordered claim of 100 in one bucket.
On 2 cores the cluster cannot be faster than one server: its figure is its overhead (every
statement is planned on the coordinator and run on a worker node over loopback). Prints a
table, cluster / plain ratios, and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from _apps import outbox_app
from _support import (
    OUTBOX_TABLES,
    bench_database,
    check_totals,
    load_backlog,
    percentiles,
    print_json,
)
from append import run_case, tick
from claim import LAYOUTS
from claim import load as load_layout
from claim import measure as measure_claims

from outbox import Settings, append, db
from outbox.buckets.distribution import distribute
from outbox.schema import migrate
from outbox.testing.localcitus import CitusCluster
from outbox.testing.localpg import find_bindir
from outbox.worker.runtime import drain_now

ENSURE_CITUS = Path(__file__).resolve().parent.parent / "tests" / "citus" / "ensure-citus.sh"
TARGETS = ("plain", "cluster")
LOOPS = (2, 4)

PROJECTION = """
CREATE TABLE bench_bucket_totals (
    bucket      integer NOT NULL,
    campaign_id text    NOT NULL,
    events      bigint  NOT NULL,
    amount      bigint  NOT NULL,
    PRIMARY KEY (bucket, campaign_id)
);
-- The set-wise upsert in statements Citus routes to the batch's shard (docs/scaling.md): the
-- rows there move by UPDATE ... FROM unnest, the missing ones come by INSERT ... VALUES. One
-- bucket per statement: on Citus a batch is one bucket; on one server it may span several.
CREATE FUNCTION bench_add_totals(p_campaigns text[], p_amounts bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b integer;
    moved text[];
    r record;
BEGIN
  FOR b IN SELECT DISTINCT outbox.outbox_bucket(c) FROM unnest(p_campaigns) AS c ORDER BY 1 LOOP
    WITH m AS (
        UPDATE bench_bucket_totals t
        SET events = t.events + e.events, amount = t.amount + e.amount
        FROM (
            SELECT e.campaign_id, count(*) AS events, sum(e.amount) AS amount
            FROM unnest(p_campaigns, p_amounts) AS e(campaign_id, amount)
            WHERE outbox.outbox_bucket(e.campaign_id) = b
            GROUP BY e.campaign_id
        ) e
        WHERE t.bucket = b AND t.campaign_id = e.campaign_id
        RETURNING t.campaign_id
    )
    SELECT coalesce(array_agg(m.campaign_id), '{}') INTO moved FROM m;
    FOR r IN
        SELECT e.campaign_id, count(*) AS events, sum(e.amount) AS amount
        FROM unnest(p_campaigns, p_amounts) AS e(campaign_id, amount)
        WHERE outbox.outbox_bucket(e.campaign_id) = b AND NOT e.campaign_id = ANY (moved)
        GROUP BY e.campaign_id
        ORDER BY e.campaign_id
    LOOP
        INSERT INTO bench_bucket_totals AS t (bucket, campaign_id, events, amount)
        VALUES (b, r.campaign_id, r.events, r.amount)
        ON CONFLICT (bucket, campaign_id) DO UPDATE
        SET events = t.events + excluded.events, amount = t.amount + excluded.amount;
    END LOOP;
  END LOOP;
END
$$;
"""
CO_LOCATE = (
    "SELECT create_distributed_table('bench_bucket_totals', 'bucket',"
    " colocate_with => 'outbox.event_journal')"
)
UPSERT_MANY = """
INSERT INTO bench_bucket_totals AS t (bucket, campaign_id, events, amount)
SELECT outbox.outbox_bucket(e.campaign_id), e.campaign_id, count(*), sum(e.amount)
FROM unnest($1::text[], $2::bigint[]) AS e(campaign_id, amount)
GROUP BY e.campaign_id
ORDER BY e.campaign_id
ON CONFLICT (bucket, campaign_id) DO UPDATE
SET events = t.events + excluded.events, amount = t.amount + excluded.amount
"""
# The projectors the drain runs, by name: the app's kind, and the set-wise upsert a batch
# projector sends (INSERT ... SELECT, or the routed function).
KINDS = {
    "batch": ("batch", UPSERT_MANY),
    "batch routed": ("batch", "SELECT bench_add_totals($1::text[], $2::bigint[])"),
    "statement": ("statement", UPSERT_MANY),
}
UPSERT_ONE = """
INSERT INTO bench_bucket_totals AS t (bucket, campaign_id, events, amount)
VALUES (outbox.outbox_bucket($1), $1, 1, $2)
ON CONFLICT (bucket, campaign_id) DO UPDATE
SET events = t.events + 1, amount = t.amount + excluded.amount
"""
CLEAR = f"TRUNCATE {OUTBOX_TABLES}, bench_bucket_totals"


def have_citus() -> bool:
    """Citus in the machine's PostgreSQL, or built now from CITUS_SRC (the tier's script)."""
    script = ["bash", str(ENSURE_CITUS), str(find_bindir())]
    return subprocess.run(script, check=False).returncode == 0


@asynccontextmanager
async def databases() -> AsyncIterator[dict[str, str]]:
    """A migrated database with the projection on a plain durable server (the bench's own,
    `bench_database`) and on a durable three-node cluster (distributed, the projection
    co-located); their DSNs by target."""
    cluster = CitusCluster.temporary(durable=True)
    try:
        cluster.start()
        dsn = await cluster.create_database(f"bench_{uuid.uuid4().hex[:8]}")
        conn = await db.connect(dsn)
        try:
            await migrate(conn)
            await conn.execute(PROJECTION)
            await distribute(conn)
            await conn.execute(CO_LOCATE)
        finally:
            await conn.close()
        async with bench_database(projection=PROJECTION) as plain:
            yield {"plain": plain, "cluster": dsn}
    finally:
        cluster.destroy()


async def drain_case(dsn: str, *, events: int, kind: str, loops: int) -> float:
    """events/s of one drain of a fresh backlog; the totals checked (exactly once)."""
    conn = await db.connect(dsn)
    try:
        await conn.execute(CLEAR)
        await load_backlog(conn, campaigns=1000, events=events, clear=False)
        settings = Settings(dsn=dsn, batch_size=100)
        pool = await db.create_pool(dsn, min_size=1, max_size=loops + 1)
        try:
            started = time.perf_counter()
            app_kind, upsert_many = KINDS[kind]
            app = outbox_app(
                settings, kind=app_kind, upsert_many=upsert_many, upsert_one=UPSERT_ONE
            )
            counts = await drain_now(app, pool, concurrency=loops)
            rate = events / (time.perf_counter() - started)
        finally:
            await pool.close()
        assert counts.failed == counts.dead == 0, counts
        await check_totals(conn, events, table="bench_bucket_totals")
        return rate
    finally:
        await conn.close()


async def append_case(dsn: str, *, appends: int, enabled: bool) -> dict[str, float]:
    settings = Settings(dsn=dsn, enabled=enabled)
    pool = await db.create_pool(dsn, min_size=8, max_size=8)
    try:

        async def one(w: int, campaign: str, i: int) -> object:
            return await append(pool, campaign, tick(i), settings=settings)

        return await run_case(pool, one, writers=8, appends=appends, cold=False, clear=CLEAR)
    finally:
        await pool.close()


async def claim_case(dsn: str, *, layout: str, size: int, claims: int) -> float:
    """p50 (ms) of an ordered claim of 100 rows in one bucket, over `size` work rows."""
    conn = await db.connect(dsn, server_settings={"plan_cache_mode": "force_custom_plan"})
    try:
        await load_layout(conn, layout, size, clear=CLEAR)
        await measure_claims(conn, 10)  # warm the plan and the cache
        return percentiles(await measure_claims(conn, claims))["p50_ms"]
    finally:
        await conn.close()


async def main(events: int, appends: int, sizes: list[int], claims: int) -> None:
    figures: dict[str, dict[str, float]] = {t: {} for t in TARGETS}

    def show(target: str, case: str, value: float, unit: str) -> None:
        figures[target][case] = round(value, 3)
        print(f"  {target:<8} {case:<34} {value:>10,.2f} {unit}", flush=True)

    async with databases() as dsns:
        print("cluster: a coordinator and 2 workers beside one plain server, all durable")
        for target, dsn in dsns.items():
            for kind in KINDS:
                best = 0.0
                for loops in LOOPS:
                    best = max(best, await drain_case(dsn, events=events, kind=kind, loops=loops))
                show(target, f"drain {kind}", best, "events/s")
        for target, dsn in dsns.items():
            for enabled in (False, True):
                rates = await append_case(dsn, appends=appends, enabled=enabled)
                name = f"append {'on' if enabled else 'off'}"
                show(target, name, rates["appends_per_s"], "appends/s")
                show(target, f"{name} p95", rates["p95_ms"], "ms")
        for target, dsn in dsns.items():
            for layout in LAYOUTS:
                for size in sizes:
                    p50 = await claim_case(dsn, layout=layout, size=size, claims=claims)
                    show(target, f"claim {layout} {size:,} p50", p50, "ms")
    ratios: dict[str, float] = {}
    print("ratios:")
    for case in figures["plain"]:
        if " p50" in case or " p95" in case:
            continue
        ratios[f"cluster_vs_plain {case}"] = figures["cluster"][case] / figures["plain"][case]
    for target in TARGETS:
        for layout in LAYOUTS:
            big, small = (
                figures[target][f"claim {layout} {s:,} p50"] for s in (max(sizes), min(sizes))
            )
            ratios[f"{target} claim {layout} growth"] = big / small
    for name, value in ratios.items():
        print(f"  {name:<44} {value:5.2f}x")
    print_json(
        "cluster",
        {
            "events": events,
            "appends_per_writer": appends,
            "sizes": sizes,
            "claims": claims,
            "figures": figures,
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--claims", type=int, default=300)
    args = parser.parse_args()
    if not have_citus():
        print("cluster: NOT RUN: no Citus on this machine (set CITUS_SRC to build one)")
        sys.exit(0)
    asyncio.run(
        main(args.events, args.appends, [int(s) for s in args.sizes.split(",")], args.claims)
    )
