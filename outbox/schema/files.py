"""The schema's SQL files, loaded and checked: migrations and definitions. No database here.

Two kinds of file make the schema:

- **Migrations**, `sql/NNNN_name.sql` (shipped in the wheel as `outbox/migrations/`): DDL and
  data moves, each applied once, in name order, and never edited after a release (its
  checksum is recorded).
- **Definitions**, `*_fn.sql` beside the Python module that calls the functions they define
  (`outbox/queue/claim_fn.sql` beside `claim.py`): `CREATE OR REPLACE FUNCTION` statements and
  their comments, re-applied whenever the file's text changes. A file that needs another
  applied first says so on a line `-- requires: queue/claim_fn.sql`; they are applied in that
  order, ties by name. Each function is defined in exactly one file, once.

Both run with `search_path` set to the install's schema and `pg_temp`, so they name the
outbox's objects unqualified; a function pins that path (`SET search_path FROM CURRENT`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from outbox.errors import MigrationError
from outbox.queries import DEFINITION_SUFFIX

__all__ = [
    "Definition",
    "Migration",
    "defined_functions",
    "load_definitions",
    "load_migrations",
]

_MIGRATION_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
_REQUIRES = re.compile(r"^--\s*requires:\s*(?P<name>\S+)\s*$", re.M)
# A function's definition: `CREATE [OR REPLACE] FUNCTION name(`, at the start of a line.
_CREATE_FUNCTION = re.compile(
    r"^\s*CREATE\s+(?P<replace>OR\s+REPLACE\s+)?FUNCTION\s+(?P<name>[a-z_][a-z0-9_]*)\s*\(",
    re.I | re.M,
)


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its name (`0004_buckets_leases_operators.sql`), text and sha256."""

    name: str
    sql: str
    checksum: str


@dataclass(frozen=True, slots=True)
class Definition:
    """One definitions file: its name (`queue/claim_fn.sql`, relative to the package), text,
    sha256, the files it requires and the functions it defines."""

    name: str
    sql: str
    checksum: str
    requires: tuple[str, ...]
    functions: tuple[str, ...]


def _checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _default_migrations() -> Traversable:
    packaged = resources.files("outbox").joinpath("migrations")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "sql"  # a source checkout


def load_migrations(directory: Traversable | Path | None = None) -> list[Migration]:
    """The migration files of `directory` (default: the shipped ones), in apply order."""
    root = directory if directory is not None else _default_migrations()
    if not root.is_dir():
        raise MigrationError(f"migrations directory not found: {root}")
    found = []
    for entry in root.iterdir():
        if entry.is_file() and _MIGRATION_NAME.match(entry.name):
            data = entry.read_bytes()
            found.append(Migration(entry.name, data.decode("utf-8"), _checksum(data)))
    found.sort(key=lambda m: m.name)
    versions = [m.name[:4] for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version number in {root}")
    if not found:
        raise MigrationError(f"no migration files in {root}")
    return found


def defined_functions(sql: str) -> list[tuple[str, bool]]:
    """(name, with OR REPLACE) of every `CREATE FUNCTION` in `sql`, in order."""
    return [(m["name"].lower(), bool(m["replace"])) for m in _CREATE_FUNCTION.finditer(sql)]


def _walk(folder: Traversable, prefix: str) -> list[tuple[str, Traversable]]:
    found: list[tuple[str, Traversable]] = []
    for entry in folder.iterdir():
        if entry.is_dir() and entry.name not in ("migrations", "__pycache__"):
            found += _walk(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(DEFINITION_SUFFIX):
            found.append((f"{prefix}{entry.name}", entry))
    return found


def load_definitions(root: Traversable | Path | None = None) -> list[Definition]:
    """Every definitions file under `root` (default: the package), in apply order; refuses a
    function defined twice or without OR REPLACE, an unknown requirement and a cycle."""
    files = _walk(root if root is not None else resources.files("outbox"), "")
    loaded: dict[str, Definition] = {}
    owner: dict[str, str] = {}
    for name, entry in files:
        data = entry.read_bytes()
        sql = data.decode("utf-8")
        functions = defined_functions(sql)
        if not functions:
            raise MigrationError(f"{name}: defines no function")
        for function, replace in functions:
            if not replace:
                raise MigrationError(
                    f"{name}: {function} must be CREATE OR REPLACE FUNCTION (the file is "
                    "applied again whenever it changes)"
                )
            if function in owner:
                raise MigrationError(
                    f"{name}: {function} is already defined in {owner[function]}; each "
                    "function has one definition"
                )
            owner[function] = name
        requires = tuple(m["name"] for m in _REQUIRES.finditer(sql))
        loaded[name] = Definition(
            name, sql, _checksum(data), requires, tuple(f for f, _ in functions)
        )
    for d in loaded.values():
        unknown = [r for r in d.requires if r not in loaded]
        if unknown:
            raise MigrationError(f"{d.name}: requires {', '.join(unknown)}, which is not shipped")
    sorter = TopologicalSorter({n: loaded[n].requires for n in sorted(loaded)})
    try:
        sorter.prepare()
    except CycleError as exc:
        raise MigrationError(f"definitions require each other in a circle: {exc.args[1]}") from None
    ordered: list[Definition] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        ordered += [loaded[n] for n in ready]
        sorter.done(*ready)
    return ordered
