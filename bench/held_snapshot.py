#!/usr/bin/env python3
"""The apply path under a snapshot held elsewhere: commit -> visible while vacuum is held back.

Usage: python bench/held_snapshot.py [--rate 200] [--campaigns 500] [--hold 600] [--window 30]
One durable server. A worker process (2 claim loops) runs `visible` (one row per event, whose
commit says when it became visible) under a steady `rate` events/s of one-event appends over
`campaigns` campaigns. After a warm-up and a `window`-second window (before), another session
opens `BEGIN ISOLATION LEVEL REPEATABLE READ`, reads the journal and holds its snapshot for
`hold` seconds; windows are taken halfway and at the end of the hold, and `window` seconds
after its release. Each window prints commit -> visible p50/p99 of the events appended in it,
and, at its end, the dead row versions and the size (with indexes) of the work rows, the
campaign rows, the checkpoints and (where the schema has them) the holds. Run it under another
checkout's package (PYTHONPATH=/path/to/checkout) for the figure of the code before.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg
from _apps import VISIBLE
from _support import Producer, bench_database, print_json, window_latency
from latency import WORKER, start, stop

TABLES = (
    "projection_apply_outbox",
    "projection_apply_campaigns",
    "projection_checkpoints",
    "projection_holds",
)
STATE = """
SELECT s.relname, s.n_dead_tup, pg_total_relation_size(s.relid) AS bytes
FROM pg_stat_user_tables s
WHERE s.schemaname = 'outbox' AND s.relname = ANY ($1::text[])
"""


async def window(
    conn: asyncpg.Connection, seconds: float, label: str
) -> tuple[str, Any, Any, dict[str, tuple[int, int]]]:
    since = await conn.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(seconds)
    until = await conn.fetchval("SELECT clock_timestamp()")
    state = {r["relname"]: (r["n_dead_tup"], r["bytes"]) for r in await conn.fetch(STATE, TABLES)}
    return label, since, until, state


async def main(rate: int, campaigns: int, hold: float, seconds: float) -> None:
    async with bench_database(commit_timestamps=True) as dsn:
        conn = await asyncpg.connect(dsn)
        holder = await asyncpg.connect(dsn)
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=16)
        await conn.execute(VISIBLE)
        worker = start([str(WORKER), "--app", "_apps:visible", "--concurrency", "2"], dsn)
        try:
            await asyncio.sleep(2)  # connected and listening (a bench may wait; tests never)
            producer = Producer(pool, rate, campaigns, "s-")
            producing = asyncio.create_task(producer.run())
            await asyncio.sleep(10)  # warm-up
            windows = [await window(conn, seconds, "before")]
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM outbox.event_journal")
            held = time.monotonic()
            await asyncio.sleep(max(0.0, hold / 2 - seconds))
            windows.append(await window(conn, seconds, f"held {hold / 2 / 60:g} min"))
            await asyncio.sleep(max(0.0, held + hold - seconds - time.monotonic()))
            windows.append(await window(conn, seconds, f"held {hold / 60:g} min"))
            await holder.execute("ROLLBACK")
            windows.append(await window(conn, seconds, "after release"))
            producer.stopping.set()
            await producing
        finally:
            stop(worker)
            await pool.close()
            await holder.close()
        figures: dict[str, Any] = {}
        print(
            f"commit -> visible, {rate} events/s over {campaigns} campaigns, a snapshot held "
            f"{hold / 60:g} min elsewhere, durable server"
        )
        for label, since, until, state in windows:
            f = await window_latency(conn, since, until)
            figures[label] = {"latency": f, "tables": state}
            tables = "  ".join(
                f"{name.removeprefix('projection_')}: {dead} dead, {size / 2**20:.1f} MB"
                for name, (dead, size) in sorted(state.items())
            )
            print(f"  {label:<14} p50 {f['p50_ms']:7.2f}  p99 {f['p99_ms']:7.2f} ms   {tables}")
        await conn.close()
        print_json(
            "held_snapshot",
            {"rate": rate, "campaigns": campaigns, "hold": hold, "windows": figures},
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--campaigns", type=int, default=500)
    parser.add_argument("--hold", type=float, default=600.0)
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.campaigns, args.hold, args.window))
