#!/usr/bin/env python3
"""A projector's new version built beside the live one from years of history (issue 39).

Usage: python bench/build.py [--events 1000000] [--campaigns 10000] [--rate 200]
                             [--seconds 20] [--connections N] [--max-rate R]
One durable server, one run. The journal holds `events` events over `campaigns` campaigns, all
dormant, and the live projectors are level with it, as on a live store: `visible` (one row per
event, whose commit says when it became visible) and `totals` version 1 (a batch projector: the
bench's set-wise upsert into `bench_totals_v1`). Then:

1. **The bar**: a raw client loop over the same journal in key order, 5,000 events a
   transaction (the engine's step), each chunk decoded and sent as the same set-wise upsert,
   alone on the server.
2. **Before**: a worker (2 loops) runs `visible` and `totals` v1 under `rate` one-event appends
   per second, for `seconds`: each append's time (its p95), and `visible`'s commit -> visible.
3. **The bar under the live load**: the same raw loop again, the appends and the worker going
   on (the baseline in the same conditions as the build), with the live figures meanwhile.
4. **Build**: `maintenance projections-rebuild --projector totals --as-version 2` builds v2
   with the engine (its default connections, or `--connections`; `--max-rate` caps it) while
   the v1 worker and the appends go on, as docs/projections.md has an operator do it (build
   first, then roll the workers onto the app with v2): its events per second, the append p95
   and `visible`'s p99 meanwhile.
5. **Roll and promote**: a worker with v2 replaces the v1 one (it catches v2 up on what was
   appended during the build); once v2 is caught up (its sweep done, no hold), the
   promotion's time.

Oracle: `bench_totals_v2` against the journal's own counts per campaign (not what a worker
saw); no hold failed, no row dead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import orjson
from _support import (
    UPSERT_MANY,
    Producer,
    bench_database,
    print_json,
    upsert_chunk,
    window_latency,
)
from catch_up import LEVEL_VISIBLE, LOAD_HISTORY
from latency import HERE, WORKER, start, stop, wait_until

from outbox.ops.versions import promote_version

MAINTENANCE = Path(sys.executable).parent / "maintenance"
TABLES = """
CREATE TABLE bench_visible (campaign_id text NOT NULL, seq bigint NOT NULL,
                            PRIMARY KEY (campaign_id, seq));
CREATE TABLE bench_totals_v1 (campaign_id text PRIMARY KEY, events bigint NOT NULL,
                              amount bigint NOT NULL);
CREATE TABLE bench_totals_v2 (LIKE bench_totals_v1 INCLUDING ALL);
CREATE TABLE raw_totals (LIKE bench_totals_v1 INCLUDING ALL);
"""
# `totals` v1 level with the journal, as a running store's worker left it.
LEVEL_V1 = """
WITH known AS (
    INSERT INTO outbox.outbox_projectors
        (projector, events, ordered, transactional, start, last_seen_by, swept_at)
    VALUES ('totals', ARRAY['bench.tick'], true, true, 'beginning', 'bench',
            clock_timestamp())
), applied AS (
    INSERT INTO bench_totals_v1 (campaign_id, events, amount)
    SELECT campaign_id, count(*), sum((payload ->> 'amount')::bigint)
    FROM outbox.event_journal GROUP BY campaign_id
)
INSERT INTO outbox.projection_checkpoint_keys (bucket, campaign_id, projector, applied_seq)
SELECT bucket, campaign_id, 'totals', last_seq FROM outbox.campaign_heads
"""
RAW_CHUNK = """
SELECT bucket, campaign_id, seq, payload::text
FROM outbox.event_journal
WHERE (bucket, campaign_id, seq) > ($1::integer, $2::text, $3::bigint)
ORDER BY bucket, campaign_id, seq
LIMIT 5000
"""
RECORDED = "SELECT count(*) FROM outbox.outbox_projectors WHERE projector = 'totals@v2'"
# The promotion's own check, as a number (1: caught up).
CAUGHT_UP = """
SELECT (p.swept_at IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM outbox.projection_holds h WHERE h.projector = 'totals@v2'))::integer
FROM outbox.outbox_projectors p WHERE p.projector = 'totals@v2'
"""
WRONG = """
SELECT count(*) FROM (SELECT campaign_id, count(*) AS n FROM outbox.event_journal
                      GROUP BY campaign_id) j
FULL JOIN bench_totals_v2 t USING (campaign_id)
WHERE t.events IS DISTINCT FROM j.n
"""
FAILED = """
SELECT (SELECT count(*) FROM outbox.projection_holds
        WHERE status <> 'pending' OR attempt_count > 0)
     + (SELECT count(*) FROM outbox.projection_apply_outbox WHERE status = 'dead')
"""


async def raw_pass(conn: asyncpg.Connection) -> float:
    """The client loop over the journal with the set-wise upsert: events per second."""
    upsert = UPSERT_MANY.replace("bench_totals", "raw_totals")
    after: tuple[int, str, int] = (-1, "", 0)
    done = 0
    started = time.perf_counter()
    while True:
        async with conn.transaction():
            rows = await conn.fetch(RAW_CHUNK, *after)
            if not rows:
                break
            await upsert_chunk(conn, upsert, rows)
        done += len(rows)
        last = rows[-1]
        after = (last["bucket"], last["campaign_id"], last["seq"])
    return done / (time.perf_counter() - started)


async def raw_process(dsn: str) -> float:
    """`raw_pass` in a process of its own (`--raw DSN`): its events per second."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--raw", dsn, cwd=HERE, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"bench: the raw pass exited {proc.returncode}")
    return float(out)


async def raw_only(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        print(await raw_pass(conn))
    finally:
        await conn.close()


async def main(args: argparse.Namespace) -> None:
    async with bench_database(commit_timestamps=True) as dsn:
        conn = await asyncpg.connect(dsn)
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=16)
        try:
            await run(conn, pool, dsn, args)
        finally:
            await pool.close()
            await conn.close()


async def run_build(dsn: str, connections: int | None, max_rate: float | None) -> dict[str, float]:
    """`projections-rebuild --as-version 2` as an operator runs it: its last JSON line."""
    command = [
        str(MAINTENANCE),
        *("projections-rebuild", "--app", "_apps:versioned", "--projector", "totals"),
        *("--as-version", "2", "--yes", "--json"),
    ]
    if connections is not None:
        command += ["--connections", str(connections)]
    if max_rate is not None:
        command += ["--max-rate", str(max_rate)]
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=HERE,
        stdout=subprocess.PIPE,
        env={**os.environ, "OUTBOX_DSN": dsn, "PYTHONPATH": path},
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"bench: the build exited {proc.returncode}")
    last: dict[str, float] = orjson.loads(out.splitlines()[-1])
    return last


async def run(
    conn: asyncpg.Connection, pool: asyncpg.Pool, dsn: str, args: argparse.Namespace
) -> None:
    events, campaigns, rate, seconds = args.events, args.campaigns, args.rate, args.seconds
    connections, max_rate = args.connections, args.max_rate
    await conn.execute(TABLES)
    loaded = time.perf_counter()
    await conn.execute(LOAD_HISTORY, campaigns, events)
    await conn.execute(LEVEL_VISIBLE)
    await conn.execute(LEVEL_V1)
    await conn.execute("VACUUM ANALYZE")
    print(
        f"history: {events} events over {campaigns} campaigns, loaded in "
        f"{time.perf_counter() - loaded:.0f}s",
        file=sys.stderr,
    )
    raw_rate = await raw_pass(conn)

    old = start([str(WORKER), "--app", "_apps:versioned_v1", "--concurrency", "2"], dsn)
    await asyncio.sleep(2)  # connected and listening (a bench may wait; tests never)
    appends = Producer(pool, rate, campaigns, "h-")
    running = asyncio.create_task(appends.run())
    await asyncio.sleep(1)
    since, t0 = await conn.fetchval("SELECT clock_timestamp()"), time.perf_counter()
    await asyncio.sleep(seconds)
    until, t1 = await conn.fetchval("SELECT clock_timestamp()"), time.perf_counter()
    before = await window_latency(conn, since, until)
    before_append = appends.p95_ms(t0, t1)

    # The bar again, beside the live load (in a process of its own, as the build is).
    await conn.execute("TRUNCATE raw_totals")
    since, t0 = await conn.fetchval("SELECT clock_timestamp()"), time.perf_counter()
    raw_live = await raw_process(dsn)
    until, t1 = await conn.fetchval("SELECT clock_timestamp()"), time.perf_counter()
    raw_window = await window_latency(conn, since, until)
    raw_append = appends.p95_ms(t0, t1)

    # The build, beside the v1 worker and the appends; then the roll onto v2.
    since, t0 = await conn.fetchval("SELECT clock_timestamp()"), time.perf_counter()
    built = await run_build(dsn, connections, max_rate)
    until, t1 = await conn.fetchval("SELECT clock_timestamp()"), time.perf_counter()
    during = await window_latency(conn, since, until)
    during_append = appends.p95_ms(t0, t1)
    new = start([str(WORKER), "--app", "_apps:versioned", "--concurrency", "2"], dsn)
    await wait_until(conn, RECORDED, 1, 60)
    stop(old)

    # Caught up once the worker's sweep passed every campaign level and no hold stands.
    await wait_until(conn, CAUGHT_UP, 1, 300)
    promoting = time.perf_counter()
    promoted = await promote_version(pool, "totals", 2, reason="bench")
    promote_s = time.perf_counter() - promoting

    appends.stopping.set()
    await running
    await wait_until(conn, "SELECT count(*) FROM bench_visible", appends.sent, 120)
    journal = await conn.fetchval("SELECT count(*) FROM outbox.event_journal")
    await wait_until(conn, "SELECT coalesce(sum(events), 0) FROM bench_totals_v2", journal, 120)
    stop(new)
    wrong = await conn.fetchval(WRONG)
    failed = await conn.fetchval(FAILED)
    if wrong or failed:
        raise SystemExit(f"bench: {wrong} campaigns wrong, {failed} holds failed or rows dead")

    engine_rate = built["events"] / built["seconds"]
    print(
        f"a new version of a batch projector built beside the live one over {events} events "
        f"on {campaigns} campaigns, {rate} appends/s live, durable server"
    )
    print(f"  raw client loop (same set-wise upsert, 5,000 a transaction): {raw_rate:9.0f} ev/s")
    print(
        f"  the same beside the live load: {raw_live:9.0f} ev/s (append p95 {raw_append:.2f} ms, "
        f"visible p99 {raw_window['p99_ms']:.2f} ms meanwhile)"
    )
    print(
        f"  engine ({built['events']:.0f} events in {built['seconds']:.1f} s, "
        f"{built['skipped']:.0f} campaigns left to the workers): {engine_rate:9.0f} ev/s = "
        f"{engine_rate / raw_rate:.2f}x the raw loop alone, {engine_rate / raw_live:.2f}x beside "
        "the live load (target >= 0.7x)"
    )
    print(
        f"  append p95: before {before_append:.2f} ms, during {during_append:.2f} ms = "
        f"{during_append / before_append:.2f}x (target <= 1.2x)"
    )
    print(
        f"  visible commit -> visible p99: before {before['p99_ms']:.2f} ms, during "
        f"{during['p99_ms']:.2f} ms = {during['p99_ms'] / before['p99_ms']:.2f}x "
        "(target <= 1.5x)"
    )
    print(
        f"  promotion: {1e3 * promote_s:.0f} ms (target <= 1 s), {promoted.released} hold(s) "
        "released; 0 wrong, 0 failed, 0 dead"
    )
    print_json(
        "build",
        {
            "events": events,
            "campaigns": campaigns,
            "rate": rate,
            "raw_loop_events_per_s": raw_rate,
            "raw_loop_live_events_per_s": raw_live,
            "raw_loop_live": {"append_p95_ms": raw_append, "visible": raw_window},
            "engine_events_per_s": engine_rate,
            "ratio_raw_loop": engine_rate / raw_rate,
            "ratio_raw_loop_live": engine_rate / raw_live,
            "engine": built,
            "append_p95_ms": {"before": before_append, "during": during_append},
            "visible": {"before": before, "during": during},
            "promote_seconds": promote_s,
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--campaigns", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=None)
    parser.add_argument("--max-rate", type=float, default=None)
    parser.add_argument("--raw", metavar="DSN", help=argparse.SUPPRESS)  # raw_process's child
    args = parser.parse_args()
    if args.raw:
        asyncio.run(raw_only(args.raw))
    else:
        asyncio.run(main(args))
