"""Every named query, fragments included, prepares against the migrated schema."""

from __future__ import annotations

import pytest
from queries_loaded import all_queries

from outbox import db
from outbox.buckets.distribution import DistributionQueries
from outbox.queries import Queries
from outbox.testing.localcitus import CitusCluster

# Statements that read Citus's own catalog: they prepare only where Citus is installed.
CITUS_ONLY = {name for name in DistributionQueries.items() if name != "get_citus_version"}


@pytest.mark.parametrize(("owner", "name", "sql"), all_queries(), ids=lambda v: str(v)[:30])
async def test_query_prepares_against_the_migrated_schema(
    pool: db.Pool, citus: CitusCluster | None, owner: str, name: str, sql: str
) -> None:
    if citus is None and owner == DistributionQueries.__name__ and name in CITUS_ONLY:
        pytest.skip("a statement on Citus's catalog: prepared by make test-citus")
    async with pool.acquire() as conn:
        await conn.prepare(sql)


def test_every_query_set_was_prepared() -> None:
    assert len(Queries.registry) >= 11
