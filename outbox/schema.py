"""The schema's migrations: ordered `NNNN_name.sql` files, applied once each, checksummed.

`migrate()` takes an advisory lock, applies pending files in name order (each in its own
transaction, recorded with its sha256), and refuses when an applied file was edited or the
database carries a migration this code does not know. `check_current()` is what workers and
health probes call: it raises SchemaNotReady when anything is pending. The files ship in the
wheel as `outbox/migrations/`; in a source checkout they are read from the top-level `sql/`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from outbox import db
from outbox.errors import MigrationError, SchemaNotReady
from outbox.obs import log
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "Migration",
    "MigrationState",
    "check_current",
    "load_migrations",
    "migrate",
    "script",
    "status",
]

MIN_SERVER_VERSION = 13
# Advisory lock key of the migrators ('outbox' in ASCII).
_LOCK_KEY = 0x6F7574626F78
_FILE_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")

_logger = log.get_logger("outbox.schema")


class SchemaQueries(Queries):
    lock_migrations: str
    unlock_migrations: str
    create_migrations_table: str
    get_migrations_table: str
    list_applied_migrations: str
    record_migration: str
    set_migration_buckets: str
    get_schema_buckets: str


Q = SchemaQueries


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sql: str
    checksum: str


@dataclass(frozen=True, slots=True)
class MigrationState:
    name: str
    state: Literal["applied", "pending", "edited", "unknown"]
    checksum: str
    applied_at: datetime | None


def _default_directory() -> Traversable:
    packaged = resources.files("outbox").joinpath("migrations")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "sql"  # a source checkout


def load_migrations(directory: Traversable | Path | None = None) -> list[Migration]:
    """The migration files of `directory` (default: the shipped ones), in apply order."""
    root = directory if directory is not None else _default_directory()
    if not root.is_dir():
        raise MigrationError(f"migrations directory not found: {root}")
    found = []
    for entry in root.iterdir():
        if entry.is_file() and _FILE_NAME.match(entry.name):
            data = entry.read_bytes()
            found.append(
                Migration(entry.name, data.decode("utf-8"), hashlib.sha256(data).hexdigest())
            )
    found.sort(key=lambda m: m.name)
    versions = [m.name[:4] for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version number in {root}")
    if not found:
        raise MigrationError(f"no migration files in {root}")
    return found


async def _applied(conn: Connection) -> dict[str, tuple[str, datetime]]:
    if not await conn.fetchval(Q.get_migrations_table):
        return {}
    rows = await conn.fetch(Q.list_applied_migrations)
    return {r["name"]: (r["checksum"], r["applied_at"]) for r in rows}


def _states(
    migrations: list[Migration], applied: dict[str, tuple[str, datetime]]
) -> list[MigrationState]:
    states = []
    known = {m.name for m in migrations}
    for m in migrations:
        if m.name not in applied:
            states.append(MigrationState(m.name, "pending", m.checksum, None))
        else:
            checksum, at = applied[m.name]
            state: Literal["applied", "edited"] = "applied" if checksum == m.checksum else "edited"
            states.append(MigrationState(m.name, state, m.checksum, at))
    for name, (checksum, at) in sorted(applied.items()):
        if name not in known:
            states.append(MigrationState(name, "unknown", checksum, at))
    return states


async def status(
    executor: Executor, migrations: list[Migration] | None = None
) -> list[MigrationState]:
    """Every migration file and every applied migration, with its state."""
    migrations = migrations if migrations is not None else load_migrations()
    async with db.acquire(executor) as conn:
        return _states(migrations, await _applied(conn))


def _refuse_unsafe(states: list[MigrationState]) -> None:
    for s in states:
        if s.state == "edited":
            raise MigrationError(
                f"migration {s.name} was edited after it was applied (checksum differs); "
                "restore the file and put the change in a new migration"
            )
        if s.state == "unknown":
            raise MigrationError(
                f"the database has migration {s.name}, which this version of outbox does not "
                "ship; upgrade outbox before migrating"
            )


async def migrate(
    executor: Executor, migrations: list[Migration] | None = None, *, buckets: int | None = None
) -> list[str]:
    """Apply pending migrations in order; returns the names applied (empty when current).
    `buckets`: how many buckets the migration that introduces them fixes (None: 64); once they
    are fixed, a different number is refused."""
    migrations = migrations if migrations is not None else load_migrations()
    async with db.acquire(executor) as conn:
        version = conn.get_server_version()
        if version.major < MIN_SERVER_VERSION:
            raise MigrationError(
                f"PostgreSQL {version.major} is too old: outbox needs {MIN_SERVER_VERSION} or newer"
            )
        await conn.fetchval(Q.lock_migrations, _LOCK_KEY)
        try:
            await conn.execute(Q.create_migrations_table)
            states = _states(migrations, await _applied(conn))
            _refuse_unsafe(states)
            pending = {s.name for s in states if s.state == "pending"}
            await _check_buckets(conn, buckets)
            done = []
            for m in migrations:
                if m.name not in pending:
                    continue
                async with conn.transaction():
                    if buckets is not None:
                        await conn.fetchval(Q.set_migration_buckets, str(buckets))
                    await conn.execute(m.sql)
                    await conn.execute(Q.record_migration, m.name, m.checksum)
                _logger.info("migration.applied", extra={"migration": m.name})
                done.append(m.name)
            return done
        finally:
            await conn.fetchval(Q.unlock_migrations, _LOCK_KEY)


async def _check_buckets(conn: Connection, wanted: int | None) -> None:
    """Refuse a number of buckets other than the one the schema was given."""
    fixed: int | None = await conn.fetchval(Q.get_schema_buckets)
    if wanted is not None and fixed is not None and fixed != wanted:
        raise MigrationError(
            f"OUTBOX_BUCKETS is {wanted} but the schema was given {fixed} buckets when it was "
            "first migrated; the number never changes (unset OUTBOX_BUCKETS, or set it to "
            f"{fixed})"
        )


def script(migrations: list[Migration] | None = None, *, buckets: int | None = None) -> str:
    """The migrations as one SQL script, for teams that run migrations with their own tool:
    the bookkeeping table, then each file in its own transaction with the row that records it
    (name and sha256), so workers find the schema current. Apply it once, to an empty database;
    later releases' files apply the same way (each file once, in order)."""
    migrations = migrations if migrations is not None else load_migrations()
    parts = [
        "-- outbox schema migrations, in order. Each file runs in its own transaction and is",
        "-- recorded in outbox_schema_migrations, as `maintenance migrate` does.",
        Q.create_migrations_table.rstrip(";") + ";",
        "-- The number of buckets 0009_buckets.sql fixes (OUTBOX_BUCKETS; 64 when unset).",
        f"SET outbox.buckets = {buckets or 64};",
    ]
    for m in migrations:
        # Names match NNNN_name.sql and checksums are hex: the literals need no escaping.
        record = (
            "INSERT INTO outbox_schema_migrations (name, checksum) "
            f"VALUES ('{m.name}', '{m.checksum}');"
        )
        parts += ["", f"-- {m.name} (sha256 {m.checksum})", "BEGIN;", m.sql.rstrip(), record]
        parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


async def check_current(executor: Executor) -> None:
    """Raise SchemaNotReady unless every shipped migration is applied unedited."""
    migrations = load_migrations()
    async with db.acquire(executor) as conn:
        applied = await _applied(conn)
    if not applied:
        raise SchemaNotReady("the database is not migrated: run `maintenance migrate`")
    states = _states(migrations, applied)
    pending = [s.name for s in states if s.state == "pending"]
    if pending:
        raise SchemaNotReady(
            f"{len(pending)} migration(s) pending ({', '.join(pending)}): run `maintenance migrate`"
        )
    edited = [s.name for s in states if s.state == "edited"]
    if edited:
        raise SchemaNotReady(
            f"applied migration(s) differ from the shipped files: {', '.join(edited)}"
        )
