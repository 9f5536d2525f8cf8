#!/usr/bin/env python3
"""Append cost of enqueueing: appends/s and latency with enqueueing off, on, and on with inline
apply, 8 writers of 1-event appends, on one durable server, in one run.

Usage: python bench/append.py [--writers N] [--appends N] [--rounds N]
Every append is one call of the append function (`outbox_try_append`). Cases (each append its
own transaction, as `outbox.append` on a pool runs it):
- off: journal only (OUTBOX_ENABLED=false), the baseline;
- on: journal + work row; the campaign already has queued work (a backlog, or a busy
  campaign), so no wake-up is sent;
- on, cold campaigns: every append goes to a campaign with no queued work, so the append
  creates the campaign row and sends the (payload-free) NOTIFY: the worst case of the chosen
  wake-up design;
- on, NOTIFY every append: the previous design (one NOTIFY per append transaction), measured
  by adding a statement trigger that notifies on every enqueue, for comparison;
- on + inline apply: the per-event upsert projector applied in the append's transaction.
Then the adapters, each append in the caller's own transaction (BEGIN, the append, COMMIT: what
a domain write with its events costs), enqueueing on, against asyncpg doing the same:
- asyncpg, own transaction: `async with conn.transaction(): await outbox.append(conn, ...)`;
- SQLAlchemy async session: `async with AsyncSession(engine) as s, s.begin(): ...`;
- psycopg async: `async with conn.transaction(): ...` on a psycopg AsyncConnection per writer.
And each stack's own floor: the same transaction with `SELECT 1` in place of the append, so a
stack's overhead (SQLAlchemy's session, psycopg's protocol) is told apart from the append's.
Prints appends/s, p50/p95/p99 and ratios against `off` (adapters: against asyncpg's own
transaction), and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import psycopg
from _apps import outbox_app
from _support import CLEAR, EVENT_TYPE, bench_database, percentiles, print_json
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from outbox import Event, Settings, append, db

NOTIFY_ALWAYS = """
CREATE OR REPLACE FUNCTION bench_notify_always() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox.outbox_work', '');
    RETURN NULL;
END $$;
CREATE TRIGGER bench_notify_always AFTER INSERT ON outbox.projection_apply_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION bench_notify_always();
"""
DROP_NOTIFY_ALWAYS = "DROP TRIGGER bench_notify_always ON outbox.projection_apply_outbox"
SELECT_1 = text("SELECT 1")

# An append by writer `w` to `campaign`, its `i`-th.
Appender = Callable[[int, str, int], Awaitable[object]]
ADAPTERS = ("asyncpg, own transaction", "SQLAlchemy async session", "psycopg async")
FLOORS = ("asyncpg, SELECT 1 instead", "SQLAlchemy, SELECT 1 instead", "psycopg, SELECT 1 instead")


async def run_case(
    pool: db.Pool,
    appender: Appender,
    *,
    writers: int,
    appends: int,
    cold: bool,
    clear: str = CLEAR,
) -> dict[str, float]:
    await pool.execute(clear)
    latencies: list[float] = []

    async def writer(w: int) -> None:
        for i in range(appends):
            campaign = f"w{w}-{i}" if cold else f"w{w}-{i % 50}"
            started = time.perf_counter()
            await appender(w, campaign, i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    rate = writers * appends / (time.perf_counter() - started)
    return {"appends_per_s": rate, **percentiles(latencies)}


def tick(i: int) -> list[Event]:
    return [Event(EVENT_TYPE, {"amount": i % 7})]


@asynccontextmanager
async def appenders(dsn: str, pool: db.Pool, writers: int) -> AsyncIterator[dict[str, Appender]]:
    """Every case's appender, by name, with the drivers' connections they need."""
    off = Settings(dsn=dsn, enabled=False)
    on = Settings(dsn=dsn, enabled=True)
    inline = outbox_app(Settings(dsn=dsn, enabled=True, inline_apply=True), kind="per-event")
    async with AsyncExitStack() as stack:
        engine = create_async_engine(
            "postgresql+asyncpg://" + dsn.split("://", 1)[1], pool_size=writers, max_overflow=0
        )
        stack.push_async_callback(engine.dispose)
        psycopgs = [
            await stack.enter_async_context(await psycopg.AsyncConnection.connect(dsn))
            for _ in range(writers)
        ]

        def plain(settings: Settings) -> Appender:
            async def go(w: int, campaign: str, i: int) -> object:
                return await append(pool, campaign, tick(i), settings=settings)

            return go

        async def inline_append(w: int, campaign: str, i: int) -> object:
            return await inline.append(pool, campaign, tick(i))

        async def asyncpg_tx(w: int, campaign: str, i: int) -> object:
            async with pool.acquire() as conn, conn.transaction():
                return await append(conn, campaign, tick(i), settings=on)

        async def sqlalchemy_tx(w: int, campaign: str, i: int) -> object:
            async with AsyncSession(engine) as session, session.begin():
                return await append(session, campaign, tick(i), settings=on)

        async def psycopg_tx(w: int, campaign: str, i: int) -> object:
            conn = psycopgs[w]
            async with conn.transaction():
                return await append(conn, campaign, tick(i), settings=on)

        async def asyncpg_floor(w: int, campaign: str, i: int) -> object:
            async with pool.acquire() as conn, conn.transaction():
                return await conn.fetchval("SELECT 1")

        async def sqlalchemy_floor(w: int, campaign: str, i: int) -> object:
            async with AsyncSession(engine) as session, session.begin():
                return (await session.execute(SELECT_1)).scalar()

        async def psycopg_floor(w: int, campaign: str, i: int) -> object:
            conn = psycopgs[w]
            async with conn.transaction(), conn.cursor() as cur:
                await cur.execute("SELECT 1")
                return await cur.fetchone()

        yield {
            "off": plain(off),
            "on": plain(on),
            "on, cold campaigns": plain(on),
            "on, NOTIFY every append": plain(on),
            "on + inline apply": inline_append,
            ADAPTERS[0]: asyncpg_tx,
            ADAPTERS[1]: sqlalchemy_tx,
            ADAPTERS[2]: psycopg_tx,
            FLOORS[0]: asyncpg_floor,
            FLOORS[1]: sqlalchemy_floor,
            FLOORS[2]: psycopg_floor,
        }


def base_of(name: str) -> str:
    if name in FLOORS:
        return FLOORS[0]
    return ADAPTERS[0] if name in ADAPTERS else "off"


async def main(writers: int, appends: int, rounds: int) -> None:
    runs: dict[str, list[dict[str, float]]] = {}
    async with bench_database() as dsn:
        pool = await db.create_pool(dsn, min_size=writers, max_size=writers)
        try:
            async with appenders(dsn, pool, writers) as cases:
                print(
                    f"append: {writers} writers x {appends} one-event appends, durable server,"
                    f" {rounds} interleaved rounds (medians; ratios paired within a round)"
                )
                for _ in range(rounds):
                    for name, appender in cases.items():
                        notify = name == "on, NOTIFY every append"
                        if notify:
                            await pool.execute(NOTIFY_ALWAYS)
                        try:
                            figures = await run_case(
                                pool,
                                appender,
                                writers=writers,
                                appends=appends,
                                cold=name == "on, cold campaigns",
                            )
                        finally:
                            if notify:
                                await pool.execute(DROP_NOTIFY_ALWAYS)
                        runs.setdefault(name, []).append(figures)
        finally:
            await pool.close()

    def median(name: str, metric: str) -> float:
        return statistics.median(r[metric] for r in runs[name])

    def ratio(name: str, metric: str) -> float:
        """The median over rounds of the case against its baseline in the same round."""
        pairs = zip(runs[name], runs[base_of(name)], strict=True)
        return statistics.median(r[metric] / b[metric] for r, b in pairs)

    def extra(names: tuple[str, ...], i: int) -> float:
        """Milliseconds per transaction stack `i` spends beyond asyncpg (1000 / rate)."""
        return round(
            1e3 / median(names[i], "appends_per_s") - 1e3 / median(names[0], "appends_per_s"), 3
        )

    cases_out: dict[str, dict[str, float]] = {}
    for name in runs:
        if name == ADAPTERS[0]:
            print("  adapters, each append in the caller's transaction, enqueueing on:")
        if name == FLOORS[0]:
            print("  each stack alone, SELECT 1 in place of the append:")
        rate, p95 = median(name, "appends_per_s"), median(name, "p95_ms")
        rate_x, p95_x = ratio(name, "appends_per_s"), ratio(name, "p95_ms")
        print(
            f"  {name:<26} {rate:>8,.0f} appends/s ({rate_x:4.2f}x)"
            f"  p50 {median(name, 'p50_ms'):6.2f}  p95 {p95:6.2f} ({p95_x:4.2f}x)"
            f"  p99 {median(name, 'p99_ms'):6.2f} ms",
            flush=True,
        )
        cases_out[name] = {
            **{m: round(median(name, m), 3) for m in runs[name][0]},
            "rate_vs_base": round(rate_x, 3),
            "p95_vs_base": round(p95_x, 3),
        }
    for i, stack in ((1, "SQLAlchemy"), (2, "psycopg")):
        print(
            f"  {stack}: {extra(ADAPTERS, i):+.2f} ms per append beyond asyncpg;"
            f" the stack alone {extra(FLOORS, i):+.2f} ms per transaction"
        )
    print_json(
        "append",
        {
            "writers": writers,
            "appends_per_writer": appends,
            "rounds": rounds,
            "cases": cases_out,
            "on_vs_off": cases_out["on"]["rate_vs_base"],
            "on_p95_vs_off": cases_out["on"]["p95_vs_base"],
            "sqlalchemy_vs_asyncpg": cases_out[ADAPTERS[1]]["rate_vs_base"],
            "psycopg_vs_asyncpg": cases_out[ADAPTERS[2]]["rate_vs_base"],
            # Each stack's time per transaction beyond asyncpg's (8 writers, ms): with the
            # append, and alone. Equal figures: the adapter adds nothing the stack does not.
            "sqlalchemy_extra_ms": {"append": extra(ADAPTERS, 1), "alone": extra(FLOORS, 1)},
            "psycopg_extra_ms": {"append": extra(ADAPTERS, 2), "alone": extra(FLOORS, 2)},
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.writers, args.appends, args.rounds))
