#!/usr/bin/env python3
"""Append-path throughput: events/s by batch size, with and without enqueue+NOTIFY and keys.

Usage: python bench/append_path.py [--events N] [--writers N]
Uses OUTBOX_BENCH_DSN when set, else a throwaway local cluster (durable: fsync on), so the
figures include commit cost. Prints one line per case.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _support import bench_database

from outbox import Event, Settings, append, db


async def _case(
    pool: db.Pool, settings: Settings, *, events: int, batch: int, writers: int, keyed: bool
) -> float:
    await pool.execute(
        "TRUNCATE event_journal, campaign_heads, projection_apply_outbox, append_idempotency_keys"
    )
    per_writer = events // writers

    async def writer(w: int) -> None:
        for i in range(0, per_writer, batch):
            key = f"w{w}-{i}" if keyed else None
            await append(
                pool,
                f"bench-{w}",
                [Event("bench.tick", {"i": i + j}) for j in range(batch)],
                idempotency_key=key,
                settings=settings,
            )

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    return per_writer * writers / (time.perf_counter() - started)


async def main(events: int, writers: int) -> None:
    async with bench_database() as dsn:
        pool = await db.create_pool(dsn, min_size=writers, max_size=writers)
        try:
            print(f"append path: {events} events, {writers} writers (one campaign each)")
            for enabled in (True, False):
                for keyed in (False, True):
                    for batch in (1, 10, 100):
                        settings = Settings(dsn=dsn, enabled=enabled)
                        rate = await _case(
                            pool,
                            settings,
                            events=events,
                            batch=batch,
                            writers=writers,
                            keyed=keyed,
                        )
                        label = "enqueue+notify" if enabled else "journal only  "
                        print(
                            f"  {label} keyed={keyed!s:5} batch={batch:<4} {rate:>10,.0f} events/s"
                        )
        finally:
            await pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.writers))
