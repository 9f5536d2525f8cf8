"""Every module of the package imported, so every query set is registered, whichever test
file is collected first (a module imported late would otherwise leave its queries out)."""

from __future__ import annotations

import importlib
import pkgutil

import outbox
from outbox.queries import Queries

for _module in pkgutil.walk_packages(outbox.__path__, "outbox."):
    importlib.import_module(_module.name)


def all_queries() -> list[tuple[str, str, str]]:
    """(query set, name, SQL) of every named query of the package."""
    return [
        (cls.__name__, name, sql) for cls in Queries.registry for name, sql in cls.items().items()
    ]
