#!/usr/bin/env python3
"""One failing projector holds only itself: commit -> visible of the others, with and without it.

Usage: python bench/isolation.py [--rate 200] [--seconds 20]
Ten projectors subscribe to every event (`_apps:isolated`): `visible` (one row per event, whose
commit timestamp says when the event became visible), eight batch projectors counting events
per campaign, and `flaky`. A paced producer appends one-event appends to 1,000 campaigns at
`rate` events/s while a worker process (2 claim loops) applies them, twice in one run on one
durable server: first with `flaky` healthy (the baseline), then with `flaky` failing every event
of one campaign in ten (BENCH_FAIL=1: backoff, then dead after 8 attempts, per event). The
figure is commit -> visible of `visible` over every event (the failing campaigns' too); the
oracle is the producer's own count: each healthy projector applied every event once.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import asyncpg
from _apps import COUNTED, HEALTHY, VISIBLE
from _support import EVENT_TYPE, bench_database, percentiles, print_json
from latency import OUTBOX_LATENCY, WORKER, paced, start, stop, wait_until

from outbox import Event, Settings, append


async def run(dsn: str, rate: int, seconds: float, *, failing: bool) -> dict[str, float]:
    """One pass on a fresh database: the percentiles of commit -> visible, after checking every
    healthy projector against the producer's count."""
    total = int(rate * seconds)
    conn = await asyncpg.connect(dsn)
    await conn.execute(VISIBLE)
    await conn.execute(COUNTED)
    pool = await asyncpg.create_pool(dsn, min_size=8, max_size=16)
    settings = Settings(dsn=dsn)
    os.environ["BENCH_FAIL"] = "1" if failing else "0"
    try:
        worker = start([str(WORKER), "--app", "_apps:isolated", "--concurrency", "2"], dsn)
        await asyncio.sleep(2)  # connected and listening (a bench may wait; tests never)

        async def send(i: int) -> object:
            event = Event(EVENT_TYPE, {"amount": i % 7})
            return await append(pool, f"c-{i % 1000}", [event], settings=settings)

        await paced(rate, seconds, send)
        await wait_until(conn, "SELECT count(*) FROM bench_visible", total, 60)
        want = (HEALTHY - 1) * total
        await wait_until(conn, "SELECT coalesce(sum(n), 0) FROM bench_counted", want, 60)
        stop(worker)
        counted = await conn.fetch(
            "SELECT projector, sum(n) AS n FROM bench_counted GROUP BY projector"
        )
        if len(counted) != HEALTHY - 1 or any(r["n"] != total for r in counted):
            raise SystemExit(f"bench: a healthy projector missed events: {counted}")
        held = await conn.fetchval("SELECT count(*) FROM outbox.projection_holds")
        if failing and not held:
            raise SystemExit("bench: `flaky` failed nowhere")
        return percentiles([r[0] for r in await conn.fetch(OUTBOX_LATENCY)])
    finally:
        await pool.close()
        await conn.close()


async def main(rate: int, seconds: float) -> None:
    figures: dict[str, dict[str, float]] = {}
    for label, failing in (("none_failing", False), ("one_failing", True)):
        async with bench_database(commit_timestamps=True) as dsn:
            figures[label] = await run(dsn, rate, seconds, failing=failing)
    print(f"commit -> visible, 10 projectors, {rate} events/s for {seconds:g}s, durable server")
    for label, f in figures.items():
        print(
            f"  {label:<14} p50 {f['p50_ms']:6.2f}  p95 {f['p95_ms']:6.2f}  "
            f"p99 {f['p99_ms']:6.2f} ms"
        )
    ratio = figures["one_failing"]["p99_ms"] / figures["none_failing"]["p99_ms"]
    print(f"  p99 with one projector failing on 10% of campaigns: {ratio:.2f}x (target <= 1.2x)")
    print_json("isolation", {"rate": rate, "seconds": seconds, "latency": figures, "ratio": ratio})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds))
