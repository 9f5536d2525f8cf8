#!/usr/bin/env python3
"""A projector deployed onto years of history catches up on its own, while live appends flow.

Usage: python bench/catch_up.py [--events 1000000] [--campaigns 10000] [--rate 200]
                                [--seconds 20] [--split]
One durable server, one run. The journal holds `events` events over `campaigns` campaigns, all
dormant (no work rows), and `visible` (one row per event, whose commit says when it became
visible) is level with it, as on a live store. Then:

1. **Raw passes** over the same journal doing the same upsert as the new projector, the bar:
   a client loop reading the journal in key order, 2,000 events a transaction, sending the
   per-event upsert pipelined (what the statement projector sends); and, for scale, one
   set-based INSERT ... SELECT ... GROUP BY.
2. **Before**: a worker process (2 claim loops) runs `visible` under `rate` events/s of
   one-event appends to the same campaigns for `seconds`: commit -> visible.
3. **Catch-up**: the worker is restarted with `totals` added (`_apps:catching_up`: the per-event
   upsert, ordered, `start="beginning"`), live appends still flowing. The figure is the events
   it applied per second from its first record until it reached every campaign's head (the
   report's catch-up progress at 0 events behind), and `visible`'s commit -> visible meanwhile.

`--split` deploys two workers instead of one: one that does the appends' work alone
(`--background never`, 2 loops) and one that only catches up (`--background only`, 1 loop).

Oracle: `totals` holds every journaled event once (the journal's own counts per campaign,
not what a worker saw), `visible` every live event; no hold failed or died.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import asyncpg
import orjson
from _apps import VISIBLE
from _support import UPSERT_ONE, Producer, bench_database, print_json, window_latency
from latency import WORKER, start, stop, wait_until

from outbox.projection.sweep import catch_ups

# The journal's history: `$2` events over `$1` campaigns 'h-' || n, as appends leave it, with
# no work rows (every campaign dormant).
LOAD_HISTORY = """
WITH heads AS (
    INSERT INTO outbox.campaign_head_keys (bucket, campaign_id, last_seq)
    SELECT outbox.outbox_bucket('h-' || c), 'h-' || c, ($2::integer - c - 1) / $1::integer + 1
    FROM generate_series(0, least($1::integer, $2::integer) - 1) c
)
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT outbox.outbox_bucket('h-' || (g % $1::integer)), 'h-' || (g % $1::integer),
       g / $1::integer + 1, 'bench.tick', jsonb_build_object('amount', g % 7)
FROM generate_series(0, $2::integer - 1) g
"""
# `visible` level with the journal, recorded as a running store's worker left it.
LEVEL_VISIBLE = """
WITH known AS (
    INSERT INTO outbox.outbox_projectors
        (projector, events, ordered, transactional, start, last_seen_by, swept_at)
    VALUES ('visible', ARRAY['bench.tick'], true, true, 'beginning', 'bench',
            clock_timestamp())
)
INSERT INTO outbox.projection_checkpoint_keys (bucket, campaign_id, projector, applied_seq)
SELECT bucket, campaign_id, 'visible', last_seq FROM outbox.campaign_heads
"""
RAW_TABLES = """
CREATE TABLE raw_totals (campaign_id text PRIMARY KEY, events bigint NOT NULL,
                         amount bigint NOT NULL);
CREATE TABLE set_totals (campaign_id text PRIMARY KEY, events bigint NOT NULL,
                         amount bigint NOT NULL);
"""
RAW_CHUNK = """
SELECT bucket, campaign_id, seq, payload::text
FROM outbox.event_journal
WHERE (bucket, campaign_id, seq) > ($1::integer, $2::text, $3::bigint)
ORDER BY bucket, campaign_id, seq
LIMIT 2000
"""
SET_BASED = """
INSERT INTO set_totals (campaign_id, events, amount)
SELECT campaign_id, count(*), sum((payload ->> 'amount')::bigint)
FROM outbox.event_journal
GROUP BY campaign_id
"""
TRACE = """
SELECT floor(extract(epoch FROM j.recorded_at - $1)) AS t, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l.ms), max(l.ms)
FROM bench_visible v JOIN outbox.event_journal j USING (campaign_id, seq)
CROSS JOIN LATERAL (
    SELECT 1e3 * extract(epoch FROM pg_xact_commit_timestamp(v.xmin)
                                    - pg_xact_commit_timestamp(j.xmin)) AS ms
) l
WHERE j.recorded_at >= $1 AND j.recorded_at < $2
GROUP BY 1 ORDER BY 1
"""


async def raw_pass(conn: asyncpg.Connection) -> float:
    """The client loop over the journal: events per second."""
    upsert = UPSERT_ONE.replace("bench_totals", "raw_totals")
    after: tuple[int, str, int] = (-1, "", 0)
    done = 0
    started = time.perf_counter()
    while True:
        rows = await conn.fetch(RAW_CHUNK, *after)
        if not rows:
            break
        async with conn.transaction():
            await conn.executemany(
                upsert, [(r["campaign_id"], orjson.loads(r["payload"])["amount"]) for r in rows]
            )
        done += len(rows)
        last = rows[-1]
        after = (last["bucket"], last["campaign_id"], last["seq"])
    return done / (time.perf_counter() - started)


async def set_pass(conn: asyncpg.Connection, events: int) -> float:
    started = time.perf_counter()
    await conn.execute(SET_BASED)
    return events / (time.perf_counter() - started)


async def main(events: int, campaigns: int, rate: int, seconds: float, split: bool) -> None:
    async with bench_database(commit_timestamps=True) as dsn:
        conn = await asyncpg.connect(dsn)
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=16)
        try:
            await run(conn, pool, dsn, events, campaigns, rate, seconds, split)
        finally:
            await pool.close()
            await conn.close()


async def run(
    conn: asyncpg.Connection,
    pool: asyncpg.Pool,
    dsn: str,
    events: int,
    campaigns: int,
    rate: int,
    seconds: float,
    split: bool,
) -> None:
    await conn.execute(VISIBLE)
    await conn.execute(RAW_TABLES)
    loaded = time.perf_counter()
    await conn.execute(LOAD_HISTORY, campaigns, events)
    await conn.execute(LEVEL_VISIBLE)
    await conn.execute("VACUUM ANALYZE")
    print(
        f"history: {events} events over {campaigns} campaigns, loaded in "
        f"{time.perf_counter() - loaded:.0f}s",
        file=sys.stderr,
    )
    raw_rate = await raw_pass(conn)
    set_rate = await set_pass(conn, events)

    # Before: `visible` alone under the live appends, which flow from here to the end.
    old = start([str(WORKER), "--app", "_apps:visible", "--concurrency", "2"], dsn)
    await asyncio.sleep(2)  # connected and listening (a bench may wait; tests never)
    producer = Producer(pool, rate, campaigns, "h-")
    running = asyncio.create_task(producer.run())
    await asyncio.sleep(1)
    since = await conn.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(seconds)
    until = await conn.fetchval("SELECT clock_timestamp()")
    before = await window_latency(conn, since, until)

    # Catch-up: a rolling deploy starts a worker with `totals` beside the old one, which
    # stops once the new one recorded it (until then it leaves `totals`' share in holds).
    new = [str(WORKER), "--app", "_apps:catching_up"]
    workers = (
        [  # a worker for the appends' work, one for the catch-up (OUTBOX_BACKGROUND)
            start([*new, "--concurrency", "2", "--background", "never"], dsn),
            start([*new, "--concurrency", "1", "--background", "only"], dsn),
        ]
        if split
        else [start([*new, "--concurrency", "2"], dsn)]
    )
    totals = None
    while True:
        await asyncio.sleep(0.2)
        found = {c.projector: c for c in await catch_ups(conn, progress=False)}
        if totals is None and "totals" in found:
            stop(old)
        totals = found.get("totals")
        if totals is not None and not totals.catching_up:
            break
        if any(w.poll() is not None for w in workers):
            raise SystemExit("bench: a worker exited")
    reached = await conn.fetchval("SELECT clock_timestamp()")
    first_seen = totals.first_seen_at
    applied = await conn.fetchval("SELECT coalesce(sum(events), 0)::bigint FROM bench_totals")
    producer.stopping.set()
    await running
    journal = await conn.fetchval("SELECT count(*) FROM outbox.event_journal")
    await wait_until(conn, "SELECT coalesce(sum(events), 0) FROM bench_totals", journal, 120)
    await wait_until(conn, "SELECT count(*) FROM bench_visible", producer.sent, 60)
    for worker in workers:
        stop(worker)
    during = await window_latency(conn, first_seen, reached)
    if os.environ.get("BENCH_TRACE"):  # commit -> visible per second of the catch-up
        for r in await conn.fetch(TRACE, first_seen, reached):
            print(
                f"  t+{r[0]:3.0f}s  events {r[1]:5d}  p50 {r[2]:8.1f}  max {r[3]:8.1f} ms",
                file=sys.stderr,
            )
    elapsed = (reached - first_seen).total_seconds()

    # The oracle: the journal's own counts per campaign, and no hold failed.
    wrong = await conn.fetchval(
        "SELECT count(*) FROM (SELECT campaign_id, count(*) AS n FROM outbox.event_journal "
        "GROUP BY campaign_id) j FULL JOIN bench_totals t USING (campaign_id) "
        "WHERE t.events IS DISTINCT FROM j.n"
    )
    failed = await conn.fetchval(
        "SELECT count(*) FROM outbox.projection_holds WHERE status <> 'pending' "
        "OR attempt_count > 0"
    )
    dead = await conn.fetchval(
        "SELECT count(*) FROM outbox.projection_apply_outbox WHERE status = 'dead'"
    )
    if wrong or failed or dead:
        raise SystemExit(f"bench: {wrong} campaigns wrong, {failed} holds failed, {dead} dead")
    rate_catch_up = applied / elapsed
    how = "two workers (appends' work, catch-up)" if split else "one worker"
    print(
        f"catch-up of a new ordered projector over {events} events on {campaigns} campaigns, "
        f"{rate} events/s live, {how}, durable server"
    )
    print(f"  raw client loop (same upsert, pipelined): {raw_rate:9.0f} events/s")
    print(f"  raw set-based INSERT ... SELECT:          {set_rate:9.0f} events/s")
    print(
        f"  outbox catch-up: {applied} events in {elapsed:.1f}s = {rate_catch_up:9.0f} events/s"
        f" = {rate_catch_up / raw_rate:.2f}x the raw loop (target >= 0.7x), "
        f"{rate_catch_up / set_rate:.2f}x the set-based pass"
    )
    for label, f in (("before", before), ("during", during)):
        print(
            f"  visible commit -> visible {label:<6} p50 {f['p50_ms']:6.2f}  "
            f"p95 {f['p95_ms']:6.2f}  p99 {f['p99_ms']:6.2f} ms"
        )
    ratio = during["p99_ms"] / before["p99_ms"]
    print(f"  p99 during catch-up: {ratio:.2f}x before (target <= 1.5x); 0 dead, 0 failed")
    print_json(
        "catch_up",
        {
            "events": events,
            "campaigns": campaigns,
            "rate": rate,
            "split": split,
            "raw_loop_events_per_s": raw_rate,
            "set_pass_events_per_s": set_rate,
            "catch_up_events_per_s": rate_catch_up,
            "catch_up_seconds": elapsed,
            "ratio_raw_loop": rate_catch_up / raw_rate,
            "latency": {"before": before, "during": during},
            "p99_ratio": ratio,
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--campaigns", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--split",
        action="store_true",
        help="deploy two workers: one for the appends' work, one catching up",
    )
    args = parser.parse_args()
    asyncio.run(main(args.events, args.campaigns, args.rate, args.seconds, args.split))
