#!/usr/bin/env python3
"""Statements (each one round trip) per batch of the apply worker, counted on its connection.

Usage: python bench/statements.py [--batches N]
Cases, each a worker with one connection and `outbox.Worker.run_once()` per batch:
- trickle: campaigns of one event each, batch size 1: a batch takes one campaign and empties it
  (the path of a single event's commit -> visible);
- backlog, batch 1 / 10 / 100: 1,000 campaigns of 100 events, so each batch applies `batch`
  events of one or a few campaigns.
Each with the batch projector (one statement per batch), the per-event projector (one per
event) and the statement projector (the per-event statement for the whole batch in one
pipelined `executemany`: one round trip, logged once). asyncpg's query logger sees every
statement the worker sends on the pool the worker process opens (`open_pool`). A first batch
(statements prepared) is not counted. Prints a table, the statement sequence of one trickle
batch, and one JSON line. The figure the apply path is judged by: statements per batch, and per
event.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import asyncpg
from _apps import KINDS, outbox_app
from _support import bench_database, load_backlog, print_json

from outbox import Settings
from outbox.worker.batch import Worker
from outbox.worker.runtime import open_pool

CASES = (  # name, campaigns, events, batch size
    ("trickle", 200, 200, 1),
    ("backlog, batch 1", 1_000, 100_000, 1),
    ("backlog, batch 10", 1_000, 100_000, 10),
    ("backlog, batch 100", 1_000, 100_000, 100),
)


def label(query: str) -> str:
    """A statement's first words."""
    return " ".join(query.split()[:5])


async def count(
    dsn: str, campaigns: int, events: int, batch: int, *, kind: str, batches: int
) -> tuple[float, float, list[str]]:
    """(statements per batch, events per batch, the statements of the last batch)."""
    admin = await asyncpg.connect(dsn)
    try:
        await load_backlog(admin, campaigns=campaigns, events=events)
    finally:
        await admin.close()
    settings = Settings(dsn=dsn, batch_size=batch)
    pool = await open_pool(settings, max_size=1)  # as the worker process opens its pool
    try:
        seen: list[str] = []
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: seen.append(label(record.query)))
        worker = Worker(outbox_app(settings, kind=kind), pool)
        await worker.run_once()  # prepares the statements
        seen.clear()
        applied = 0
        last: list[str] = []
        for _ in range(batches):
            before = len(seen)
            counts = await worker.run_once()
            applied += counts.applied
            last = seen[before:]
        return len(seen) / batches, applied / batches, last
    finally:
        await pool.close()


async def main(batches: int) -> None:
    figures: dict[str, dict[str, float]] = {}
    sequence: list[str] = []
    async with bench_database() as dsn:
        print(f"statements per batch (each one round trip), {batches} batches per case")
        for name, campaigns, events, batch in CASES:
            for projector in KINDS:
                per_batch, per_events, last = await count(
                    dsn, campaigns, events, batch, kind=projector, batches=batches
                )
                if name == "trickle" and projector == "batch":
                    sequence = last
                key = f"{name}, {projector} projector"
                figures[key] = {
                    "statements_per_batch": round(per_batch, 2),
                    "events_per_batch": round(per_events, 2),
                    "statements_per_event": round(per_batch / max(per_events, 1e-9), 3),
                }
                print(
                    f"  {key:<40} {per_batch:6.2f} statements/batch"
                    f"  {per_events:6.1f} events/batch"
                    f"  {per_batch / max(per_events, 1e-9):6.3f} per event",
                    flush=True,
                )
    print("  one trickle batch (batch projector):")
    for statement, n in Counter(sequence).items():
        print(f"    {statement}" + (f" x{n}" if n > 1 else ""))
    print_json("statements", {"batches": batches, "cases": figures, "trickle": sequence})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.batches))
