"""Failover: a primary and a streaming standby on loopback, the primary stopped mid-drain (fast,
or immediate: what a crash leaves) and the standby promoted.

Appenders (keys, an unknown outcome retried with its key) and three worker processes use a
multi-host DSN with `target_session_attrs=read-write`, so every reconnect finds whichever server
is the primary; a third worker's DSN lists the standby first and asks nothing of it, so it
starts on a server that cannot take writes and must wait, not exit, until that server is
promoted. After the failover the generator's record is compared with what the promoted server
holds:
- synchronous replication (`synchronous_standby_names`, `synchronous_commit = on`): every
  acknowledged append is there, every event applied once, in order; every count zero;
- asynchronous replication: acknowledged appends the promoted server lacks are measured and
  reported (the promise that setting does not make), and of what it holds nothing is lost,
  applied twice or out of order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import asyncpg
import pytest
from faults_app import SCHEMA
from harness import FAST, Fleet, Generator, record, tally, wait_drained

from helpers import run_cli, wait_for
from outbox import Settings, db
from outbox.errors import LocalClusterError
from outbox.schema import migrate
from outbox.testing.localpg import LocalCluster, find_bindir

pytestmark = pytest.mark.timeout(600)

# The primary commits locally before it answers (the non-durable test cluster turns that off).
PRIMARY = ["synchronous_commit = on", "wal_level = replica", "max_wal_senders = 10"]


@pytest.fixture
def pair() -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """A running primary (migrated, with the witness table) and its streaming standby."""
    try:
        find_bindir()
    except LocalClusterError as exc:  # the tier's conftest skips the same way
        pytest.skip(f"failover needs PostgreSQL binaries: {exc}")
    primary = LocalCluster.temporary()
    standby: LocalCluster | None = None
    try:
        primary.init()
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(PRIMARY) + "\n")
        primary.start()
        anyio.run(_prepare, primary.dsn)
        standby = LocalCluster.standby_of(primary)
        standby.start()
        yield primary, standby
    finally:
        for cluster in (standby, primary):
            if cluster is not None:
                cluster.destroy()


async def _prepare(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        await conn.execute(SCHEMA)
    finally:
        await conn.close()


def multi_host(*clusters: LocalCluster, attrs: str | None = "read-write") -> str:
    hosts = ",".join(f"127.0.0.1:{c.port}" for c in clusters)
    query = f"?target_session_attrs={attrs}" if attrs else ""
    return f"postgresql://postgres@{hosts}/postgres{query}"


async def _replicating(primary: LocalCluster, state: str) -> None:
    admin = await asyncpg.connect(primary.dsn)
    try:

        async def streaming() -> bool:
            got = await admin.fetchval(
                "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
            )
            return bool(got == state)

        if state == "sync":
            await admin.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            await admin.execute("SELECT pg_reload_conf()")
        await wait_for(streaming, within=60)
    finally:
        await admin.close()


@asynccontextmanager
async def pool_on(dsn: str) -> AsyncIterator[db.Pool]:
    pool = await db.create_pool(dsn, min_size=1, max_size=8)
    try:
        yield pool
    finally:
        pool.terminate()  # connections to a stopped server: closing them politely hangs


@pytest.mark.parametrize("stop", ["fast", "immediate"])
@pytest.mark.parametrize("replication", ["sync", "async"])
async def test_failover_to_a_promoted_standby(
    pair: tuple[LocalCluster, LocalCluster], tmp_path: Path, replication: str, stop: str
) -> None:
    primary, standby = pair
    await _replicating(primary, replication)
    health = run_cli("maintenance", "health", dsn=standby.dsn)
    assert health.returncode == 1
    assert "read-only: the server is in recovery" in health.stderr
    dsn = multi_host(primary, standby)
    fleet = Fleet(dsn, tmp_path)
    fleet.env |= FAST
    try:
        for name in ("w1", "w2"):
            fleet.start(name, "--concurrency", "2")
        fleet.env["OUTBOX_DSN"] = multi_host(standby, primary, attrs=None)
        fleet.start("w3", "--concurrency", "2")  # starts on the standby: it must wait
        fleet.env.pop("OUTBOX_DSN")
        async with pool_on(dsn) as pool:
            generator = Generator(pool, Settings(dsn=dsn), [f"fo-{i:02d}" for i in range(8)])
            async with anyio.create_task_group() as tg:
                tg.start_soon(generator.run)
                await wait_for(lambda: _applied_some(primary.dsn), within=60)

                async def w3_waits() -> bool:  # on the standby, before it is promoted
                    return _waited(fleet, "w3", served=False)

                await wait_for(w3_waits, within=60)
                await anyio.to_thread.run_sync(primary.stop, stop)
                await anyio.to_thread.run_sync(standby.promote)
                mark = generator.events

                async def appended_after() -> bool:  # the promoted server takes appends
                    return generator.events >= mark + 200

                await wait_for(appended_after, within=120)
                generator.stop()
        async with pool_on(standby.dsn) as promoted:
            fleet.check()
            await wait_drained(promoted)
            await fleet.stop()
            journal = {
                r["uid"]
                for r in await promoted.fetch(
                    "SELECT payload->>'uid' AS uid FROM outbox.event_journal WHERE event_type "
                    "= 'step'"
                )
            }
            held = {c: [u for u in uids if u in journal] for c, uids in generator.expected.items()}
            missing = generator.events - sum(map(len, held.values()))
            notes = (
                f"{replication} replication, {stop} stop: acknowledged events the promoted "
                f"server lacks: {missing}; appends with unknown outcome, retried with their key: "
                f"{generator.unknown_outcomes}; w3 waited on the standby: "
                f"{_waited(fleet, 'w3')}"
            )
            result = await tally(
                f"failover_{replication}_{stop}", promoted, held, fleet, faults=1, notes=notes
            )
    finally:
        fleet.kill_all()
    record(result)
    assert result.clean, result.line() + f" unplanned={fleet.unplanned[:3]}"
    assert _waited(fleet, "w3")
    if replication == "sync":
        assert missing == 0, result.line()


async def _applied_some(dsn: str) -> bool:
    """Mid-drain: the workers have applied events and more are queued."""
    conn = await asyncpg.connect(dsn)
    try:
        applied = await conn.fetchval("SELECT count(*) FROM fault_applied")
        queued = await conn.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox")
        return bool(applied >= 100 and queued)
    finally:
        await conn.close()


def _waited(fleet: Fleet, name: str, *, served: bool = True) -> bool:
    """`name` logged that it waited for a server it could write to (and then served)."""
    text = "".join(p.read_text() for p in fleet.logs.glob(f"{name}-*.log"))
    waited = '"database.waiting"' in text and "cannot take writes" in text
    return waited and (not served or '"worker.registered"' in text)
