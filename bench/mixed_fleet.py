#!/usr/bin/env python3
"""A mixed fleet: each projector's append commit -> applied, beside the same projector alone.

Usage: python bench/mixed_fleet.py [--rate 200] [--seconds 10] [--grouped visible_sql]
A team runs a Python service's projector (`visible`, a batch projector: `_apps:visible`) and a
SQL projector (`visible_sql`: `_apps:mixed_sql`), each on workers of its own. A paced producer
appends one-event appends over 1,000 campaigns at `rate` events/s, three times, each on a fresh
database: the Python worker alone, the SQL worker alone, then both workers at once, the
`--grouped` one's in a worker group of its own (S35: `--group`; default `visible_sql`, whose
batches run in one call on its group's holds, the other in the default group; `none`: both in
the default group, as before groups). An event's
latency per projector is the commit timestamp of its row in the projector's table minus the
commit timestamp of its append (track_commit_timestamp). Prints each projector's p50/p95/p99
alone and in the mixed fleet, the mixed/alone ratio of the p50s (issue 58's bar: 1.5x), and
one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import asyncpg
from _apps import MIXED, VISIBLE
from _support import EVENT_TYPE, CpuWindow, bench_database, percentiles, print_json
from latency import paced, start, stop, wait_until

from outbox import Event, Settings, append

WORKER = Path(sys.executable).parent / "outbox-worker"
LATENCY = """
SELECT extract(
    epoch FROM pg_xact_commit_timestamp(v.xmin) - pg_xact_commit_timestamp(j.xmin)
)::float8
FROM {table} v JOIN outbox.event_journal j USING (campaign_id, seq)
"""
# Holds written (S24): each is a projector's share of a row that a worker of the other
# projector claimed and left; read once the workers have exited (their statistics flushed).
HOLDS_WRITTEN = """
SELECT n_tup_ins FROM pg_stat_user_tables
WHERE schemaname = 'outbox' AND relname = 'projection_holds'
"""
TABLES = {"visible": "bench_visible", "visible_sql": "bench_visible_sql"}
APPS = {"visible": "_apps:visible", "visible_sql": "_apps:mixed_sql"}


GROUPS = {"visible": "python", "visible_sql": "sql"}


async def run(
    rate: int, seconds: float, projectors: list[str], grouped: str = "none"
) -> tuple[dict[str, dict[str, float]], float]:
    """`projectors` each on a worker of its own (2 loops) under the paced appends, `grouped`'s
    in a worker group of its own; each one's latency, and the holds written per event
    appended."""
    total = int(rate * seconds)
    async with bench_database(commit_timestamps=True) as dsn:
        conn = await asyncpg.connect(dsn)
        await conn.execute(VISIBLE)
        await conn.execute(MIXED)
        pool = await asyncpg.create_pool(dsn, min_size=8, max_size=16)
        settings = Settings(dsn=dsn)
        workers = [
            start(
                [str(WORKER), "--app", APPS[p], "--concurrency", "2"]
                + (["--group", GROUPS[p]] if p == grouped else []),
                dsn,
            )
            for p in projectors
        ]
        try:
            await asyncio.sleep(2)  # connected and listening (a bench may wait; tests never)

            async def send(i: int) -> object:
                event = Event(EVENT_TYPE, {"amount": i % 7})
                return await append(pool, f"c-{i % 1000}", [event], settings=settings)

            window = CpuWindow()
            await paced(rate, seconds, send)
            busy = window.close().busy
            for p in projectors:
                await wait_until(conn, f"SELECT count(*) FROM {TABLES[p]}", total, 120)
            figures = {
                p: percentiles([r[0] for r in await conn.fetch(LATENCY.format(table=TABLES[p]))])
                | ({} if busy is None else {"busy_pct": round(100 * busy, 1)})
                for p in projectors
            }
            for worker in workers:
                stop(worker)
            workers.clear()
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            holds = await conn.fetchval(HOLDS_WRITTEN)
            return figures, holds / total
        finally:
            for worker in workers:
                stop(worker)
            await pool.close()
            await conn.close()


async def main(rate: int, seconds: float, grouped: str) -> None:
    alone = {p: (await run(rate, seconds, [p]))[0][p] for p in TABLES}
    mixed, holds = await run(rate, seconds, list(TABLES), grouped)
    print(f"mixed fleet: append commit -> applied at {rate} events/s for {seconds:g}s, durable")
    if grouped != "none":
        print(f"  {grouped} in worker group {GROUPS[grouped]!r}, the other in the default group")
    ratios = {}
    for p in TABLES:
        for label, f in (("alone", alone[p]), ("mixed", mixed[p])):
            print(
                f"  {p:<12} {label:<6} p50 {f['p50_ms']:8.2f}  p95 {f['p95_ms']:8.2f}  "
                f"p99 {f['p99_ms']:8.2f} ms  machine busy {f.get('busy_pct', 0):3.0f}%"
            )
        ratios[p] = mixed[p]["p50_ms"] / alone[p]["p50_ms"]
        print(f"  {p:<12} mixed/alone p50 {ratios[p]:5.2f}x (bar: 1.5x)")
    print(f"  holds written in the mixed fleet: {holds:.2f} per event appended")
    print_json(
        "mixed_fleet",
        {
            "rate": rate,
            "seconds": seconds,
            "alone": alone,
            "mixed": mixed,
            "p50_ratio": ratios,
            "holds_per_event": holds,
            "grouped": grouped,
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--grouped", choices=[*TABLES, "none"], default="visible_sql")
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds, args.grouped))
