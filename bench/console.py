#!/usr/bin/env python3
"""The console at scale: page render times at 1M work rows, and its load on a running drain.

Usage: python bench/console.py [--campaigns 10000] [--rows-per-campaign 100] [--renders 20]
       [--drain-events 100000] [--rounds 5] [--pages-only]
State (one durable server): 1M work rows over 10,000 campaigns, as an outage leaves them:
100k dead rows (every row of 1,000 campaigns, one error group per projector), 1,000
campaigns with a failed head, the rest pending and not due (a backlog waiting for a retry),
each row with its journal event; analyzed.
- Pages: p50/p95 of a full render (reads and HTML, through the ASGI app in-process) of the
  overview (its figures read afresh for every render: the poller's interval set to 0), blocked
  campaigns, failures grouped by projector and error, the rows list (first page, one status,
  one error group, the 51st page by its cursor), one row in full and a group's dry run (10,000
  rows listed); and of the overview's read alone.
- Load: a drain of `--drain-events` fresh events (batch projector, 2 claim loops) with the
  console closed, then open (`maintenance console` serving at its default refresh, one tab
  polling its live fragment every second), alternating `--rounds` times on
  the same state after a warm-up drain; events/s, and the ratio of the medians open/closed
  (the bar: >= 0.95). The totals are checked against the generator's sums after every drain
  (exactly once).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import asyncpg
import httpx
from _apps import outbox_app
from _support import bench_database, check_totals, load_backlog, percentiles, print_json

from outbox import Settings
from outbox.console import create_app
from outbox.console.overview import read_overview
from outbox.queue.settle import refresh_campaigns
from outbox.worker.runtime import drain_now, open_pool

MAINTENANCE = Path(sys.executable).parent / "maintenance"

# $1 campaigns of $2 rows: the first tenth all dead (three error groups), the next tenth with a
# failed head, the rest pending; nothing due for a day (an outage's backlog).
STATE = """
INSERT INTO outbox.campaign_head_keys (bucket, campaign_id, last_seq)
SELECT outbox.outbox_bucket('c-' || c), 'c-' || c, $2::integer FROM generate_series(0,
    $1::integer - 1) c;
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT outbox.outbox_bucket('c-' || c), 'c-' || c, s, 'bench.tick',
    jsonb_build_object('amount', s % 7)
FROM generate_series(0, $1::integer - 1) c, generate_series(1, $2::integer) s;
INSERT INTO outbox.projection_apply_outbox
    (bucket, campaign_id, seq, event_type, status, attempt_count, next_attempt_at, last_error)
SELECT outbox.outbox_bucket('c-' || c), 'c-' || c, s, 'bench.tick',
       CASE WHEN c < $1::integer / 10 THEN 'dead'
            WHEN c < $1::integer / 5 AND s = 1 THEN 'failed' ELSE 'pending' END,
       CASE WHEN c < $1::integer / 10 THEN 8 WHEN c < $1::integer / 5 AND s = 1 THEN 3 ELSE 0 END,
       clock_timestamp() + interval '1 day',
       CASE WHEN c < $1::integer / 10
                THEN format('projector %L: ValueError: bad amount %s in order %s',
                            'totals_' || (c % 3), -s, c)
            WHEN c < $1::integer / 5 AND s = 1
                THEN 'projector ''mailer'': TimeoutError: smtp timed out after 30 s' END
FROM generate_series(0, $1::integer - 1) c, generate_series(1, $2::integer) s
"""
PAGES = {
    "overview": "/",
    "blocked": "/blocked",
    "failures": "/failures",
    "rows": "/rows",
    "rows, one status": "/rows?status=failed",
    "row": "/row?campaign_id=c-7&seq=50",
    "campaign (100 rows of 100)": "/campaign?id=c-7",
}
DRAIN_CAMPAIGNS = 500


async def load_state(dsn: str, campaigns: int, per_campaign: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ALTER TABLE outbox.projection_apply_outbox DISABLE TRIGGER USER")
        for statement in STATE.split(";\n"):
            await conn.execute(statement, campaigns, per_campaign)
        await conn.execute("ALTER TABLE outbox.projection_apply_outbox ENABLE TRIGGER USER")
        ids = [f"c-{c}" for c in range(campaigns)]
        for i in range(0, len(ids), 2000):  # campaign rows, as `maintenance reconcile` makes
            await refresh_campaigns(conn, ids[i : i + 2000], park=False, removable=())
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def time_pages(dsn: str, renders: int) -> dict[str, dict[str, float]]:
    pool = await open_pool(Settings(dsn=dsn), max_size=2)
    figures: dict[str, dict[str, float]] = {}
    try:
        app = create_app(pool, settings=Settings(dsn=dsn), refresh=0.001)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            paths = dict(PAGES)
            groups = (await client.get("/api/failures")).json()["data"]["groups"]
            group = next(g["fingerprint"] for g in groups if g["status"] == "dead")
            paths["rows, one error group"] = f"/rows?error={group}"
            after = None
            for _ in range(50):  # the 51st page, by its cursor
                page = (await client.get("/api/rows", params={"after": after or ""})).json()
                after = page["data"]["page"]["after"]
            paths["rows, page 51"] = f"/rows?after={after}"
            paths["group dry run (10,000 rows)"] = f"/failures/requeue?fingerprint={group}"
            blocked = (await client.get("/api/blocked")).json()["data"]["after"]
            paths["blocked, page 2"] = f"/blocked?{urlencode({'after': blocked})}"
            for name, path in paths.items():
                samples = []
                for _ in range(renders + 2):
                    start = time.perf_counter()
                    page = await client.get(path)
                    samples.append(time.perf_counter() - start)
                    assert page.status_code == 200, (path, page.text[:200])
                figures[name] = percentiles(samples[2:])  # the first two warm the plans
        samples = []
        for _ in range(renders + 2):
            start = time.perf_counter()
            await read_overview(pool, park=False, bound=10_000)
            samples.append(time.perf_counter() - start)
        figures["overview read"] = percentiles(samples[2:])
    finally:
        await pool.close()
    return figures


async def drain_once(dsn: str, events: int, tag: str) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE bench_totals")
        await load_backlog(conn, campaigns=DRAIN_CAMPAIGNS, events=events, prefix=tag, clear=False)
        settings = Settings(dsn=dsn, batch_size=100)
        pool = await open_pool(settings, max_size=3)
        try:
            start = time.perf_counter()
            counts = await drain_now(outbox_app(settings, kind="batch"), pool, concurrency=2)
            elapsed = time.perf_counter() - start
        finally:
            await pool.close()
        assert counts.applied == events, counts
        await check_totals(conn, events)
    finally:
        await conn.close()
    return events / elapsed


class OpenConsole:
    """`maintenance console` serving (figures read once per refresh, 5 s by default, however
    many tabs poll), and one tab polling its live fragment every second."""

    def __init__(self, dsn: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        env["OUTBOX_DSN"] = dsn
        self.proc = subprocess.Popen(
            [str(MAINTENANCE), "console", "--port", "0"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        assert line.startswith("console: "), line
        self.url = line.split()[1]
        self.polls = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        with httpx.Client(timeout=30) as client:
            client.get(self.url)
            while not self.stop.wait(1.0):
                assert client.get(self.url + "fragments/live").status_code == 200
                self.polls += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.proc.terminate()
        self.proc.wait(timeout=30)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--campaigns", type=int, default=10_000)
    parser.add_argument("--rows-per-campaign", type=int, default=100)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--drain-events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pages-only", action="store_true", help="Skip the drains.")
    args = parser.parse_args()
    async with bench_database() as dsn:
        started = time.perf_counter()
        await load_state(dsn, args.campaigns, args.rows_per_campaign)
        rows = args.campaigns * args.rows_per_campaign
        print(f"state: {rows:,} work rows loaded in {time.perf_counter() - started:.0f} s")
        pages = await time_pages(dsn, args.renders)
        print(f"{'page':<30}{'p50 ms':>10}{'p95 ms':>10}")
        for name, cut in pages.items():
            print(f"{name:<30}{cut['p50_ms']:>10.1f}{cut['p95_ms']:>10.1f}")
        if args.pages_only:
            print_json("console", {"work_rows": rows, "dead_rows": rows // 10, "pages": pages})
            return
        closed: list[float] = []
        opened: list[float] = []
        polls = 0
        await drain_once(dsn, args.drain_events // 4, "warm-")  # caches and plans, not counted
        for r in range(args.rounds):
            closed.append(await drain_once(dsn, args.drain_events, f"closed-{r}-"))
            console = OpenConsole(dsn)
            try:
                opened.append(await drain_once(dsn, args.drain_events, f"open-{r}-"))
            finally:
                console.close()
                polls += console.polls
        ratio = statistics.median(opened) / statistics.median(closed)
        print(f"drain, console closed: {' '.join(f'{x:,.0f}' for x in closed)} events/s")
        print(f"drain, console open:   {' '.join(f'{x:,.0f}' for x in opened)} events/s")
        print(f"open / closed (medians): {ratio:.3f}x ({polls} live polls served)")
        print_json(
            "console",
            {
                "work_rows": rows,
                "dead_rows": rows // 10,
                "pages": pages,
                "drain_closed_events_per_s": closed,
                "drain_open_events_per_s": opened,
                "open_over_closed": ratio,
            },
        )


if __name__ == "__main__":
    asyncio.run(main())
