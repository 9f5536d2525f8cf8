#!/usr/bin/env python3
"""One drain case alone, in this process, for a profiler to watch.

Usage: py-spy record --format raw -o drain.folded -- python bench/profile_drain.py
           [--kind batch|per-event|statement] [--batch 100] [--loops 1] [--events 100000]
Drains the drain bench's backlog (1,000 campaigns) with one kind of projector and prints
events/s; no baseline runs beside it, so the rate is not a figure to quote (bench/drain.py's
ratios are). `python bench/profile_drain.py --fold drain.folded` then prints where the worker's
own Python spent its samples: the share of samples, by the innermost frame of the named modules
(outbox, asyncpg, orjson) and the event loop.
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
    driver's by its dotted path, else the event loop, else other."""
    path = frame.rpartition("(")[2].split(":")[0]
    for root in ("outbox", "asyncpg", "orjson", "_apps"):
        marker = f"/{root}/"
        if marker in path:
            tail = path.split(marker, 1)[1].removesuffix(".py").replace("/", ".")
            return f"{root}.{tail}" if root != "_apps" else "bench projector"
        if path.endswith(f"/{root}.py"):
            return "bench projector" if root == "_apps" else root
    if "asyncio" in path or "selectors" in path:
        return "event loop (asyncio, selectors: waiting on the server)"
    return "other"


def fold(path: Path) -> None:
    """Share of samples per innermost bucket of a py-spy `--format raw` file."""
    shares: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        n = int(count)
        total += n
        buckets = [where(f) for f in frames]
        ours = [b for b in buckets if b != "other"]
        shares[ours[-1] if ours else "other"] += n
    for name, n in shares.most_common(15):
        print(f"  {n / total:6.1%}  {name}")
    print(f"  ({total:,} samples)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="batch", choices=("batch", "per-event", "statement"))
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--loops", type=int, default=1)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--fold", type=Path, help="summarise a py-spy raw file and exit")
    args = parser.parse_args()
    if args.fold:
        fold(args.fold)
    else:
        asyncio.run(drain(args.kind, args.batch, args.loops, args.events))
