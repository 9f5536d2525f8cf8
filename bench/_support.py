"""What the bench scripts share: a migrated scratch database on a durable server.

OUTBOX_BENCH_DSN (a role with CREATEDB) when set, else a throwaway local cluster with fsync on,
so figures include the cost of commits.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from outbox.localpg import LocalCluster
from outbox.migrate import migrate


@asynccontextmanager
async def bench_database() -> AsyncIterator[str]:
    """Yield the DSN of a fresh migrated database; drop it (and any cluster) afterwards."""
    cluster: LocalCluster | None = None
    server = os.environ.get("OUTBOX_BENCH_DSN", "")
    if not server:
        cluster = LocalCluster.temporary(durable=True)
        server = cluster.start()
    try:
        name = f"bench_{uuid.uuid4().hex[:8]}"
        admin = await asyncpg.connect(server)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
            dsn = server.rsplit("/", 1)[0] + f"/{name}"
            conn = await asyncpg.connect(dsn)
            try:
                await migrate(conn)
            finally:
                await conn.close()
            yield dsn
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()
    finally:
        if cluster is not None:
            cluster.destroy()
