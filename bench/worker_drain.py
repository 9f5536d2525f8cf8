#!/usr/bin/env python3
"""Apply-worker throughput: drain a backlog of demo events by batch size and claim loops.

Usage: python bench/worker_drain.py [--campaigns N] [--events N]
Uses OUTBOX_BENCH_DSN when set, else a throwaway local cluster (durable: fsync on). Each case
appends the same backlog (no failing events), drains it with the demo app's projectors and
prints events applied per second.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _support import bench_database

from outbox import Outbox, Settings, append, db
from outbox.examples.app import build_app, install
from outbox.examples.campaigns import DemoStream, campaign_ids
from outbox.service import drain, open_pool
from outbox.worker import Worker

CLEAR = (
    "TRUNCATE event_journal, campaign_heads, projection_apply_outbox, projection_checkpoints, "
    "processed_markers, demo_roster, demo_event_counts, demo_dice_totals"
)


async def _case(
    pool: db.Pool, dsn: str, campaigns: int, events: int, batch: int, loops: int
) -> float:
    await pool.execute(CLEAR)
    settings = Settings(dsn=dsn, batch_size=batch)
    stream = DemoStream()
    for campaign in campaign_ids(campaigns):
        for chunk in stream.batches(campaign, events, batch=50):
            await append(pool, campaign, chunk, settings=settings)
    worker = Worker(build_app(Outbox(settings)), pool)
    started = time.perf_counter()
    counts = await drain(worker, concurrency=loops)
    seconds = time.perf_counter() - started
    assert counts.failed == counts.dead == 0
    left = await pool.fetchval("SELECT count(*) FROM projection_apply_outbox")
    assert left == 0, f"{left} rows left"
    return campaigns * events / seconds


async def main(campaigns: int, events: int) -> None:
    async with bench_database() as dsn:
        pool = await open_pool(Settings(dsn=dsn), max_size=12)
        try:
            await install(pool)
            print(f"worker drain: {campaigns} campaigns x {events} events, demo projectors")
            for loops in (1, 4):
                for batch in (1, 10, 100):
                    rate = await _case(pool, dsn, campaigns, events, batch, loops)
                    print(f"  loops={loops} batch={batch:<4} {rate:>8,.0f} events/s")
        finally:
            await pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaigns", type=int, default=20)
    parser.add_argument("--events", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.campaigns, args.events))
