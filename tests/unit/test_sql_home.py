"""Where the SQL lives: each server function defined once, in a definitions file beside the
module that calls it; migrations hold DDL and data moves; every statement names the outbox's
objects through the schema token, so none depends on the caller's search_path."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from queries_loaded import all_queries

from helpers import ROOT
from outbox.errors import MigrationError
from outbox.queries import SCHEMA_TOKEN, Queries, render, using_schema
from outbox.schema import defined_functions, load_definitions, load_migrations

# The migrations 0.1.0 shipped, by sha256, as its installs recorded them: never edited again.
RELEASED = {
    "0001_schema.sql": "305a86f74e6427101016667d260494d322ccf58dada9c52034a217752d776d50",
    "0002_shadow_observations.sql": (
        "13ea03f4f223f68ced4e788973f83e10f031791057cf3238b6e0138fb8bc87a3"
    ),
    "0003_campaign_queue.sql": "afab64d0a8424521c55ee3c5cd5bf6b9b5269825484a40a60ea3220e3bd3f786",
}
DEFINITIONS = sorted((ROOT / "outbox").rglob("*_fn.sql"))
# What the outbox's statements may name in its schema: its tables and its functions.
OBJECTS = (
    "event_journal|campaign_heads|campaign_head_keys|projection_apply_outbox|projection_apply_campaigns|"
    "projection_checkpoints|projection_checkpoint_keys|projection_checkpoint_moves|processed_markers|append_idempotency_keys|consumer_claims|"
    "outbox_workers|outbox_requeue_audit|outbox_projector_pauses|outbox_projector_audit|"
    "outbox_schema_migrations|outbox_schema_definitions|outbox_[a-z_]+(?=\\()"
)
BARE = re.compile(rf"(?<![.\w'@])({OBJECTS})\b")


def test_each_function_is_created_once_in_the_repository() -> None:
    """In the repository's SQL, each function name has one CREATE [OR REPLACE] FUNCTION: the
    bucket functions, written by their migration as the text of an EXECUTE, are not counted."""
    sources = [*DEFINITIONS, *sorted((ROOT / "sql").glob("0*.sql"))]
    created = Counter(name for f in sources for name, _ in defined_functions(f.read_text()))
    assert created
    assert {name: n for name, n in created.items() if n > 1} == {}


def test_the_released_migrations_are_as_released() -> None:
    shipped = {m.name: m.checksum for m in load_migrations()}
    assert {name: shipped.get(name) for name in RELEASED} == RELEASED


# Functions a table needs before it can be created (a column default calls it), which only
# the migration that creates the table can define: migration and function.
NEEDED_BY_A_TABLE = {"0008_queue_generations.sql": ["outbox_queue_slot"]}


def test_migrations_after_the_first_release_define_no_function() -> None:
    for migration in load_migrations():
        if migration.name >= "0004":
            defined = [name for name, _ in defined_functions(migration.sql)]
            assert defined == NEEDED_BY_A_TABLE.get(migration.name, []), migration.name


def test_every_definitions_file_sits_beside_the_module_that_calls_it() -> None:
    assert DEFINITIONS
    loaded = {d.name: d for d in load_definitions()}
    for path in DEFINITIONS:
        module = path.with_name(path.name.removesuffix("_fn.sql") + ".py")
        assert module.exists(), f"{path.relative_to(ROOT)} has no module beside it"
        # The module, or its query file, calls at least one of the functions defined here.
        queries = module.with_suffix(".sql")
        text = module.read_text() + (queries.read_text() if queries.exists() else "")
        functions = loaded[str(path.relative_to(ROOT / "outbox"))].functions
        assert any(f"{f}(" in text for f in functions), path.name


def test_definitions_are_applied_in_the_order_they_require() -> None:
    order = [d.name for d in load_definitions()]
    for d in load_definitions():
        for required in d.requires:
            assert order.index(required) < order.index(d.name)


def test_every_statement_names_the_outbox_through_the_schema_token() -> None:
    """Outside comments and string literals, a query's text names no table or function of the
    outbox bare: each goes through `@extschema@.`, which rendering replaces."""
    bare = []
    for cls in Queries.registry:
        for name, sql in cls.templates().items():
            code = re.sub(r"'(?:[^']|'')*'|--[^\n]*", "", sql)
            bare += [f"{cls.__name__}.{name}: {m}" for m in BARE.findall(code)]
    assert bare == []


def test_rendering_names_the_schema_in_effect() -> None:
    (owner, name, sql) = next(q for q in all_queries() if q[1] == "claim_batch")
    assert "outbox.outbox_claim(" in sql
    with using_schema("tenant_b"):
        statement = dict((n, s) for o, n, s in all_queries() if o == owner)[name]
        assert "tenant_b.outbox_claim(" in statement
        assert SCHEMA_TOKEN not in statement
    assert render(f"SELECT 1 FROM {SCHEMA_TOKEN}.x", "a") == "SELECT 1 FROM a.x"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"a_fn.sql": "CREATE OR REPLACE FUNCTION f() RETURNS int RETURN 1;\n"}
            | {"b_fn.sql": "CREATE OR REPLACE FUNCTION f() RETURNS int RETURN 2;\n"},
            "already defined in a_fn.sql",
        ),
        ({"a_fn.sql": "CREATE FUNCTION f() RETURNS int RETURN 1;\n"}, "OR REPLACE"),
        ({"a_fn.sql": "-- requires: zz_fn.sql\nCREATE OR REPLACE FUNCTION f() RETURN 1;"}, "zz"),
        (
            {
                "a_fn.sql": "-- requires: b_fn.sql\nCREATE OR REPLACE FUNCTION f() RETURN 1;",
                "b_fn.sql": "-- requires: a_fn.sql\nCREATE OR REPLACE FUNCTION g() RETURN 1;",
            },
            "circle",
        ),
        ({"a_fn.sql": "SELECT 1;\n"}, "defines no function"),
    ],
)
def test_definitions_that_break_a_rule_are_refused(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(MigrationError, match=message):
        load_definitions(tmp_path)


def test_definitions_load_in_requirement_order_with_ties_by_name(tmp_path: Path) -> None:
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "a_fn.sql").write_text(
        "-- requires: z_fn.sql\nCREATE OR REPLACE FUNCTION a() RETURN 1;"
    )
    (tmp_path / "z_fn.sql").write_text("CREATE OR REPLACE FUNCTION z() RETURN 1;")
    (tmp_path / "m_fn.sql").write_text("CREATE OR REPLACE FUNCTION m() RETURN 1;")
    assert [d.name for d in load_definitions(tmp_path)] == ["m_fn.sql", "z_fn.sql", "q/a_fn.sql"]
