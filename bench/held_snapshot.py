#!/usr/bin/env python3
"""The apply path under a snapshot held elsewhere: commit -> applied, the claim's and the
settle's time per call, and the queue's tables, while vacuum is held back.

Usage: python bench/held_snapshot.py [--rate 200] [--campaigns 500] [--hold 900] [--window 30]
                                      [--profile]
One durable server (our own cluster: track_commit_timestamp on, pg_stat_statements loaded). A
worker process (2 claim loops) runs `visible` (ordered: one row per event, whose commit says
when it was applied) under a steady `rate` events/s of one-event appends over `campaigns`
campaigns. After a warm-up, a `window`-second window (before); then another session opens
`BEGIN ISOLATION LEVEL REPEATABLE READ`, reads the journal and holds its snapshot for `hold`
seconds (a pg_dump's or a report's snapshot). Windows end halfway through the hold and at its
end; two follow the release (0 to `window` s after it, then `window` to 2 x `window` s). Each
window: commit -> applied p50/p99 of the events appended in it; the mean server time of a
claim call and of a settle call in it (pg_stat_statements, reset at the window's start); the
events applied per second against those appended; and at its end the work rows left (the
backlog) and the size with indexes and the dead versions of the queue's tables (append heads,
work rows, campaign rows, checkpoints, holds, markers). Every figure is also a ratio to the
window before the hold; the issue's bars (p99 <= 2x, p50 <= 1.5x, claim and settle <= 1.5x,
tables <= 2x, the appends kept up with; back to the before-window's figures a minute after
the release) are printed beside them. Run it under another checkout's package
(PYTHONPATH=/path/to/checkout) for the figure of the code before. `--profile`:
pg_stat_statements tracks the statements inside the server functions too, and each window
prints its ten costliest statements (what grows).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg
from _apps import VISIBLE
from _support import TABLE_SIZES, Producer, bench_database, print_json, window_latency
from latency import WORKER, start, stop, wait_until

TABLES = (
    "campaign_head_keys",
    "projection_apply_outbox",
    "projection_apply_campaigns",
    "projection_checkpoint_keys",
    "projection_checkpoint_moves",
    "projection_holds",
    "processed_markers",
)
# Mean server time of the worker's claim and settle calls since the last reset.
CALLS = """
SELECT CASE WHEN query LIKE '%outbox_claim(%' THEN 'claim' ELSE 'settle' END AS call,
       sum(calls)::bigint AS calls, sum(total_exec_time) / nullif(sum(calls), 0) AS mean_ms
FROM pg_stat_statements
WHERE query LIKE '%outbox_claim(%' OR query LIKE '%outbox_settle(%'
GROUP BY 1
"""
# The costliest statements of a window, nested ones included under --profile.
TOP = """
SELECT calls, total_exec_time AS total_ms, total_exec_time / calls AS mean_ms,
       shared_blks_hit / calls AS hits, regexp_replace(left(query, 110), '\\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE calls > 0 AND query NOT LIKE '%pg_stat_statements%'
ORDER BY total_exec_time DESC
LIMIT 10
"""
PROFILE = """
DO $$ BEGIN
    EXECUTE format('ALTER DATABASE %I SET pg_stat_statements.track = %L',
                   current_database(), 'all');
END $$
"""
APPLIED = """
SELECT count(*) FROM bench_visible
WHERE pg_xact_commit_timestamp(xmin) >= $1 AND pg_xact_commit_timestamp(xmin) < $2
"""
APPENDED = "SELECT count(*) FROM outbox.event_journal WHERE recorded_at >= $1 AND recorded_at < $2"
BACKLOG = "SELECT count(*) FROM outbox.projection_apply_outbox"
APPLIED_ALL = "SELECT count(*) FROM bench_visible"


@dataclass
class Window:
    label: str
    since: Any
    until: Any
    calls: dict[str, tuple[int, float]]  # claim/settle: (calls, mean ms)
    tables: dict[str, tuple[int, int]]  # table: (dead versions, bytes with indexes)
    backlog: int
    top: list[str]  # under --profile: the costliest statements
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    appended: int = 0
    applied: int = 0

    @property
    def size(self) -> int:
        return sum(b for _, b in self.tables.values())


async def window(
    conn: asyncpg.Connection, seconds: float, label: str, profile: bool = False
) -> Window:
    await conn.execute("SELECT pg_stat_statements_reset()")
    since = await conn.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(seconds)
    until = await conn.fetchval("SELECT clock_timestamp()")
    calls = {r["call"]: (r["calls"], r["mean_ms"] or 0.0) for r in await conn.fetch(CALLS)}
    tables = {
        r["name"]: (r["dead"], r["heap"] + r["idx"]) for r in await conn.fetch(TABLE_SIZES, TABLES)
    }
    top = [
        f"{r['total_ms']:9.1f} ms {r['calls']:7d} x {r['mean_ms']:7.3f} ms {r['hits']:7.0f} hits  "
        f"{r['query']}"
        for r in (await conn.fetch(TOP) if profile else [])
    ]
    return Window(label, since, until, calls, tables, await conn.fetchval(BACKLOG), top)


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def report(windows: list[Window], rate: int, campaigns: int, hold: float) -> None:
    base = windows[0]
    print(
        f"commit -> applied, {rate} events/s over {campaigns} campaigns, one worker (2 loops), "
        f"a snapshot held {hold / 60:.1f} min elsewhere, durable server; ratios to 'before'"
    )
    head = (
        f"  {'window':<18}{'p50 ms':>16}{'p99 ms':>18}{'claim ms':>16}{'settle ms':>16}"
        f"{'tables MB':>16}{'appended/s':>12}{'applied/s':>11}{'backlog':>9}"
    )
    print(head)
    for w in windows:
        seconds = (w.until - w.since).total_seconds()
        claim, settle = w.calls.get("claim", (0, 0.0)), w.calls.get("settle", (0, 0.0))
        bclaim, bsettle = base.calls.get("claim", (0, 0.0)), base.calls.get("settle", (0, 0.0))
        print(
            f"  {w.label:<18}"
            f"{w.p50_ms:8.2f} {ratio(w.p50_ms, base.p50_ms):>7}"
            f"{w.p99_ms:9.2f} {ratio(w.p99_ms, base.p99_ms):>8}"
            f"{claim[1]:8.3f} {ratio(claim[1], bclaim[1]):>7}"
            f"{settle[1]:8.3f} {ratio(settle[1], bsettle[1]):>7}"
            f"{w.size / 2**20:8.1f} {ratio(w.size, base.size):>7}"
            f"{w.appended / seconds:12.1f}{w.applied / seconds:11.1f}{w.backlog:9d}"
        )
    print("  dead versions at each window's end:")
    for w in windows:
        dead = "  ".join(
            f"{name.removeprefix('projection_')} {d}" for name, (d, _) in sorted(w.tables.items())
        )
        print(f"    {w.label:<18}{dead}")
    for w in windows:
        if w.top:
            print(f"  costliest statements, {w.label} (total, calls, mean, buffer hits per call):")
            for line in w.top:
                print(f"    {line}")
    print("  bars: p99 <= 2x, p50 <= 1.5x, claim and settle <= 1.5x, tables <= 2x (held);")
    print("        applied/s keeps up with appended/s; 'released 60s' back to 'before'")


async def main(rate: int, campaigns: int, hold: float, seconds: float, profile: bool) -> None:
    async with bench_database(commit_timestamps=True, statements=True) as dsn:
        conn = await asyncpg.connect(dsn)
        if profile:
            await conn.execute(PROFILE)
        holder = await asyncpg.connect(dsn, server_settings={"application_name": "bench-holder"})
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=16)
        await conn.execute(VISIBLE)
        worker = start([str(WORKER), "--app", "_apps:visible", "--concurrency", "2"], dsn)
        windows: list[Window] = []
        try:
            await asyncio.sleep(2)  # connected and listening (a bench may wait; tests never)
            producer = Producer(pool, rate, campaigns, "s-")
            producing = asyncio.create_task(producer.run())
            await asyncio.sleep(30)  # warm-up: every campaign seen, plans cached
            windows.append(await window(conn, seconds, "before", profile))
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM outbox.event_journal")
            held = time.monotonic()
            await asyncio.sleep(max(0.0, hold / 2 - seconds))
            windows.append(await window(conn, seconds, f"held {hold / 2 / 60:.1f} min", profile))
            await asyncio.sleep(max(0.0, held + hold - seconds - time.monotonic()))
            windows.append(await window(conn, seconds, f"held {hold / 60:.1f} min", profile))
            await holder.execute("ROLLBACK")
            windows.append(await window(conn, seconds, f"released {seconds:g}s", profile))
            windows.append(await window(conn, seconds, f"released {2 * seconds:g}s", profile))
            producer.stopping.set()
            await producing
            # Every event applied, so that each has a figure.
            await wait_until(conn, APPLIED_ALL, producer.sent, deadline=600)
        finally:
            stop(worker)
            await pool.close()
            await holder.close()
        for w in windows:
            f = await window_latency(conn, w.since, w.until)
            w.p50_ms, w.p99_ms = f["p50_ms"], f["p99_ms"]
            w.appended = await conn.fetchval(APPENDED, w.since, w.until)
            w.applied = await conn.fetchval(APPLIED, w.since, w.until)
        await conn.close()
        report(windows, rate, campaigns, hold)
        print_json(
            "held_snapshot",
            {
                "rate": rate,
                "campaigns": campaigns,
                "hold": hold,
                "windows": [
                    {k: v for k, v in asdict(w).items() if k not in ("since", "until", "top")}
                    for w in windows
                ],
            },
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--campaigns", type=int, default=500)
    parser.add_argument("--hold", type=float, default=900.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.campaigns, args.hold, args.window, args.profile))
