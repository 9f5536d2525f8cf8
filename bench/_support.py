"""What the bench scripts share: a migrated scratch database on a durable server, the bench
projection (per-campaign totals, one upsert), a backlog loader and the figure printers.

OUTBOX_BENCH_DSN (a role with CREATEDB) when set, else a throwaway local cluster with fsync on,
so figures include the cost of commits.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson

from outbox import Event, Settings, append
from outbox.queue.settle import refresh_campaigns
from outbox.schema import migrate
from outbox.testing.localpg import LocalCluster

# The read model every contender maintains: events and amount per campaign.
PROJECTION = """
CREATE TABLE IF NOT EXISTS bench_totals (
    campaign_id text PRIMARY KEY,
    events      bigint NOT NULL,
    amount      bigint NOT NULL
);
-- The same upsert as a SQL projector's function: the batch's events as one JSON array. In
-- PL/pgSQL, whose statements' plans a session keeps (a LANGUAGE sql function's body is planned
-- again in every transaction before PostgreSQL 18), as docs/projections.md advises.
CREATE OR REPLACE FUNCTION public.bench_totals_apply(events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.bench_totals AS t (campaign_id, events, amount)
    SELECT e->>'campaign_id', count(*), sum((e->'payload'->>'amount')::bigint)
    FROM jsonb_array_elements(events) AS e
    GROUP BY 1
    ORDER BY 1
    ON CONFLICT (campaign_id) DO UPDATE
    SET events = t.events + excluded.events, amount = t.amount + excluded.amount;
END
$$;
"""
# One statement for a whole batch, from arrays (what a batch projector and the raw loop run).
UPSERT_MANY = """
INSERT INTO bench_totals AS t (campaign_id, events, amount)
SELECT e.campaign_id, count(*), sum(e.amount)
FROM unnest($1::text[], $2::bigint[]) AS e(campaign_id, amount)
GROUP BY e.campaign_id
ORDER BY e.campaign_id
ON CONFLICT (campaign_id) DO UPDATE
SET events = t.events + excluded.events, amount = t.amount + excluded.amount
"""
# One statement per event (a per-event projector, a pgqueuer job).
UPSERT_ONE = """
INSERT INTO bench_totals AS t (campaign_id, events, amount) VALUES ($1, 1, $2)
ON CONFLICT (campaign_id) DO UPDATE
SET events = t.events + 1, amount = t.amount + excluded.amount
"""
EVENT_TYPE = "bench.tick"

# A backlog of $2 events over $1 campaigns named $3 || n, enqueued oldest first across
# campaigns, the way appends leave it (heads, journal, work rows; `load_backlog` then queues
# the campaigns).
LOAD_BACKLOG = """
WITH heads AS (
    INSERT INTO outbox.campaign_head_keys (bucket, campaign_id, last_seq)
    SELECT outbox.outbox_bucket($3::text || c), $3::text || c,
           ($2::integer - c - 1) / $1::integer + 1
    FROM generate_series(0, least($1::integer, $2::integer) - 1) c
), journal AS (
    INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
    SELECT outbox.outbox_bucket($3::text || (g % $1::integer)), $3::text || (g % $1::integer),
           g / $1::integer + 1, 'bench.tick', jsonb_build_object('amount', g % 7)
    FROM generate_series(0, $2::integer - 1) g
    RETURNING bucket, campaign_id, seq, event_type
)
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT bucket, campaign_id, seq, event_type FROM journal ORDER BY seq, campaign_id
"""
# The outbox's tables named $1, a partitioned one as the sum of its partitions (the campaign
# rows, S26): heap and index bytes, dead and live versions as the statistics count them.
TABLE_SIZES = """
SELECT coalesce(p.relname, c.relname)::text AS name,
       sum(pg_relation_size(c.oid))::bigint AS heap, sum(pg_indexes_size(c.oid))::bigint AS idx,
       sum(coalesce(s.n_dead_tup, 0))::bigint AS dead,
       sum(coalesce(s.n_live_tup, 0))::bigint AS live
FROM pg_class c
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
LEFT JOIN pg_class p ON p.oid = i.inhparent
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE coalesce(p.relname, c.relname) = ANY ($1::text[]) AND c.relkind = 'r'
  AND c.relnamespace = 'outbox'::regnamespace
GROUP BY 1
"""
# The outbox's campaign-keyed tables, emptied before each case with the bench's projection, and
# the projectors recorded: each case starts from nothing, its projector (another kind under
# the same name) recorded afresh (S33).
OUTBOX_TABLES = (
    "outbox.event_journal, outbox.campaign_head_keys, outbox.projection_apply_outbox,"
    " outbox.projection_apply_campaigns, outbox.projection_checkpoint_keys,"
    " outbox.projection_checkpoint_moves,"
    " outbox.processed_markers, outbox.append_idempotency_keys,"
    " outbox.outbox_projectors, outbox.outbox_projector_live"
)
CLEAR = f"TRUNCATE {OUTBOX_TABLES}, bench_totals"


@asynccontextmanager
async def bench_database(
    *, commit_timestamps: bool = False, projection: str = PROJECTION, statements: bool = False
) -> AsyncIterator[str]:
    """Yield the DSN of a fresh migrated database with the bench projection (`projection`: its
    DDL); drop it (and any cluster) afterwards. `commit_timestamps`: track_commit_timestamp on;
    `statements`: pg_stat_statements loaded and created in the database (each set on our own
    cluster; a given server must have them)."""
    cluster: LocalCluster | None = None
    server = os.environ.get("OUTBOX_BENCH_DSN", "")
    if not server:
        cluster = LocalCluster.temporary(durable=True)
        server = cluster.start()
        if commit_timestamps or statements:
            admin = await asyncpg.connect(server)
            if commit_timestamps:
                await admin.execute("ALTER SYSTEM SET track_commit_timestamp = on")
            if statements:
                await admin.execute(
                    "ALTER SYSTEM SET shared_preload_libraries = pg_stat_statements"
                )
            await admin.close()
            cluster.restart()
    try:
        name = f"bench_{uuid.uuid4().hex[:8]}"
        admin = await asyncpg.connect(server)
        try:
            if commit_timestamps and await admin.fetchval("SHOW track_commit_timestamp") != "on":
                sys.exit("bench: this benchmark needs track_commit_timestamp = on on the server")
            await admin.execute(f'CREATE DATABASE "{name}"')
            dsn = server.rsplit("/", 1)[0] + f"/{name}"
            conn = await asyncpg.connect(dsn)
            try:
                if statements:
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                await migrate(conn)
                await conn.execute(projection)
            finally:
                await conn.close()
            yield dsn
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()
    finally:
        if cluster is not None:
            cluster.destroy()


async def load_backlog(
    conn: asyncpg.Connection, *, campaigns: int, events: int, prefix: str = "c-", clear: bool = True
) -> None:
    """The backlog of LOAD_BACKLOG in campaigns `prefix`0.., after emptying the tables (or,
    `clear=False`, beside what they hold), queued and analyzed."""
    if clear:
        await conn.execute(CLEAR)
    await conn.execute(LOAD_BACKLOG, campaigns, events, prefix)
    # Queue the campaigns, as the append does for each (rows written around it need this).
    ids = [f"{prefix}{c}" for c in range(min(campaigns, events))]
    await refresh_campaigns(conn, ids, park=False, removable=())
    await conn.execute("ANALYZE outbox.projection_apply_outbox")
    await conn.execute("ANALYZE outbox.projection_apply_campaigns")
    await conn.execute("ANALYZE outbox.event_journal")


async def check_totals(
    conn: asyncpg.Connection, events: int, *, table: str = "bench_totals"
) -> None:
    """Every event applied exactly once: the totals in `table` against the generator's sums."""
    got = tuple(await conn.fetchrow(f"SELECT sum(events), sum(amount) FROM {table}") or ())
    want = (events, sum(g % 7 for g in range(events)))
    if got != want:
        raise SystemExit(f"bench: totals {got} != expected {want}")


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 of `samples` (seconds) in milliseconds."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50_ms": cuts[49] * 1e3, "p95_ms": cuts[94] * 1e3, "p99_ms": cuts[98] * 1e3}


def machine() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).date().isoformat(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def verdict(value: float, bar: float, *, at_most: bool) -> str:
    """`value` against an issue's bar: "<= 5 met" / ">= 0.75 missed"."""
    met = value <= bar if at_most else value >= bar
    return f"{'<=' if at_most else '>='} {bar:g} {'met' if met else 'MISSED'}"


class CpuWindow:
    """The machine's busy share and chosen processes' CPU seconds over a window (Linux
    /proc; elsewhere it reads nothing): what says whether a figure is bound by a saturated
    machine, beside its baseline's."""

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self.pids = list(pids)
        self._start = self._read()
        self.busy: float | None = None
        self.cpu_s: dict[int, float] = {}

    @staticmethod
    def _machine() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(t) for t in f.readline().split()[1:]]
        except OSError:
            return None
        return sum(ticks), ticks[3] + ticks[4]  # idle + iowait

    def _read(self) -> tuple[tuple[int, int] | None, dict[int, int]]:
        per: dict[int, int] = {}
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                per[pid] = int(fields[11]) + int(fields[12])  # utime + stime
            except OSError:
                continue
        return self._machine(), per

    def close(self) -> CpuWindow:
        (m0, p0), (m1, p1) = self._start, self._read()
        if m0 and m1 and m1[0] > m0[0]:
            self.busy = 1 - (m1[1] - m0[1]) / (m1[0] - m0[0])
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.cpu_s = {pid: (p1[pid] - p0[pid]) / hz for pid in p1 if pid in p0}
        return self


def print_json(bench: str, figures: dict[str, Any]) -> None:
    """The one JSON line of a bench script's figures."""
    print(orjson.dumps({"bench": bench, **machine(), **figures}).decode(), flush=True)


def decode_amounts(payloads: Sequence[str]) -> list[int]:
    return [orjson.loads(p)["amount"] for p in payloads]


async def upsert_chunk(conn: asyncpg.Connection, upsert: str, rows: Sequence[Any]) -> None:
    """A raw pass's chunk of journal rows (`campaign_id`, `payload` as text), decoded in one
    call and sent as the set-wise `upsert` (UPSERT_MANY's arguments)."""
    payloads = orjson.loads("[" + ",".join(r["payload"] for r in rows) + "]")
    await conn.execute(upsert, [r["campaign_id"] for r in rows], [p["amount"] for p in payloads])


# Commit -> visible of the events `visible` (`_apps.visible_app`) applied that were appended
# in a window ($1, $2), by their commit timestamps (track_commit_timestamp).
WINDOW_LATENCY = """
SELECT extract(
    epoch FROM pg_xact_commit_timestamp(v.xmin) - pg_xact_commit_timestamp(j.xmin)
)::float8
FROM bench_visible v JOIN outbox.event_journal j USING (campaign_id, seq)
WHERE j.recorded_at >= $1 AND j.recorded_at < $2
"""


async def window_latency(conn: asyncpg.Connection, since: Any, until: Any) -> dict[str, float]:
    """Percentiles of commit -> visible over the events appended from `since` to `until`."""
    return percentiles([r[0] for r in await conn.fetch(WINDOW_LATENCY, since, until)])


class Producer:
    """One-event appends at `rate` per second, spread over `campaigns` campaigns named
    `prefix` n, until `stopping` is set; `sent` once it has stopped; each append's seconds with
    when it started (`times`)."""

    def __init__(self, pool: asyncpg.Pool, rate: int, campaigns: int, prefix: str) -> None:
        self.pool, self.rate, self.campaigns, self.prefix = pool, rate, campaigns, prefix
        self.sent = 0
        self.stopping = asyncio.Event()
        self.settings = Settings()
        self.times: list[tuple[float, float]] = []

    async def one(self, campaign: str, event: Event) -> None:
        at = time.perf_counter()
        await append(self.pool, campaign, [event], settings=self.settings)
        self.times.append((at, time.perf_counter() - at))

    async def run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        started = time.perf_counter()
        i = 0
        while not self.stopping.is_set():
            delay = started + i / self.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            event = Event(EVENT_TYPE, {"amount": i % 7})
            campaign = f"{self.prefix}{(i * 7919) % self.campaigns}"
            task = asyncio.create_task(self.one(campaign, event))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        await asyncio.gather(*tasks)
        self.sent = i

    def p95_ms(self, since: float, until: float) -> float:
        """The p95 of the appends started in [since, until) (perf_counter), in ms."""
        found = sorted(t for at, t in self.times if since <= at < until)
        return 1e3 * found[int(0.95 * (len(found) - 1))] if found else float("nan")
