"""Every named query, fragments included, prepares against the migrated schema."""

from __future__ import annotations

import pytest
from queries_loaded import all_queries

from outbox import db
from outbox.queries import Queries


@pytest.mark.parametrize(("owner", "name", "sql"), all_queries(), ids=lambda v: str(v)[:30])
async def test_query_prepares_against_the_migrated_schema(
    pool: db.Pool, owner: str, name: str, sql: str
) -> None:
    async with pool.acquire() as conn:
        await conn.prepare(sql)


def test_every_query_set_was_prepared() -> None:
    assert len(Queries.registry) >= 11
