"""Every named query prepares against the migrated schema; the loader refuses mismatches."""

from __future__ import annotations

import importlib
import pkgutil
from importlib import resources

import pytest

import outbox
from outbox import db
from outbox.queries import Queries, QueryFileError, parse_queries

# Importing every module of the package registers every query set, whichever test file is
# collected first (a module imported late would otherwise leave its queries unprepared).
for _module in pkgutil.walk_packages(outbox.__path__, "outbox."):
    importlib.import_module(_module.name)


def all_queries() -> list[tuple[str, str, str]]:
    return [
        (cls.__name__, name, sql) for cls in Queries.registry for name, sql in cls.items().items()
    ]


def test_every_query_file_has_its_query_set() -> None:
    files = {
        f.name
        for f in resources.files("outbox").joinpath("sql").iterdir()
        if f.name.endswith(".sql")
    }
    assert {cls.file for cls in Queries.registry} == files


@pytest.mark.parametrize(("owner", "name", "sql"), all_queries(), ids=lambda v: str(v)[:30])
async def test_query_prepares_against_the_migrated_schema(
    pool: db.Pool, owner: str, name: str, sql: str
) -> None:
    async with pool.acquire() as conn:
        await conn.prepare(sql)


def test_parse_queries_splits_names_descriptions_and_sql() -> None:
    text = "-- header\n\n-- name: one\n-- first\nSELECT 1\n\n-- name: two_x\nSELECT\n  2\n"
    assert parse_queries(text, source="t") == {"one": "SELECT 1", "two_x": "SELECT\n  2"}


@pytest.mark.parametrize(
    "text",
    ["SELECT 1", "-- name: a\n-- only a comment\n", "-- name: a\nSELECT 1\n-- name: a\nSELECT 2"],
)
def test_parse_queries_rejects_malformed_files(text: str) -> None:
    with pytest.raises(QueryFileError):
        parse_queries(text, source="t")


def test_a_declared_name_missing_from_the_file_fails_at_class_definition() -> None:
    with pytest.raises(QueryFileError, match="append_evnets"):

        class Typo(Queries, file="journal.sql"):
            append_evnets: str
