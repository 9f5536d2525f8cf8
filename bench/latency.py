#!/usr/bin/env python3
"""Append commit -> projection visible, at a steady rate, beside a raw LISTEN loop, in one run.

Usage: python bench/latency.py [--rate 500] [--seconds 10] [--campaigns 8,1000]
For each spread in `--campaigns`, a paced producer appends one-event appends spread over that
many campaigns at `rate` events/s while a worker
process (`outbox-worker --app _apps:visible`, 2 claim loops) applies them with a batch projector
that inserts one row per event; then again with the same projection as a SQL projector
(`_apps:visible_sql`). The latency of an event is the commit timestamp of its
projection row minus the commit timestamp of its append (track_commit_timestamp: the server's
own clock, no client in between). The baseline is a raw loop in its own process: the producer
inserts a queue row and NOTIFYs in one statement; the loop LISTENs, and on each notification
deletes queued rows (SKIP LOCKED, 100 at a time) into a visible table. Every 10th outbox append
is also followed by `outbox.wait_applied` (read-your-writes): its figure is the wall-clock time
it returns minus the commit timestamp of the projection row it waited for. Prints p50/p95/p99
of each and one JSON line. BENCH_WORKER_LOG=path keeps the worker's log lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path

import asyncpg
from _apps import VISIBLE, visible_sql_app
from _support import EVENT_TYPE, CpuWindow, bench_database, percentiles, print_json, verdict

from outbox import Event, Settings, append, db, wait_applied
from outbox.ops.redefine import redefine_projector

HERE = Path(__file__).resolve().parent
WORKER = Path(sys.executable).parent / "outbox-worker"

RAW_SCHEMA = """
CREATE TABLE raw_queue (id bigserial PRIMARY KEY, campaign_id text NOT NULL, seq bigint NOT NULL);
CREATE TABLE raw_visible (campaign_id text NOT NULL, seq bigint NOT NULL, queued_xid xid NOT NULL);
"""
RAW_ENQUEUE = """
WITH i AS (INSERT INTO raw_queue (campaign_id, seq) VALUES ($1, $2) RETURNING 1)
SELECT pg_notify('raw_work', '') FROM i
"""
RAW_APPLY = """
WITH d AS (
    DELETE FROM raw_queue WHERE id IN (
        SELECT id FROM raw_queue ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
    )
    RETURNING campaign_id, seq, xmin
)
INSERT INTO raw_visible (campaign_id, seq, queued_xid) SELECT campaign_id, seq, xmin FROM d
"""
OUTBOX_LATENCY = """
SELECT extract(
    epoch FROM pg_xact_commit_timestamp(v.xmin) - pg_xact_commit_timestamp(j.xmin)
)::float8
FROM bench_visible v JOIN outbox.event_journal j USING (campaign_id, seq)
"""
# The projection's commit, per waited-for (campaign, seq), against when wait_applied returned.
WAIT_LATENCY = """
SELECT w.returned_at - extract(epoch FROM pg_xact_commit_timestamp(v.xmin))::float8
FROM unnest($1::text[], $2::bigint[], $3::float8[]) AS w(campaign_id, seq, returned_at)
JOIN bench_visible v USING (campaign_id, seq)
"""
# The live path's bars (issue 59): the Python batch and the SQL projector, at every spread.
P50_BAR, P99_BAR = 5.0, 25.0
WAIT_EVERY = int(os.environ.get("BENCH_WAIT_EVERY", "10"))
RAW_LATENCY = """
SELECT extract(
    epoch FROM pg_xact_commit_timestamp(xmin) - pg_xact_commit_timestamp(queued_xid)
)::float8
FROM raw_visible
"""


async def raw_listener(dsn: str) -> None:
    """The baseline's consumer (its own process): LISTEN, drain on every notification."""
    conn = await asyncpg.connect(dsn)
    listen = await asyncpg.connect(dsn)
    woken = asyncio.Event()
    await listen.add_listener("raw_work", lambda *_: woken.set())
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), 1.0)
        woken.clear()
        while (await conn.execute(RAW_APPLY)) != "INSERT 0 0":
            pass


async def paced(
    rate: int, seconds: float, send: Callable[[int], Coroutine[None, None, object]]
) -> None:
    """Start send(i) at t0 + i / rate, each in its own task, and wait for all of them."""
    tasks: list[asyncio.Task[object]] = []
    started = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(i)))
    await asyncio.gather(*tasks)


async def wait_until(conn: asyncpg.Connection, sql: str, want: int, deadline: float) -> None:
    until = time.monotonic() + deadline
    while await conn.fetchval(sql) < want:
        if time.monotonic() > until:
            raise SystemExit(f"bench: {sql!r} did not reach {want} in {deadline}s")
        await asyncio.sleep(0.05)


def start(args: list[str], dsn: str) -> subprocess.Popen[bytes]:
    # The bench's apps, and whatever PYTHONPATH the bench runs under (another checkout of the
    # package, for a figure of the code before).
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OUTBOX_DSN": dsn, "PYTHONPATH": path}
    log = Path(os.environ.get("BENCH_WORKER_LOG", os.devnull))  # the worker's JSON lines
    with log.open("ab") as stderr:
        return subprocess.Popen(args, cwd=HERE, env=env, stderr=stderr)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


async def main(rate: int, seconds: float, spreads: list[int]) -> None:
    results = [await spread_case(rate, seconds, spread) for spread in spreads]
    print_json(
        "latency",
        {
            "rate": rate,
            "seconds": seconds,
            "spreads": {str(n): figures for n, figures in zip(spreads, results, strict=True)},
        },
    )


async def spread_case(rate: int, seconds: float, spread: int) -> dict[str, dict[str, float]]:
    """The three cases over `spread` campaigns, in a fresh database; prints and returns them."""
    total = int(rate * seconds)
    async with bench_database(commit_timestamps=True) as dsn:
        conn = await asyncpg.connect(dsn)
        await conn.execute(VISIBLE)
        await conn.execute(RAW_SCHEMA)
        pool = await asyncpg.create_pool(dsn, min_size=8, max_size=16)
        waiters = await asyncpg.create_pool(dsn, min_size=4, max_size=8)
        waited: list[tuple[str, int, float]] = []
        settings = Settings(dsn=dsn)
        figures: dict[str, dict[str, float]] = {}
        try:

            async def send_outbox(i: int) -> object:
                event = Event(EVENT_TYPE, {"amount": i % 7})
                campaign = f"c-{i % spread}"
                result = await append(pool, campaign, [event], settings=settings)
                if WAIT_EVERY and i % WAIT_EVERY == 0:
                    if not await wait_applied(waiters, campaign, result.last_seq, 30):
                        raise SystemExit(f"bench: {campaign}/{result.last_seq} not applied")
                    waited.append((campaign, result.last_seq, time.time()))
                return result

            # The Python batch projector, then the same projection as a SQL projector: a change
            # of kind, safe in place, recorded by the operator's command (S33).
            for name, app in (("outbox", "_apps:visible"), ("outbox_sql", "_apps:visible_sql")):
                if name == "outbox_sql":
                    operator = await db.connect(dsn)  # the operations take outbox's codecs
                    try:
                        await redefine_projector(
                            operator, "visible", registry=visible_sql_app().registry, reason="bench"
                        )
                    finally:
                        await operator.close()
                await conn.execute("TRUNCATE bench_visible")
                waited.clear()
                worker = start([str(WORKER), "--app", app, "--concurrency", "2"], dsn)
                await asyncio.sleep(2)  # connected and listening (a bench may wait; tests never)
                window = CpuWindow([worker.pid])
                await paced(rate, seconds, send_outbox)
                await wait_until(conn, "SELECT count(*) FROM bench_visible", total, 60)
                window.close()
                stop(worker)
                figures[name] = percentiles([r[0] for r in await conn.fetch(OUTBOX_LATENCY)])
                figures[name].update(_cpu(window, worker.pid, total))
                columns = [list(c) for c in zip(*waited, strict=True)] or [[], [], []]
                if waited and name == "outbox":
                    waits = await conn.fetch(WAIT_LATENCY, *columns)
                    figures["wait_applied"] = percentiles([r[0] for r in waits])

            raw = start([sys.executable, str(HERE / "latency.py"), "--raw-listener", dsn], dsn)
            await asyncio.sleep(2)
            window = CpuWindow([raw.pid])

            async def send_raw(i: int) -> object:
                return await pool.fetchval(RAW_ENQUEUE, f"c-{i % spread}", i)

            await paced(rate, seconds, send_raw)
            await wait_until(conn, "SELECT count(*) FROM raw_visible", total, 60)
            window.close()
            stop(raw)
            figures["raw_listen"] = percentiles([r[0] for r in await conn.fetch(RAW_LATENCY)])
            figures["raw_listen"].update(_cpu(window, raw.pid, total))
        finally:
            await pool.close()
            await waiters.close()
            await conn.close()
    print(
        f"append commit -> visible at {rate} events/s over {spread:,} campaigns for {seconds:g}s,"
        " durable server"
    )
    labels = {
        "outbox": "outbox (Python batch projector)",
        "outbox_sql": "outbox (SQL projector)",
        "wait_applied": "wait_applied returns, after the projection's commit",
        "raw_listen": "raw LISTEN loop",
    }
    for name, f in figures.items():
        p50, p95, p99 = f["p50_ms"], f["p95_ms"], f["p99_ms"]
        line = f"  {labels[name]:<52} p50 {p50:6.2f}  p95 {p95:6.2f}  p99 {p99:6.2f} ms"
        if "busy_pct" in f:  # the machine, and the consumer's own CPU, while it ran
            line += f"  machine busy {f['busy_pct']:3.0f}%"
            line += f", consumer {f['consumer_cpu_ms_per_event']:.2f} ms CPU/event"
        print(line)
    for name in ("outbox", "outbox_sql"):  # issue 59's targets, on this machine
        f = figures[name]
        print(
            f"  target {labels[name]:<45} p50 {verdict(f['p50_ms'], P50_BAR, at_most=True)}"
            f", p99 {verdict(f['p99_ms'], P99_BAR, at_most=True)} ms"
        )
    return figures


def _cpu(window: CpuWindow, pid: int, events: int) -> dict[str, float]:
    """The machine's busy share and the consumer process's CPU per event over a case."""
    if window.busy is None or pid not in window.cpu_s:
        return {}
    return {
        "busy_pct": round(100 * window.busy, 1),
        "consumer_cpu_ms_per_event": round(1e3 * window.cpu_s[pid] / events, 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--campaigns",
        default="8,1000",
        type=lambda text: [int(n) for n in text.split(",")],
        help="the spreads to run, comma-separated (default 8,1000)",
    )
    parser.add_argument("--raw-listener", metavar="DSN", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_listener:
        asyncio.run(raw_listener(args.raw_listener))
    else:
        asyncio.run(main(args.rate, args.seconds, args.campaigns))
