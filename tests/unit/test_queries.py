"""The named-SQL loader: files beside their modules, the naming rule, shared fragments, and
mismatches refused when a query set is defined."""

from __future__ import annotations

import re

import pytest
from queries_loaded import all_queries

from helpers import ROOT
from outbox.errors import QueryFileError
from outbox.queries import DEFINITION_SUFFIX, VERBS, Queries, parse_queries


def test_every_sql_file_beside_a_module_has_its_query_set() -> None:
    files = {
        str(f.relative_to(ROOT))
        for f in (ROOT / "outbox").rglob("*.sql")
        if "migrations" not in f.parts and not f.name.endswith(DEFINITION_SUFFIX)
    }
    assert {cls.file for cls in Queries.registry} == files


def test_every_query_name_is_verb_noun() -> None:
    for owner, name, _ in all_queries():
        verb, _, noun = name.partition("_")
        assert verb in VERBS, f"{owner}.{name}"
        assert noun, f"{owner}.{name}"


def test_fragments_are_written_once_and_expanded_where_included() -> None:
    sources = "".join(f.read_text() for f in (ROOT / "outbox").rglob("*.sql"))
    defined = re.findall(r"^-- fragment: (\w+)$", sources, flags=re.M)
    assert defined
    assert sorted(defined) == sorted(set(defined))
    for owner, name, sql in all_queries():
        assert "-- include:" not in sql, f"{owner}.{name} was not expanded"
    # The claimed-row columns appear in every statement that needs them.
    loaded = {name: sql for _, name, sql in all_queries()}
    for name in ("claim_due_rows", "claim_one"):
        assert "j.payload::text AS payload" in loaded[name]


def test_parse_queries_splits_names_descriptions_and_sql() -> None:
    text = "-- header\n\n-- name: get_one\n-- first\nSELECT 1\n\n-- name: list_two\nSELECT\n  2\n"
    assert parse_queries(text, source="t") == {"get_one": "SELECT 1", "list_two": "SELECT\n  2"}


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 1",
        "-- name: get_a\n-- only a comment\n",
        "-- name: get_a\nSELECT 1\n-- name: get_a\nSELECT 2",
        "-- name: fetch_a\nSELECT 1",  # not a verb of VERBS
        "-- name: get\nSELECT 1",  # no noun
        "-- name: get_a\nSELECT\n-- include: no_such_fragment\n",
    ],
)
def test_parse_queries_rejects_malformed_files(text: str) -> None:
    with pytest.raises(QueryFileError):
        parse_queries(text, source="t")


def test_a_declared_name_missing_from_the_file_fails_at_class_definition() -> None:
    with pytest.raises(QueryFileError, match="append_evnets"):

        class Typo(Queries):
            __module__ = "outbox.append.journal"  # declares the journal's file
            append_evnets: str
