#!/usr/bin/env python3
"""One drain case alone, in this process, for a profiler to watch.

Usage: py-spy record --format raw -r 200 -o drain.folded -- python bench/profile_drain.py
           [--kind batch|per-event|statement] [--batch 100] [--loops 1] [--events 100000]
Drains the drain bench's backlog (1,000 campaigns) with one kind of projector and prints
events/s; no baseline runs beside it, so the rate is not a figure to quote (bench/drain.py's
ratios are). `python bench/profile_drain.py --fold drain.folded [--events N]` then prints where
the worker's own Python spent its samples: the share of samples by the innermost frame's module
(outbox, asyncpg, orjson, the event loop); py-spy samples only while the process runs Python,
so time spent waiting on the server is not in them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path

import asyncpg
from _apps import outbox_app
from _support import bench_database, check_totals, load_backlog

from outbox import Settings
from outbox.worker.runtime import drain_now, open_pool

CAMPAIGNS = 1000


async def drain(kind: str, batch: int, loops: int, events: int) -> None:
    async with bench_database() as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await load_backlog(conn, campaigns=CAMPAIGNS, events=events)
            settings = Settings(dsn=dsn, batch_size=batch)
            pool = await open_pool(settings, max_size=loops + 1)
            try:
                started = time.perf_counter()
                await drain_now(outbox_app(settings, kind=kind), pool, concurrency=loops)
                rate = events / (time.perf_counter() - started)
            finally:
                await pool.close()
            await check_totals(conn, events)
        finally:
            await conn.close()
    print(f"{kind} batch={batch} loops={loops}: {rate:,.0f} events/s (no baseline: not a figure)")


def where(frame: str) -> str:
    """The bucket of one py-spy frame, `function (path:line)`: a module of ours or the
    driver's by its dotted path, the bench's projector, the event loop, or other."""
    path = "/" + frame.rpartition("(")[2].split(":")[0]
    for root in ("outbox", "asyncpg", "orjson"):
        if f"/{root}/" in path:
            return root + "." + path.split(f"/{root}/", 1)[1].split(".")[0].replace("/", ".")
    if path.endswith("/_apps.py"):
        return "bench projector (_apps)"
    if "/asyncio/" in path or "/selectors.py" in path:
        return "asyncio event loop"
    return "other"


def fold(path: Path, events: int, rate: int) -> None:
    """Where the worker's batches (stacks through `Worker.run_once`) spent their samples in a
    py-spy `--format raw` file, by the innermost frame's module; and their Python time per event
    (samples / sampling rate / events drained)."""
    shares: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "run_once (outbox/worker/batch.py" not in stack:
            continue  # the cluster's start, the backlog's load, the idle event loop
        n = int(count)
        total += n
        shares[where(stack.split(";")[-1])] += n
    for name, n in shares.most_common(12):
        print(f"  {n / total:6.1%}  {name}")
    per_event = total / rate / events * 1e6
    print(f"  {total:,} samples in the worker's batches: {per_event:.1f} us per event")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="batch", choices=("batch", "per-event", "statement"))
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--loops", type=int, default=1)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--fold", type=Path, help="summarise a py-spy raw file and exit")
    parser.add_argument("--rate", type=int, default=200, help="py-spy's sampling rate (-r)")
    args = parser.parse_args()
    if args.fold:
        fold(args.fold, args.events, args.rate)
    else:
        asyncio.run(drain(args.kind, args.batch, args.loops, args.events))
