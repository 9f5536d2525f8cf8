#!/usr/bin/env python3
"""Append cost of enqueueing: appends/s and latency with enqueueing off, on, and on with inline
apply, 8 writers of 1-event appends, on one durable server, in one run.

Usage: python bench/append.py [--writers N] [--appends N]
Cases (every append is its own transaction, as `outbox.append` on a pool runs it):
- off: journal only (OUTBOX_ENABLED=false), the baseline;
- on: journal + work row; the campaign already has queued work (a backlog, or a busy
  campaign), so no wake-up is sent;
- on, cold campaigns: every append goes to a campaign with no queued work, so its trigger
  creates the campaign row and sends the (payload-free) NOTIFY: the worst case of the chosen
  wake-up design;
- on, NOTIFY every append: the previous design (one NOTIFY per append transaction), measured
  by adding a statement trigger that notifies on every enqueue, for comparison;
- on + inline apply: the per-event upsert projector applied in the append's transaction.
Prints appends/s, p50/p95/p99 and ratios against `off`, and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from _apps import outbox_app
from _support import CLEAR, EVENT_TYPE, bench_database, percentiles, print_json

from outbox import Event, Settings, append, db

NOTIFY_ALWAYS = """
CREATE OR REPLACE FUNCTION bench_notify_always() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_work', '');
    RETURN NULL;
END $$;
CREATE TRIGGER bench_notify_always AFTER INSERT ON projection_apply_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION bench_notify_always();
"""
DROP_NOTIFY_ALWAYS = "DROP TRIGGER bench_notify_always ON projection_apply_outbox"

Appender = Callable[[str, int], Awaitable[object]]


async def run_case(
    pool: db.Pool, appender: Appender, *, writers: int, appends: int, cold: bool
) -> dict[str, float]:
    await pool.execute(CLEAR)
    latencies: list[float] = []

    async def writer(w: int) -> None:
        for i in range(appends):
            campaign = f"w{w}-{i}" if cold else f"w{w}-{i % 50}"
            started = time.perf_counter()
            await appender(campaign, i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    rate = writers * appends / (time.perf_counter() - started)
    return {"appends_per_s": rate, **percentiles(latencies)}


async def main(writers: int, appends: int) -> None:
    results: dict[str, dict[str, float]] = {}
    async with bench_database() as dsn:
        pool = await db.create_pool(dsn, min_size=writers, max_size=writers)
        try:
            off = Settings(dsn=dsn, enabled=False)
            on = Settings(dsn=dsn, enabled=True)
            inline = outbox_app(Settings(dsn=dsn, enabled=True, inline_apply=True), batch=False)

            def plain(settings: Settings) -> Appender:
                async def go(campaign: str, i: int) -> object:
                    return await append(
                        pool, campaign, [Event(EVENT_TYPE, {"amount": i % 7})], settings=settings
                    )

                return go

            async def inline_append(campaign: str, i: int) -> object:
                return await inline.append(pool, campaign, [Event(EVENT_TYPE, {"amount": i % 7})])

            cases: list[tuple[str, Appender, bool]] = [
                ("off", plain(off), False),
                ("on", plain(on), False),
                ("on, cold campaigns", plain(on), True),
                ("on, NOTIFY every append", plain(on), False),
                ("on + inline apply", inline_append, False),
            ]
            print(f"append: {writers} writers x {appends} one-event appends, durable server")
            for _ in range(2):  # two rounds, interleaved; the better of each is kept
                for name, appender, cold in cases:
                    if name == "on, NOTIFY every append":
                        await pool.execute(NOTIFY_ALWAYS)
                    try:
                        figures = await run_case(
                            pool, appender, writers=writers, appends=appends, cold=cold
                        )
                    finally:
                        if name == "on, NOTIFY every append":
                            await pool.execute(DROP_NOTIFY_ALWAYS)
                    best = results.get(name)
                    if best is None or figures["appends_per_s"] > best["appends_per_s"]:
                        results[name] = figures
        finally:
            await pool.close()
    base = results["off"]
    for name, f in results.items():
        rate, p95 = f["appends_per_s"], f["p95_ms"]
        print(
            f"  {name:<26} {rate:>8,.0f} appends/s ({rate / base['appends_per_s']:4.2f}x)"
            f"  p50 {f['p50_ms']:6.2f}  p95 {p95:6.2f} ({p95 / base['p95_ms']:4.2f}x)"
            f"  p99 {f['p99_ms']:6.2f} ms",
            flush=True,
        )
    print_json(
        "append",
        {
            "writers": writers,
            "appends_per_writer": appends,
            "cases": {k: {m: round(v, 3) for m, v in f.items()} for k, f in results.items()},
            "on_vs_off": round(results["on"]["appends_per_s"] / base["appends_per_s"], 3),
            "on_p95_vs_off": round(results["on"]["p95_ms"] / base["p95_ms"], 3),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--appends", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.writers, args.appends))
