"""Named SQL, loaded once from the `.sql` file beside the module that runs it.

A module's statements live in a file of the same name next to it (`outbox/queue/claim.py`
runs `outbox/queue/claim.sql`). A file holds queries, each headed by `-- name: verb_noun` and a
one-line `--` description, values always in `$n` placeholders. The module declares them as a
`Queries` subclass whose `str` annotations are exactly the names in its file:

    class ClaimQueries(Queries):
        claim_campaigns: str

Loading happens when the subclass is defined (at import): a name present on one side only, or a
name that breaks the naming rule, fails there, not in production. `Queries.registry` lists every
query set, so a test can prepare every statement against the migrated schema.

**Names**: `verb_noun`, snake_case, the verb first and one of `VERBS`. Reads say their shape:
`get_` (one row or value), `list_` (rows), `count_` (numbers); writes and locks name what they
do (`insert_`, `delete_`, `prune_`, `lock_`, `settle_`, ...).

**Fragments**: SQL that several statements share is written once, as a block headed by
`-- fragment: name` in any file, and used by a line `-- include: name` (replaced by the
fragment's text when the file loads). A fragment's `$n` mean the same in every statement that
includes it. No values are ever formatted into SQL: fragments are static text.

**The schema**: every table and function of the outbox lives in one schema (`OUTBOX_SCHEMA`,
default `outbox`), which the caller's `search_path` need not name. A statement names each of
the outbox's objects through the token `@extschema@` (`FROM @extschema@.event_journal`), as a
PostgreSQL extension's script does; reading the attribute (`ClaimQueries.claim_batch`) gives
the text with the token replaced by the schema in effect: the one `using_schema` sets for the
current task (the worker, `drain_now` and `append` set it from their `Settings`), else
`OUTBOX_SCHEMA`, else `outbox`. A schema name is a plain lower-case identifier, never quoted
(`outbox.config.check_schema_name`), so replacing the token is all the rendering there is.
Files named `*_fn.sql` are not query files: they define the server functions (`outbox.schema`).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import ClassVar

from outbox.config import DEFAULT_SCHEMA, FIELDS
from outbox.errors import ConfigError, QueryFileError

__all__ = [
    "SCHEMA_TOKEN",
    "VERBS",
    "Queries",
    "current_schema",
    "parse_queries",
    "render",
    "schema_chosen",
    "using_schema",
]

SCHEMA_TOKEN = "@extschema@"  # noqa: S105 - a placeholder, as in an extension's script
# Definitions of server functions, beside their callers: not query files.
DEFINITION_SUFFIX = "_fn.sql"

_schema: ContextVar[str | None] = ContextVar("outbox_schema", default=None)
_SCHEMA_SPEC = FIELDS["schema"]


@cache
def _schema_from_env(raw: str | None) -> str:
    if raw is None or not raw.strip():
        return DEFAULT_SCHEMA
    try:
        parsed: str = _SCHEMA_SPEC.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{_SCHEMA_SPEC.env}: {exc}, got {raw.strip()[:80]!r}") from None
    return parsed


def current_schema() -> str:
    """The schema the outbox's statements name now: `using_schema`'s, else `OUTBOX_SCHEMA`'s,
    else `outbox`."""
    chosen = _schema.get()
    return chosen if chosen is not None else _schema_from_env(os.environ.get(_SCHEMA_SPEC.env))


def schema_chosen() -> bool:
    """Whether the schema in effect was chosen (`using_schema`, `OUTBOX_SCHEMA`), not the
    default."""
    return _schema.get() is not None or bool(os.environ.get(_SCHEMA_SPEC.env, "").strip())


@contextmanager
def using_schema(schema: str | None) -> Iterator[str]:
    """Within the block (and the tasks it starts), the outbox's statements name `schema`; None
    leaves the schema as it is. Yields the schema in effect."""
    if schema is None:
        yield current_schema()
        return
    try:
        _SCHEMA_SPEC.check(schema)
    except ValueError as exc:
        raise ConfigError(f"{_SCHEMA_SPEC.env}: {exc}, got {schema!r}") from None
    token = _schema.set(schema)
    try:
        yield schema
    finally:
        _schema.reset(token)


def render(sql: str, schema: str | None = None) -> str:
    """`sql` naming `schema` (default: the current one) where it says `@extschema@`."""
    return sql.replace(SCHEMA_TOKEN, schema if schema is not None else current_schema())


class _Statement:
    """A query's text as a class attribute: rendered for the schema in effect when read, once
    per schema."""

    __slots__ = ("rendered", "template")

    def __init__(self, template: str) -> None:
        self.template = template
        self.rendered: dict[str, str] = {}

    def __get__(self, instance: object, owner: type | None = None) -> str:
        schema = current_schema()
        text = self.rendered.get(schema)
        if text is None:
            text = self.rendered[schema] = self.template.replace(SCHEMA_TOKEN, schema)
        return text


_HEADER = re.compile(r"^--\s*(?P<kind>name|fragment):\s*(?P<name>[a-z][a-z0-9_]*)\s*$", re.M)
_INCLUDE = re.compile(r"^(?P<indent>[ \t]*)--\s*include:\s*(?P<name>[a-z][a-z0-9_]*)\s*$", re.M)

# The verbs a query name may start with; adding one is a deliberate edit, read in review.
VERBS = frozenset(
    {
        # reads
        "get",
        "list",
        "count",
        "load",
        # locks and claims
        "lock",
        "hold",
        "claim",
        "lease",
        "reserve",
        # writes
        "append",
        "insert",
        "create",
        "set",
        "reset",
        "extend",
        "complete",
        "fail",
        "release",
        "requeue",
        "repair",
        "discard",
        "pause",
        "resume",
        "retire",
        "promote",
        "redefine",
        "defer",
        "settle",
        "refresh",
        "unblock",
        "record",
        "register",
        "heartbeat",
        "stop",
        "delete",
        "prune",
        "sweep",
        "rotate",
        # transaction and session control
        "open",
        "undo",
        "notify",
        "apply",
        "unlock",
    }
)


def _blocks(text: str, *, source: str) -> list[tuple[str, str, str]]:
    """(kind, name, sql) of every `-- name:` and `-- fragment:` block, description comments
    left out of the SQL."""
    headers = list(_HEADER.finditer(text))
    if not headers:
        raise QueryFileError(f"{source}: no '-- name:' headers")
    blocks = []
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        body = text[header.end() : following.start() if following else len(text)]
        lines = body.strip().splitlines()
        sql = "\n".join(
            ln for ln in lines if not ln.lstrip().startswith("--") or _INCLUDE.match(ln)
        ).strip()
        if not sql:
            raise QueryFileError(f"{source}: {header['kind']} {header['name']!r} has no SQL")
        blocks.append((header["kind"], header["name"], sql))
    return blocks


@cache
def _fragments() -> dict[str, str]:
    """Every fragment of every module's SQL file (the migrations excluded), by name."""
    found: dict[str, str] = {}

    def walk(folder: Traversable, path: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir() and entry.name not in ("migrations", "__pycache__"):
                walk(entry, f"{path}/{entry.name}")
            elif entry.name.endswith(".sql") and not entry.name.endswith(DEFINITION_SUFFIX):
                source = f"{path}/{entry.name}"
                for kind, name, sql in _blocks(entry.read_text(encoding="utf-8"), source=source):
                    if kind != "fragment":
                        continue
                    if name in found:
                        raise QueryFileError(f"{source}: fragment {name!r} is defined twice")
                    found[name] = sql

    walk(resources.files("outbox"), "outbox")
    return found


def _expand(sql: str, *, source: str, name: str) -> str:
    def include(m: re.Match[str]) -> str:
        fragment = _fragments().get(m["name"])
        if fragment is None:
            raise QueryFileError(
                f"{source}: query {name!r} includes unknown fragment {m['name']!r}"
            )
        return "\n".join(m["indent"] + line for line in fragment.splitlines())

    return _INCLUDE.sub(include, sql)


def parse_queries(text: str, *, source: str) -> dict[str, str]:
    """`{name: sql}` from a query file, fragments included; checks the naming rule."""
    queries: dict[str, str] = {}
    for kind, name, sql in _blocks(text, source=source):
        if kind == "fragment":
            continue
        if name.split("_", 1)[0] not in VERBS or "_" not in name:
            raise QueryFileError(
                f"{source}: query {name!r} does not follow verb_noun with a verb of "
                "outbox.queries.VERBS"
            )
        if name in queries:
            raise QueryFileError(f"{source}: query {name!r} is defined twice")
        queries[name] = _expand(sql, source=source, name=name)
    return queries


class Queries:
    """Base for a module's query set; see the module docstring."""

    registry: ClassVar[list[type[Queries]]] = []
    file: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        package, _, module = cls.__module__.rpartition(".")
        path = f"{package.replace('.', '/')}/{module}.sql"
        text = resources.files(package).joinpath(f"{module}.sql").read_text(encoding="utf-8")
        loaded = parse_queries(text, source=path)
        declared = set(inspect.get_annotations(cls))
        missing, extra = declared - loaded.keys(), loaded.keys() - declared
        if missing or extra:
            raise QueryFileError(
                f"{path}: declared but not in the file: {sorted(missing)}; "
                f"in the file but not declared: {sorted(extra)}"
            )
        cls.file = path
        for name, sql in loaded.items():
            setattr(cls, name, _Statement(sql))
        Queries.registry.append(cls)

    @classmethod
    def items(cls) -> dict[str, str]:
        """`{name: sql}` of this query set, for the schema in effect."""
        return {name: getattr(cls, name) for name in inspect.get_annotations(cls)}

    @classmethod
    def templates(cls) -> dict[str, str]:
        """`{name: sql}` of this query set as written (`@extschema@` not yet replaced)."""
        found: dict[str, str] = {}
        for name in inspect.get_annotations(cls):
            statement = cls.__dict__[name]
            found[name] = statement.template if isinstance(statement, _Statement) else statement
        return found
