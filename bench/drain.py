#!/usr/bin/env python3
"""Drain throughput: the worker against a raw-SQL ceiling and pgqueuer, in one run.

Usage: python bench/drain.py [--campaigns N] [--events N] [--pgqueuer-events N]
                             [--skip-pgqueuer] [--kinds batch,sql]
Every contender drains the same backlog (N events over the campaigns, enqueued oldest first)
into the same read model (per-campaign totals), on the same durable server, and the totals are
checked against the generator's own sums after every case (exactly once). Contenders:
- raw: the ceiling, a minimal asyncpg loop on 4 connections, one transaction per batch: claim
  with FOR UPDATE SKIP LOCKED and a literal LIMIT, load the journal rows, upsert the totals
  set-wise from unnest arrays, delete, commit; no per-campaign ordering;
- outbox batch / per-event / statement / sql: the worker (ordering by campaign, checkpoints)
  with a batch projector running the raw loop's upsert, a per-event projector running one upsert
  per event, the same upsert as a statement projector (`app.statement`: the batch's statements
  pipelined), or as a SQL projector (`app.sql_projector`: a function given the batch's events
  as one JSON array), at batch 10 and 100 with 1, 2 and 4 claim loops;
- the worker process as an operator runs it, `outbox-worker --drain-now` with every default
  (batch 100, one loop that grows while batches come back full), the batch projector, its
  process's start included;
- pgqueuer (the `bench` extra) with the per-event upsert in each job, and with a no-op job, on
  fewer events (it is slower; rates are per second either way).
Prints a table, ratios against the raw ceiling at the same batch size, the bench process's peak
RSS (the worker runs in it), and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from _apps import KINDS, outbox_app
from _support import (
    UPSERT_MANY,
    UPSERT_ONE,
    bench_database,
    check_totals,
    decode_amounts,
    load_backlog,
    print_json,
    verdict,
)

from outbox import Settings
from outbox.worker.runtime import drain_now, open_pool

BATCHES = (10, 100)
HERE = Path(__file__).resolve().parent
WORKER = Path(sys.executable).parent / "outbox-worker"
DEFAULTS = "outbox-worker defaults batch=100"
# Issue 59's bars: (kind, batch size) -> the least ratio to the raw loop.
BARS = {("batch", 100): 0.75, ("sql", 100): 0.9, ("batch", 10): 0.5, ("sql", 10): 0.8}
LOOPS = (1, 2, 4)
RAW_CONNECTIONS = 4

# The raw loop claims across the whole queue, through an index of its own (created for its run):
# the strongest plain loop over these tables, whatever the outbox's own keys lead with.
RAW_INDEX = (
    "CREATE INDEX raw_claim_idx ON outbox.projection_apply_outbox (next_attempt_at, seq) "
    "WHERE status IN ('pending', 'failed')"
)
RAW_CLAIM = """
SELECT bucket, campaign_id, seq FROM outbox.projection_apply_outbox
WHERE status IN ('pending', 'failed') AND next_attempt_at <= now()
ORDER BY next_attempt_at, seq
LIMIT {limit}
FOR UPDATE SKIP LOCKED
"""
RAW_LOAD = """
SELECT j.campaign_id, j.payload::text AS payload
FROM unnest($1::text[], $2::bigint[], $3::integer[]) AS k(campaign_id, seq, bucket)
JOIN outbox.event_journal j ON j.bucket = k.bucket AND j.campaign_id = k.campaign_id AND j.seq
    = k.seq
"""
RAW_DELETE = """
DELETE FROM outbox.projection_apply_outbox o
USING unnest($1::text[], $2::bigint[], $3::integer[]) AS d(campaign_id, seq, bucket)
WHERE o.bucket = d.bucket AND o.campaign_id = d.campaign_id AND o.seq = d.seq
"""


async def worker_process(dsn: str) -> None:
    """`outbox-worker --drain-now` with every default, as a process of its own."""
    env = {**os.environ, "OUTBOX_DSN": dsn, "PYTHONPATH": str(HERE)}
    proc = await asyncio.create_subprocess_exec(
        str(WORKER),
        "--app",
        "_apps:batch_app",
        "--drain-now",
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if await proc.wait() != 0:
        raise SystemExit(f"bench: outbox-worker --drain-now exited {proc.returncode}")


async def raw_drain(dsn: str, batch: int) -> None:
    claim = RAW_CLAIM.format(limit=batch)

    async def loop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            while True:
                async with conn.transaction():
                    rows = await conn.fetch(claim)
                    if not rows:
                        return
                    ids = [r["campaign_id"] for r in rows]
                    seqs = [r["seq"] for r in rows]
                    buckets = [r["bucket"] for r in rows]
                    loaded = await conn.fetch(RAW_LOAD, ids, seqs, buckets)
                    amounts = decode_amounts([r["payload"] for r in loaded])
                    await conn.execute(UPSERT_MANY, [r["campaign_id"] for r in loaded], amounts)
                    await conn.execute(RAW_DELETE, ids, seqs, buckets)
        finally:
            await conn.close()

    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(RAW_INDEX)
        await admin.execute("ANALYZE outbox.projection_apply_outbox")
        await asyncio.gather(*(loop() for _ in range(RAW_CONNECTIONS)))
    finally:
        await admin.execute("DROP INDEX IF EXISTS outbox.raw_claim_idx")
        await admin.close()


async def outbox_drain(dsn: str, batch: int, loops: int, *, kind: str) -> None:
    settings = Settings(dsn=dsn, batch_size=batch)
    pool = await open_pool(settings, max_size=loops + 1)
    try:
        app = outbox_app(settings, kind=kind)
        counts = await drain_now(app, pool, concurrency=loops)
        assert counts.failed == counts.dead == 0, counts
    finally:
        await pool.close()


async def pgqueuer_drain(dsn: str, events: int, batch: int, *, upsert: bool) -> float:
    """Enqueue `events` jobs (not timed), drain them; events/s."""
    import orjson
    from pgqueuer import types
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=4, max_size=8)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if not await conn.fetchval("SELECT to_regclass('pgqueuer') IS NOT NULL"):
            await queries.install()
        await conn.execute("TRUNCATE pgqueuer, bench_totals")
        rows = [(f"c-{g % 1000}", g % 7) for g in range(events)]
        for i in range(0, events, 5000):
            chunk = rows[i : i + 5000]
            await queries.enqueue(
                ["tick"] * len(chunk),
                [orjson.dumps({"c": c, "a": a}) for c, a in chunk],
                [0] * len(chunk),
            )
        qm = QueueManager(queries)

        @qm.entrypoint("tick")
        async def tick(job: Any) -> None:
            if upsert:
                body = orjson.loads(job.payload)
                await pool.execute(UPSERT_ONE, body["c"], body["a"])

        started = time.perf_counter()
        await qm.run(batch_size=batch, mode=types.QueueExecutionMode.drain)
        seconds = time.perf_counter() - started
        if upsert:
            await check_totals(conn, events)
        return events / seconds
    finally:
        await pool.close()
        await conn.close()


async def main(
    campaigns: int, events: int, pgq_events: int, skip_pgqueuer: bool, kinds: list[str]
) -> None:
    results: dict[str, float] = {}
    async with bench_database() as dsn:
        conn = await asyncpg.connect(dsn)

        async def case(name: str, run: Any) -> None:
            await load_backlog(conn, campaigns=campaigns, events=events)
            started = time.perf_counter()
            await run
            rate = events / (time.perf_counter() - started)
            await check_totals(conn, events)
            left = await conn.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox")
            assert left == 0, f"{name}: {left} rows left"
            results[name] = rate
            print(f"  {name:<28} {rate:>9,.0f} events/s", flush=True)

        print(f"drain: {events:,} events over {campaigns:,} campaigns, durable server")
        for batch in BATCHES:
            await case(f"raw batch={batch}", raw_drain(dsn, batch))
            for loops in LOOPS:
                for kind in kinds:
                    run = outbox_drain(dsn, batch, loops, kind=kind)
                    await case(f"outbox {kind} batch={batch} loops={loops}", run)
        if "batch" in kinds:
            await case(DEFAULTS, worker_process(dsn))
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        await conn.close()
        if not skip_pgqueuer:
            for batch in BATCHES:
                for upsert in (True, False):
                    name = f"pgqueuer {'upsert' if upsert else 'no-op'} batch={batch}"
                    rate = await pgqueuer_drain(dsn, pgq_events, batch, upsert=upsert)
                    results[name] = rate
                    print(f"  {name:<28} {rate:>9,.0f} events/s", flush=True)

    print("ratios (best of the loop counts):")
    ratios: dict[str, float] = {}
    for batch in BATCHES:
        ceiling = results[f"raw batch={batch}"]
        for kind in kinds:
            best = max(results[f"outbox {kind} batch={batch} loops={n}"] for n in LOOPS)
            ratios[f"{kind}_vs_raw_batch{batch}"] = best / ceiling
            bar = BARS.get((kind, batch))
            target = f"  target {verdict(best / ceiling, bar, at_most=False)}" if bar else ""
            print(f"  outbox {kind:<9} batch={batch:<3} / raw      {best / ceiling:5.2f}x{target}")
            for handler in ("upsert", "no-op"):
                other = results.get(f"pgqueuer {handler} batch={batch}")
                if other:
                    key = f"{kind}_vs_pgqueuer_{handler.replace('-', '')}_batch{batch}"
                    ratios[key] = best / other
                    print(
                        f"  outbox {kind:<9} batch={batch:<3} / pgqueuer {handler:<6} "
                        f"{best / other:5.2f}x"
                    )
    if DEFAULTS in results:
        ratio = results[DEFAULTS] / results["raw batch=100"]
        ratios["worker_defaults_vs_raw_batch100"] = ratio
        print(f"  outbox-worker, defaults, batch=100 / raw {ratio:5.2f}x")
    print(f"  peak RSS of the bench process (worker in-process): {rss_mb:,.0f} MB")
    print_json(
        "drain",
        {
            "campaigns": campaigns,
            "events": events,
            "pgqueuer_events": pgq_events,
            "events_per_s": {k: round(v) for k, v in results.items()},
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "peak_rss_mb": round(rss_mb),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaigns", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--pgqueuer-events", type=int, default=20_000)
    parser.add_argument("--skip-pgqueuer", action="store_true")
    parser.add_argument(
        "--kinds",
        type=lambda v: v.split(","),
        default=list(KINDS),
        help=f"the projector kinds to run, comma-separated (default: {','.join(KINDS)})",
    )
    args = parser.parse_args()
    if unknown := set(args.kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {', '.join(sorted(unknown))} (known: {', '.join(KINDS)})")
    asyncio.run(
        main(args.campaigns, args.events, args.pgqueuer_events, args.skip_pgqueuer, args.kinds)
    )
