"""Named SQL queries, loaded once from `outbox/sql/<concern>.sql`.

A file holds queries, each headed by `-- name: verb_noun` and a one-line `--` description,
values always in `$n` placeholders. A concern declares its queries as a `Queries` subclass
whose `str` annotations are exactly the names in its file:

    class JournalQueries(Queries, file="journal.sql"):
        append_events: str

Loading happens when the subclass is defined (at import), and a name present on one side only
fails there, not in production. `Queries.registry` lists every query set, so a test can prepare
every statement against the migrated schema.
"""

from __future__ import annotations

import inspect
import re
from importlib import resources
from typing import ClassVar

__all__ = ["Queries", "QueryFileError", "parse_queries"]

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[a-z][a-z0-9_]*)\s*$", re.MULTILINE)


class QueryFileError(Exception):
    """A query file and its declaring class disagree, or the file is malformed."""


def parse_queries(text: str, *, source: str) -> dict[str, str]:
    """`{name: sql}` from a query file; the description comments stay out of the SQL."""
    queries: dict[str, str] = {}
    headers = list(_HEADER.finditer(text))
    if not headers:
        raise QueryFileError(f"{source}: no '-- name:' headers")
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        body = text[header.end() : following.start() if following else len(text)]
        lines = body.strip().splitlines()
        sql = "\n".join(ln for ln in lines if not ln.lstrip().startswith("--")).strip()
        name = header["name"]
        if not sql:
            raise QueryFileError(f"{source}: query {name!r} has no SQL")
        if name in queries:
            raise QueryFileError(f"{source}: query {name!r} is defined twice")
        queries[name] = sql
    return queries


class Queries:
    """Base for a concern's query set; see the module docstring."""

    registry: ClassVar[list[type[Queries]]] = []
    file: ClassVar[str]

    def __init_subclass__(cls, *, file: str, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        text = resources.files("outbox").joinpath("sql", file).read_text(encoding="utf-8")
        loaded = parse_queries(text, source=f"outbox/sql/{file}")
        declared = set(inspect.get_annotations(cls))
        missing, extra = declared - loaded.keys(), loaded.keys() - declared
        if missing or extra:
            raise QueryFileError(
                f"outbox/sql/{file}: declared but not in the file: {sorted(missing)}; "
                f"in the file but not declared: {sorted(extra)}"
            )
        cls.file = file
        for name, sql in loaded.items():
            setattr(cls, name, sql)
        Queries.registry.append(cls)

    @classmethod
    def items(cls) -> dict[str, str]:
        """`{name: sql}` of this query set."""
        return {name: getattr(cls, name) for name in inspect.get_annotations(cls)}
