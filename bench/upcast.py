#!/usr/bin/env python3
"""What upcasting costs the live path: a drain of events that need an upcast, beside the same
drain with none registered.

Usage: python bench/upcast.py [--events 100000] [--rounds 3]
The bench's backlog (`_support.load_backlog`: events over 1,000 campaigns) drained at batch
100 by 2 loops, each case `rounds` times, alternated, the median rate kept:
- `plain`: the batch projector, no upcaster registered;
- `current`: an upcaster of the type registered, every event already at its version (the
  check alone);
- `upcast`: every event one version behind, upcast by a Python upcaster (a copy of the
  payload) before the projector sees it;
- `sql plain` and `sql upcast`: the same for the SQL projector (one call), its events upcast
  by a SQL upcaster on the server.
Prints each rate and its ratio to its plain case (issue 62's bar: upcasting costs at most 10%
at batch 100), and one JSON line. Totals checked against the generator's sums every case.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg
from _apps import outbox_app
from _support import EVENT_TYPE, PROJECTION, bench_database, check_totals, load_backlog, print_json

from outbox import Settings
from outbox.worker.runtime import drain_now, open_pool

CAMPAIGNS = 1000
BATCH = 100
LOOPS = 2
# The SQL upcaster: version 1's payload as version 2's (a copy).
UPCASTER = """
CREATE OR REPLACE FUNCTION public.bench_upcast(payload jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS 'SELECT payload'
"""
CASES = ("plain", "current", "upcast", "sql plain", "sql upcast")


def copied(payload: dict[str, Any]) -> dict[str, Any]:
    return {"amount": payload["amount"]}


async def drain(dsn: str, case: str) -> None:
    settings = Settings(dsn=dsn, batch_size=BATCH)
    app = outbox_app(settings, kind="sql" if case.startswith("sql") else "batch")
    if case in ("current", "upcast"):
        app.upcaster(EVENT_TYPE, from_version=1)(copied)
    if case == "sql upcast":
        app.sql_upcaster(EVENT_TYPE, from_version=1, function="public.bench_upcast")
    pool = await open_pool(settings, max_size=LOOPS + 1)
    try:
        counts = await drain_now(app, pool, concurrency=LOOPS)
        assert counts.failed == counts.dead == 0, counts
    finally:
        await pool.close()


async def main(events: int, rounds: int) -> None:
    rates: dict[str, list[float]] = {c: [] for c in CASES}
    async with bench_database(projection=PROJECTION + ";" + UPCASTER) as dsn:
        conn = await asyncpg.connect(dsn)
        print(
            f"upcast: {events:,} events over {CAMPAIGNS:,} campaigns, batch {BATCH}, {LOOPS} loops"
        )
        for _ in range(rounds):
            for case in CASES:
                await load_backlog(conn, campaigns=CAMPAIGNS, events=events)
                if case == "current":  # every event at the version its upcaster makes
                    await conn.execute("UPDATE outbox.event_journal SET version = 2")
                started = time.perf_counter()
                await drain(dsn, case)
                rates[case].append(events / (time.perf_counter() - started))
                await check_totals(conn, events)
        await conn.close()
    median = {c: statistics.median(r) for c, r in rates.items()}
    ratios = {
        "current_vs_plain": median["current"] / median["plain"],
        "upcast_vs_plain": median["upcast"] / median["plain"],
        "sql_upcast_vs_sql_plain": median["sql upcast"] / median["sql plain"],
    }
    for case in CASES:
        print(f"  {case:<12} {median[case]:>9,.0f} events/s (median of {rounds})")
    for name, ratio in ratios.items():
        print(f"  {name:<24} {ratio:5.2f}x (bar: >= 0.90x)")
    print_json(
        "upcast",
        {
            "events": events,
            "events_per_s": {c: round(v) for c, v in median.items()},
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.rounds))
