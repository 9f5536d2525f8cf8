"""A database the workers cannot get a connection from: every slot of the connection table
taken (SQLSTATE 53300), and the server down while a worker starts (connection refused).

Workers already serving lose their sessions while the table is full and must wait, not exit; a
worker started meanwhile must wait too (one `database.waiting` line, then
`database.available`), and all of them apply what was appended meanwhile once connections free
up. Appends meet the same outage as `AppendOutcomeUnknown` and are retried with their keys.
"""

from __future__ import annotations

import contextlib

import anyio
import asyncpg
import pytest
from harness import Fleet, finish, scaled, two_workers_under_load

from helpers import wait_for
from outbox import db
from outbox.testing.localpg import LocalCluster

pytestmark = pytest.mark.timeout(900)

TERMINATE_WORKERS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE 'outbox-%'"
)


async def fill_connection_table(dsn: str, held: list[asyncpg.Connection]) -> None:
    """Connections into `held` until the server refuses one more (superuser slots included:
    the workers connect as a superuser)."""
    while True:
        try:
            held.append(await asyncpg.connect(dsn))
        except asyncpg.TooManyConnectionsError:
            return


async def take_every_slot(admin: asyncpg.Connection, dsn: str) -> list[asyncpg.Connection]:
    """Fill the connection table, end the workers' sessions, and for a second take back every
    slot their exits free (their first reconnect comes later), so none is left for them."""
    held: list[asyncpg.Connection] = []
    await fill_connection_table(dsn, held)
    await admin.execute(TERMINATE_WORKERS)
    with anyio.move_on_after(1.0):
        while True:
            await fill_connection_table(dsn, held)
            await anyio.sleep(0.02)
    return held


def waits(fleet: Fleet, name: str) -> int:
    """How many times `name` logged that it started waiting for the database."""
    return sum(p.read_text().count('"database.waiting"') for p in fleet.logs.glob(f"{name}-*"))


async def test_a_full_connection_table_and_a_server_not_up(
    pool: db.Pool, dsn: str, fleet: Fleet, cluster: LocalCluster
) -> None:
    generator = two_workers_under_load(fleet, pool, dsn, "full", 8, pause=0.05)
    cycles = scaled(3)
    faults = 0
    admin = await asyncpg.connect(dsn)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(generator.run)
            for cycle in range(cycles):
                await anyio.sleep(1.0)  # fault pacing: appends and batches run in between
                held = await take_every_slot(admin, dsn)
                try:
                    starter = f"s{cycle}"
                    fleet.start(starter, "--concurrency", "2")  # starts into a full table
                    with anyio.fail_after(60):
                        while not waits(fleet, starter):  # noqa: ASYNC110 - a log, polled
                            await anyio.sleep(0.05)
                finally:
                    for conn in held:
                        conn.terminate()
                faults += 1
                fleet.check()
            # The server down while a worker starts: it waits for the server, not exits.
            await admin.close()
            await anyio.to_thread.run_sync(cluster.stop)
            fleet.start("late", "--concurrency", "2")
            with anyio.fail_after(60):
                while not waits(fleet, "late"):  # noqa: ASYNC110 - a log, polled
                    await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(cluster.start)
            faults += 1
            admin = await asyncpg.connect(dsn)

            async def served() -> bool:
                return '"database.available"' in fleet.log_of["late"].read_text()

            await wait_for(served, within=60)
            await anyio.sleep(1.0)
            generator.stop()
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    for name in [f"s{c}" for c in range(cycles)] + ["late"]:
        assert waits(fleet, name) == 1, f"{name}: one line per wait, not per try"
    notes = f"appends with unknown outcome, retried with their key: {generator.unknown_outcomes}"
    await finish("connections_exhausted", pool, fleet, generator, faults=faults, notes=notes)
