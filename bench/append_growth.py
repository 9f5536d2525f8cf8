#!/usr/bin/env python3
"""Append cost while the queue grows (an outage: workers down, writers on), from the state
production leaves: the work tables vacuumed and analyzed while empty (what autovacuum does
whenever the queue drains), autovacuum then off for them (no replan rescues a cached plan
mid-run), and long-lived writer sessions that keep their cached plans.

Usage: python bench/append_growth.py [--writers 4] [--events 110000] [--no-control]
Each writer appends 5-event appends on one connection of its own, mostly to campaigns that
already have queued work, every 20th to a new campaign (whose queue row the append creates
after looking up the campaign's earlier rows), until the queue holds `events` rows. The append
cost is the median latency of the append's call, timed inside the writer's transaction (BEGIN,
the call, COMMIT); the figure is its ratio at the end (the last 10% of the rows) against the
start (the first 10%, after 2% of warm-up). Target: <= 1.2x. The commit is timed apart and
printed beside it: its cost is the WAL flush, which does not depend on the queue and which a
shared disk makes swing by orders of magnitude from one second to the next.
The control (skip with --no-control) reinstalls the previous design's work-row trigger, whose
campaign lookup ran on every append with a plan cached in the session, as the baseline that
shows what the measurement catches. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg
from _support import CLEAR, EVENT_TYPE, bench_database, print_json

from outbox import Event, Settings, append

EVENTS_PER_APPEND = 5
QUEUE_TABLES = ("outbox.projection_apply_outbox", "outbox.projection_apply_campaigns")

# The previous design (migration 0003's trigger, dropped by 0006), for the control only.
CONTROL = """
CREATE FUNCTION bench_old_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox.projection_apply_campaigns (bucket, campaign_id, head_seq, due_at, slot)
    SELECT n.bucket, n.campaign_id,
           (SELECT min(o.seq) FROM outbox.projection_apply_outbox o
            WHERE o.bucket = n.bucket AND o.campaign_id = n.campaign_id),
           min(n.next_attempt_at), 0
    FROM enqueued n GROUP BY n.bucket, n.campaign_id ORDER BY n.campaign_id
    ON CONFLICT (bucket, campaign_id, slot) DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER bench_old_enqueued AFTER INSERT ON outbox.projection_apply_outbox
    REFERENCING NEW TABLE AS enqueued FOR EACH STATEMENT EXECUTE FUNCTION bench_old_enqueued();
"""
DROP_CONTROL = """
DROP TRIGGER IF EXISTS bench_old_enqueued ON outbox.projection_apply_outbox;
DROP FUNCTION IF EXISTS bench_old_enqueued();
"""


PARTITIONS = """
SELECT i.inhrelid::regclass::text FROM pg_inherits i WHERE i.inhparent = $1::regclass
"""


async def empty_and_analyzed(dsn: str) -> None:
    """The drained state: empty queue tables, vacuumed and analyzed, autovacuum off for them."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(CLEAR)
        for table in QUEUE_TABLES:
            await conn.execute(f"VACUUM ANALYZE {table}")
            # A partitioned table (the queue's slots, S26) takes storage settings on its
            # partitions alone.
            parts = [r[0] for r in await conn.fetch(PARTITIONS, table)] or [table]
            for part in parts:
                await conn.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = false)")
    finally:
        await conn.close()


Sample = tuple[int, float, float]


async def grow(dsn: str, writers: int, events: int) -> list[Sample]:
    """(rows queued before the append, its call's seconds, its commit's seconds) for every
    append."""
    settings = Settings(dsn=dsn)
    conns = [await asyncpg.connect(dsn) for _ in range(writers)]
    samples: list[Sample] = []
    queued = 0

    async def writer(w: int, conn: asyncpg.Connection) -> None:
        nonlocal queued
        i = 0
        while queued < events:
            campaign = f"w{w}-new-{i}" if i % 20 == 0 else f"w{w}-{i % 500}"
            batch = [Event(EVENT_TYPE, {"amount": (i + k) % 7}) for k in range(EVENTS_PER_APPEND)]
            before = queued
            tx = conn.transaction()
            await tx.start()
            started = time.perf_counter()
            await append(conn, campaign, batch, settings=settings)
            called = time.perf_counter()
            await tx.commit()
            samples.append((before, called - started, time.perf_counter() - called))
            queued += EVENTS_PER_APPEND
            i += 1

    try:
        await asyncio.gather(*(writer(w, c) for w, c in enumerate(conns)))
    finally:
        for conn in conns:
            await conn.close()
    return samples


def windows(samples: list[Sample], events: int) -> dict[str, float]:
    start = [(c, t) for q, c, t in samples if events * 0.02 <= q < events * 0.12]
    end = [(c, t) for q, c, t in samples if q >= events * 0.9]

    def ms(window: list[tuple[float, float]], i: int) -> float:
        return statistics.median(x[i] for x in window) * 1e3

    start_ms, end_ms = ms(start, 0), ms(end, 0)
    return {
        "start_ms": start_ms,
        "end_ms": end_ms,
        "end_vs_start": end_ms / start_ms,
        "commit_start_ms": ms(start, 1),
        "commit_end_ms": ms(end, 1),
    }


async def main(writers: int, events: int, control: bool) -> None:
    results: dict[str, dict[str, float]] = {}
    async with bench_database() as dsn:
        cases = [("append function", False)] + ([("control: 0003 trigger", True)] * control)
        for name, old_trigger in cases:
            await empty_and_analyzed(dsn)
            admin = await asyncpg.connect(dsn)
            try:
                if old_trigger:
                    await admin.execute(CONTROL)
                started = time.perf_counter()
                samples = await grow(dsn, writers, events)
                elapsed = time.perf_counter() - started
                rows = await admin.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox")
            finally:
                await admin.execute(DROP_CONTROL)
                await admin.close()
            results[name] = {**windows(samples, events), "events_per_s": rows / elapsed}
            results[name]["queued"] = rows
    print(
        f"append cost while the queue grows to {events:,} rows: {writers} writers of"
        f" {EVENTS_PER_APPEND}-event appends, long-lived sessions, queue analyzed empty,"
        " durable server; median call, ms"
    )
    for name, f in results.items():
        print(
            f"  {name:<22} start {f['start_ms']:6.2f} ms  end {f['end_ms']:6.2f} ms"
            f"  end/start {f['end_vs_start']:5.2f}x  (commit {f['commit_start_ms']:.2f} ->"
            f" {f['commit_end_ms']:.2f} ms; {f['events_per_s']:,.0f} events/s)",
            flush=True,
        )
    print_json(
        "append_growth",
        {
            "writers": writers,
            "events": events,
            "cases": {k: {m: round(v, 3) for m, v in f.items()} for k, f in results.items()},
            "end_vs_start": round(results["append function"]["end_vs_start"], 3),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--events", type=int, default=110_000)
    parser.add_argument("--no-control", dest="control", action="store_false")
    args = parser.parse_args()
    asyncio.run(main(args.writers, args.events, args.control))
