"""A Citus cluster on loopback for `make test-citus` and the cluster bench: a coordinator and
two workers, three ordinary local PostgreSQL clusters with Citus preloaded (`outbox.localpg`
runs each; the machine's PostgreSQL must have Citus, see tests/citus/ensure-citus.sh).

A database on the cluster is the same database on every node: created on each, `CREATE
EXTENSION citus` in each, the workers added from the coordinator. `clone()` copies a prepared
database on every node under one new name, so a test gets a migrated, distributed database in
the time of three `CREATE DATABASE ... TEMPLATE` (the shards sit in the workers' copies, and the
coordinator's metadata names the same shards). Citus's maintenance daemon keeps a session in
each database with the extension; a template must have none, so the template refuses
connections once prepared, and so does a database about to be dropped.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from outbox import db
from outbox.buckets.distribution import distribute
from outbox.schema import migrate
from outbox.testing import admin_execute, with_database
from outbox.testing.localpg import LocalCluster

__all__ = ["CITUS_SETTINGS", "CitusCluster"]

OBJECT_IN_USE = "55006"  # DROP DATABASE: "is being accessed by other users"

CITUS_SETTINGS = (
    "shared_preload_libraries = 'citus'",
    # Transactions that write on two workers commit by 2PC.
    "max_prepared_transactions = 200",
    # Tests and benches: no parallel shard copies on 2 cores.
    "citus.max_adaptive_executor_pool_size = 4",
)


@dataclass
class CitusCluster:
    coordinator: LocalCluster
    workers: list[LocalCluster]
    durable: bool = False
    _names: list[str] = field(default_factory=list)

    @classmethod
    def temporary(cls, *, workers: int = 2, durable: bool = False) -> CitusCluster:
        return cls(
            LocalCluster.temporary(durable=durable),
            [LocalCluster.temporary(durable=durable) for _ in range(workers)],
            durable,
        )

    @property
    def nodes(self) -> list[LocalCluster]:
        return [self.coordinator, *self.workers]

    def start(self) -> str:
        """Initialise and start every node; the coordinator's admin DSN."""
        for node in self.nodes:
            if not node.initialised():
                node.init()
                with (node.data / "postgresql.conf").open("a") as conf:
                    conf.write("\n# citus\n" + "\n".join(CITUS_SETTINGS) + "\n")
            node.start()
        return self.coordinator.dsn

    def destroy(self) -> None:
        for node in self.nodes:
            node.destroy()

    async def create_database(self, name: str) -> str:
        """An empty Citus database `name` on every node, the workers added; its DSN."""
        for node in self.nodes:
            await admin_execute(node.dsn, f'CREATE DATABASE "{name}"')
            await admin_execute(with_database(node.dsn, name), "CREATE EXTENSION citus")
        conn = await db.connect(with_database(self.coordinator.dsn, name), codecs=False)
        try:
            await conn.execute(
                "SELECT citus_set_coordinator_host('127.0.0.1', $1)", self.coordinator.port
            )
            for worker in self.workers:
                await conn.execute("SELECT citus_add_node('127.0.0.1', $1)", worker.port)
        finally:
            await conn.close()
        return with_database(self.coordinator.dsn, name)

    async def create_template(self) -> str:
        """A database migrated and distributed (`maintenance distribute`), for `clone()`."""
        name = f"outbox_citus_tpl_{uuid.uuid4().hex[:6]}"
        conn = await db.connect(await self.create_database(name))
        try:
            await migrate(conn)
            await distribute(conn)
        finally:
            await conn.close()
        for node in self.nodes:
            await _close(node.dsn, name)
        return name

    async def clone(self, template: str, *, prefix: str = "outbox_citus") -> str:
        """A copy of database `template` on every node under a new name; its DSN."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        for node in self.nodes:
            await admin_execute(node.dsn, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return with_database(self.coordinator.dsn, name)

    async def drop(self, dsn: str) -> None:
        name = urlsplit(dsn).path.lstrip("/")
        for node in self.nodes:
            await _drop(node.dsn, name)


async def _drop(admin_dsn: str, name: str) -> None:
    """Drop database `name`, or leave it to the cluster's removal. Citus stops its maintenance
    daemon in the database on DROP DATABASE, and PostgreSQL waits up to 5 s for it to exit; a
    daemon busy longer than that fails the drop ("being accessed by other users"). One more
    try after ending the sessions again; then the database stays (it refuses connections and
    goes with the throwaway cluster), so a test's teardown never fails for it."""
    for _ in range(2):
        await _close(admin_dsn, name)
        try:
            await admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except Exception as exc:
            if db.sqlstate_of(exc) != OBJECT_IN_USE:
                raise


async def _close(admin_dsn: str, name: str) -> None:
    """No session in database `name`, and none can start (Citus's maintenance daemon, which
    FORCE does not end and which comes back when ended, included): a template, or a database
    about to be dropped."""
    conn = await db.connect(admin_dsn, codecs=False)
    try:
        await conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await conn.close()
