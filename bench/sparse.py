#!/usr/bin/env python3
"""A projector of sparse types caught up by the engine (issue 60, item 2).

Usage: python bench/sparse.py [--events 1000000] [--campaigns 10000] [--every 100] [--profile]
One durable server, one run. The journal holds `events` events over `campaigns` campaigns, one
in `every` of each campaign's of type `bench.rare` (1% by default), the rest `bench.tick`; no
work rows (a journal that was there before the projector). Then, each alone on the server:

1. **The bar**: a raw client loop reading the `bench.rare` events in key order by the journal's
   type index, 5,000 a transaction, each chunk decoded and sent as the bench's set-wise upsert.
2. **The engine** (`outbox.projection.build.build`, 2 connections, its defaults) catching up a
   batch projector of `bench.rare` that starts at the beginning (`maintenance
   projections-rebuild --catch-up` runs the same): its events per second, its steps.
3. **The engine without the type index** (dropped; the same reads by the journal's key, every
   position of the ranges read and filtered): what the index buys, in the same run.

Oracle: each build's totals against the journal's own counts per campaign.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import asyncpg
from _support import UPSERT_MANY, bench_database, print_json, upsert_chunk
from catch_up import LOAD_HISTORY
from held_snapshot import PROFILE, TOP

from outbox import EventBatch, Outbox, Settings, db
from outbox.buckets import bucket_count
from outbox.projection.build import build
from outbox.projection.builds import Progress

# catch_up.py's history, one event in $3 of each campaign's of the projector's type.
LOAD = LOAD_HISTORY.replace(
    "'bench.tick'",
    "CASE WHEN (g / $1::integer) % $3::integer = (g % $1::integer) % $3::integer "
    "THEN 'bench.rare' ELSE 'bench.tick' END",
)
RAW_CHUNK_BY_INDEX = """
SELECT bucket, campaign_id, seq, payload::text
FROM outbox.event_journal
WHERE bucket = $1::integer AND event_type = 'bench.rare'
  AND (campaign_id, seq) > ($2::text, $3::bigint)
ORDER BY bucket, event_type, campaign_id, seq
LIMIT 5000
"""
EXPECTED = """
SELECT campaign_id, count(*) AS events, sum((payload ->> 'amount')::bigint) AS amount
FROM outbox.event_journal WHERE event_type = 'bench.rare' GROUP BY campaign_id
"""
TABLES = """
CREATE TABLE raw_totals (LIKE bench_totals INCLUDING ALL);
"""


async def raw_pass(conn: asyncpg.Connection, buckets: int) -> float:
    """The client loop over the `bench.rare` events, bucket by bucket by the type index."""
    upsert = UPSERT_MANY.replace("bench_totals", "raw_totals")
    done = 0
    started = time.perf_counter()
    for bucket in range(buckets):
        after: tuple[str, int] = ("", 0)
        while True:
            async with conn.transaction():
                rows = await conn.fetch(RAW_CHUNK_BY_INDEX, bucket, *after)
                if not rows:
                    break
                await upsert_chunk(conn, upsert, rows)
            done += len(rows)
            after = (rows[-1]["campaign_id"], rows[-1]["seq"])
    return done / (time.perf_counter() - started)


def rare_app(dsn: str, name: str) -> Outbox:
    app = Outbox(Settings(dsn=dsn))

    @app.projector(name, events=["bench.rare"], batch=True, start="beginning")
    async def totals(tx: db.Connection, events: EventBatch) -> None:
        await tx.execute(UPSERT_MANY, events.campaign_ids, [p["amount"] for p in events.payloads])

    return app


async def engine(dsn: str, name: str, profile: asyncpg.Connection | None) -> tuple[float, int, int]:
    """The engine's catch-up of a `bench.rare` projector: events/s, events, steps; `profile`:
    its costliest statements printed (pg_stat_statements, nested ones included)."""
    if profile is not None:
        await profile.execute("SELECT pg_stat_statements_reset()")
    pool = await db.create_pool(dsn, min_size=1, max_size=8)
    seen = [0]  # the events done after each step that applied some

    def progress(p: Progress) -> None:
        if p.events > seen[-1]:
            seen.append(p.events)

    try:
        projector = rare_app(dsn, name).registry.projectors[name]
        started = time.perf_counter()
        built = await build(pool, projector, connections=2, progress=progress)
        seconds = time.perf_counter() - started
    finally:
        await pool.close()
    if not built.complete:
        sys.exit(f"bench: the build of {name} did not complete")
    for r in await profile.fetch(TOP) if profile is not None else []:
        print(
            f"  {name}: {r['calls']:>7} calls {r['total_ms']:>9.1f} ms "
            f"{r['mean_ms']:>8.3f} ms/call  {r['query']}",
            file=sys.stderr,
        )
    return built.progress.events / seconds, built.progress.events, len(seen) - 1


async def check(conn: asyncpg.Connection, table: str) -> None:
    expected = {r["campaign_id"]: (r["events"], r["amount"]) for r in await conn.fetch(EXPECTED)}
    got = {
        r["campaign_id"]: (r["events"], r["amount"])
        for r in await conn.fetch(f"SELECT campaign_id, events, amount FROM {table}")
    }
    if got != expected:
        sys.exit(f"bench: {table} differs from the journal's counts")


async def run(args: argparse.Namespace) -> None:
    async with bench_database(statements=args.profile) as dsn:
        conn = await asyncpg.connect(dsn)
        if args.profile:
            await conn.execute(PROFILE)
        profile = conn if args.profile else None
        try:
            loaded = time.perf_counter()
            await conn.execute(LOAD, args.campaigns, args.events, args.every)
            await conn.execute(TABLES)
            await conn.execute("VACUUM ANALYZE")
            await conn.execute("CHECKPOINT")  # history that was there before: on disk
            rare = await conn.fetchval(
                "SELECT count(*) FROM outbox.event_journal WHERE event_type = 'bench.rare'"
            )
            print(
                f"history: {args.events} events over {args.campaigns} campaigns, {rare} of the "
                f"projector's type, loaded in {time.perf_counter() - loaded:.0f}s",
                file=sys.stderr,
            )
            buckets = await bucket_count(conn)
            raw = await raw_pass(conn, buckets)
            await check(conn, "raw_totals")
            rate, events, steps = await engine(dsn, "rare", profile)
            await check(conn, "bench_totals")
            await conn.execute("TRUNCATE bench_totals")
            await conn.execute("DROP INDEX outbox.event_journal_type_idx")
            scan_rate, _, scan_steps = await engine(dsn, "rare_scan", profile)
            await check(conn, "bench_totals")
        finally:
            await conn.close()
    print(f"{'case':<46} {'events/s':>10} {'vs raw':>7} {'steps':>6}")
    print(f"{'raw pass by the type index (the bar)':<46} {raw:>10,.0f} {'1.00x':>7} {'':>6}")
    print(f"{'engine, by the type index':<46} {rate:>10,.0f} {rate / raw:>6.2f}x {steps:>6}")
    print(
        f"{'engine, the index dropped (every position read)':<46} "
        f"{scan_rate:>10,.0f} {scan_rate / raw:>6.2f}x {scan_steps:>6}"
    )
    print(f"bar: engine >= 0.7x the raw pass ({events} events of {args.events})")
    print_json(
        "sparse",
        {
            "events": args.events,
            "campaigns": args.campaigns,
            "projector_events": events,
            "raw_events_per_s": round(raw),
            "engine_events_per_s": round(rate),
            "engine_vs_raw": round(rate / raw, 3),
            "engine_steps": steps,
            "no_index_events_per_s": round(scan_rate),
            "no_index_vs_raw": round(scan_rate / raw, 3),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--campaigns", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=100, help="one rare event in EVERY")
    parser.add_argument(
        "--profile", action="store_true", help="print each build's costliest statements"
    )
    asyncio.run(run(parser.parse_args()))
