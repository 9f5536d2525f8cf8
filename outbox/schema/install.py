"""Installing and upgrading the schema: `migrate`, `status`, `check_current`, `script`.

`migrate()` takes an advisory lock, creates the install's schema when it is missing, applies
pending migrations in name order, then every definitions file whose text changed, each file
in its own transaction with `search_path` set to the schema and `pg_temp`, recorded with its
sha256. It refuses an applied migration that was edited, a migration this code does not
ship, and putting back definitions a newer release applied. `check_current()` is what workers
and health probes call: SchemaNotReady when a migration is pending or a definition is out of
date (one a newer release applied is current: its older workers run on during a rolling
deploy). `script()` is the same install as SQL, for teams with their own migration tool.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from outbox import db
from outbox.errors import MigrationError, SchemaNotReady
from outbox.obs import log
from outbox.queries import Queries, current_schema, render, schema_chosen, using_schema
from outbox.schema.files import Definition, Migration, load_definitions, load_migrations
from outbox.version import __version__

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "DefinitionState",
    "MigrationState",
    "check_current",
    "migrate",
    "script",
    "status",
]

MIN_SERVER_VERSION = 13
# Tries of one migration that loses a deadlock against running processes (each rolled back).
MIGRATION_ATTEMPTS = 5
DEADLOCK = "40P01"
# Advisory lock key of the migrators ('outbox' in ASCII).
_LOCK_KEY = 0x6F7574626F78

_logger = log.get_logger("outbox.schema")


class InstallQueries(Queries):
    lock_migrations: str
    unlock_migrations: str
    get_schema_exists: str
    create_schema: str
    create_migrations_table: str
    create_definitions_table: str
    get_migrations_table: str
    get_definitions_table: str
    list_installs: str
    list_applied_migrations: str
    list_applied_definitions: str
    record_migration: str
    record_definition: str
    set_install_path: str
    set_migration_buckets: str
    get_schema_buckets: str


Q = InstallQueries


@dataclass(frozen=True, slots=True)
class MigrationState:
    name: str
    state: Literal["applied", "pending", "edited", "unknown"]
    checksum: str
    applied_at: datetime | None


@dataclass(frozen=True, slots=True)
class DefinitionState:
    """A definitions file against the install: `applied` (this text), `pending` (never
    applied, or another text by this release or an older one), `newer` (applied by a newer
    release: left as it is)."""

    name: str
    state: Literal["applied", "pending", "newer"]
    checksum: str
    version: str | None
    applied_at: datetime | None


def _release(version: str) -> tuple[int, ...]:
    """A release's number as a comparable tuple (`0.2.0.dev1` -> (0, 2, 0))."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(x) for x in found.group(0).split(".")) if found else (0,)


async def _applied(conn: Connection) -> dict[str, tuple[str, datetime]]:
    if not await conn.fetchval(Q.get_migrations_table):
        return {}
    rows = await conn.fetch(Q.list_applied_migrations)
    return {r["name"]: (r["checksum"], r["applied_at"]) for r in rows}


async def _applied_definitions(conn: Connection) -> dict[str, tuple[str, str, datetime]]:
    if not await conn.fetchval(Q.get_definitions_table):
        return {}
    rows = await conn.fetch(Q.list_applied_definitions)
    return {r["name"]: (r["checksum"], r["version"], r["applied_at"]) for r in rows}


def _states(
    migrations: Sequence[Migration], applied: dict[str, tuple[str, datetime]]
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


def _definition_states(
    definitions: Sequence[Definition], applied: dict[str, tuple[str, str, datetime]]
) -> list[DefinitionState]:
    mine = _release(__version__)
    states = []
    for d in definitions:
        if d.name not in applied:
            states.append(DefinitionState(d.name, "pending", d.checksum, None, None))
            continue
        checksum, version, at = applied[d.name]
        if checksum == d.checksum:
            state: Literal["applied", "pending", "newer"] = "applied"
        else:
            state = "newer" if _release(version) > mine else "pending"
        states.append(DefinitionState(d.name, state, d.checksum, version, at))
    return states


async def status(
    executor: Executor,
    migrations: list[Migration] | None = None,
    *,
    schema: str | None = None,
) -> list[MigrationState]:
    """Every migration file and every applied migration, with its state."""
    migrations = migrations if migrations is not None else load_migrations()
    with using_schema(schema):
        async with db.acquire(executor) as conn:
            return _states(migrations, await _applied(conn))


async def definition_status(
    executor: Executor,
    definitions: list[Definition] | None = None,
    *,
    schema: str | None = None,
) -> list[DefinitionState]:
    """Every definitions file this release ships, with its state against the install."""
    definitions = definitions if definitions is not None else load_definitions()
    with using_schema(schema):
        async with db.acquire(executor) as conn:
            return _definition_states(definitions, await _applied_definitions(conn))


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


async def _elsewhere(conn: Connection, schema: str) -> list[str]:
    """The other schemas of the database that hold an outbox install."""
    return [r["schema"] for r in await conn.fetch(Q.list_installs) if r["schema"] != schema]


def _not_here(schema: str, others: list[str]) -> str:
    """Where the install is, when it is not in the schema in effect."""
    listed = ", ".join(others)
    return (
        f"the outbox is not installed in schema {schema!r}, but this database has an install in "
        f"{listed}: set OUTBOX_SCHEMA={others[0]} to use it (docs/operations.md, 'The schema')"
    )


async def migrate(
    executor: Executor,
    migrations: list[Migration] | None = None,
    *,
    buckets: int | None = None,
    schema: str | None = None,
    definitions: list[Definition] | None = None,
) -> list[str]:
    """Apply pending migrations, then changed definitions, in the install's schema (`schema`,
    default the one in effect); returns the names applied (empty when current). `buckets`:
    how many buckets a first migrate fixes (None: 64); once fixed, another number is refused.
    Refuses to start an install in the default schema when the database has one elsewhere
    (an install from before schemas were an option lives in `public`): name it."""
    migrations = migrations if migrations is not None else load_migrations()
    definitions = definitions if definitions is not None else load_definitions()
    explicit = schema is not None or schema_chosen()
    with using_schema(schema) as target:
        async with db.acquire(executor) as conn:
            version = conn.get_server_version()
            if version.major < MIN_SERVER_VERSION:
                raise MigrationError(
                    f"PostgreSQL {version.major} is too old: outbox needs "
                    f"{MIN_SERVER_VERSION} or newer"
                )
            await conn.fetchval(Q.lock_migrations, _LOCK_KEY)
            try:
                return await _migrate(conn, migrations, definitions, buckets, target, explicit)
            finally:
                await conn.fetchval(Q.unlock_migrations, _LOCK_KEY)


async def _migrate(
    conn: Connection,
    migrations: list[Migration],
    definitions: list[Definition],
    buckets: int | None,
    schema: str,
    explicit: bool,
) -> list[str]:
    if not await conn.fetchval(Q.get_migrations_table):
        others = await _elsewhere(conn, schema)
        if others and not explicit:
            raise MigrationError(_not_here(schema, others))
        if not await conn.fetchval(Q.get_schema_exists):
            await conn.execute(Q.create_schema)
    await conn.execute(Q.create_migrations_table)
    await conn.execute(Q.create_definitions_table)
    states = _states(migrations, await _applied(conn))
    _refuse_unsafe(states)
    pending = {s.name for s in states if s.state == "pending"}
    await _check_buckets(conn, buckets)
    done = []
    for m in migrations:
        if m.name not in pending:
            continue
        for attempt in range(1, MIGRATION_ATTEMPTS + 1):
            try:
                async with conn.transaction():
                    await conn.execute(Q.set_install_path)
                    if buckets is not None:
                        await conn.fetchval(Q.set_migration_buckets, str(buckets))
                    await conn.execute(m.sql)
                    await conn.execute(Q.record_migration, m.name, m.checksum)
                break
            except Exception as exc:
                # Migrated under running processes (a rolling upgrade), its DDL may lose a
                # deadlock against a batch: rolled back whole, it runs again.
                if db.sqlstate_of(exc) != DEADLOCK or attempt == MIGRATION_ATTEMPTS:
                    raise
                _logger.warning("migration.retried", extra={"migration": m.name})
        _logger.info("migration.applied", extra={"migration": m.name, "schema": schema})
        done.append(m.name)
    for d in _definition_states(definitions, await _applied_definitions(conn)):
        if d.state != "pending":
            continue
        (definition,) = (x for x in definitions if x.name == d.name)
        async with conn.transaction():
            await conn.execute(Q.set_install_path)
            await conn.execute(definition.sql)
            await conn.execute(Q.record_definition, d.name, d.checksum, __version__)
        _logger.info("definition.applied", extra={"definition": d.name, "schema": schema})
        done.append(d.name)
    return done


async def _check_buckets(conn: Connection, wanted: int | None) -> None:
    """Refuse a number of buckets other than the one the schema was given."""
    fixed: int | None = await conn.fetchval(Q.get_schema_buckets)
    if wanted is not None and fixed is not None and fixed != wanted:
        raise MigrationError(
            f"OUTBOX_BUCKETS is {wanted} but the schema was given {fixed} buckets when it was "
            "first migrated; the number never changes (unset OUTBOX_BUCKETS, or set it to "
            f"{fixed})"
        )


def script(
    migrations: list[Migration] | None = None,
    definitions: list[Definition] | None = None,
    *,
    buckets: int | None = None,
    schema: str | None = None,
    only_definitions: bool = False,
) -> str:
    """The install as one SQL script, for teams that run migrations with their own tool: the
    schema and the bookkeeping tables, each migration file in its own transaction with the row
    that records it, then each definitions file likewise, so workers find the schema current.
    Apply it once, to a database without the install. `only_definitions`: the definitions
    part alone, which any later release's upgrade ends with (after its new migration files,
    each applied once, in order)."""
    migrations = migrations if migrations is not None else load_migrations()
    definitions = definitions if definitions is not None else load_definitions()
    target = schema if schema is not None else current_schema()

    def sql(text: str) -> str:
        return render(text, target).rstrip().rstrip(";") + ";"

    path = sql(Q.templates()["set_install_path"])
    parts = [
        f"-- outbox, schema {target}: "
        + ("function definitions." if only_definitions else "migrations, then definitions.")
        + " Each file runs in its own",
        "-- transaction and is recorded, as `maintenance migrate` does.",
    ]
    if not only_definitions:
        parts += [
            f"CREATE SCHEMA IF NOT EXISTS {target};",
            sql(Q.templates()["create_migrations_table"]),
            "-- The number of buckets the first migration fixes (OUTBOX_BUCKETS; 64 when unset).",
            f"SET outbox.buckets = {buckets or 64};",
        ]
    parts.append(sql(Q.templates()["create_definitions_table"]))
    for m in [] if only_definitions else migrations:
        # Names match NNNN_name.sql and checksums are hex: the literals need no escaping.
        record = (
            f"INSERT INTO {target}.outbox_schema_migrations (name, checksum) "
            f"VALUES ('{m.name}', '{m.checksum}');"
        )
        parts += ["", f"-- {m.name} (sha256 {m.checksum})", "BEGIN;", path, m.sql.rstrip()]
        parts += [record, "COMMIT;"]
    for d in definitions:
        record = (
            f"INSERT INTO {target}.outbox_schema_definitions (name, checksum, version) "
            f"VALUES ('{d.name}', '{d.checksum}', '{__version__}') ON CONFLICT (name) DO "
            "UPDATE SET checksum = excluded.checksum, version = excluded.version, "
            "applied_at = clock_timestamp();"
        )
        parts += ["", f"-- {d.name} (sha256 {d.checksum})", "BEGIN;", path, d.sql.rstrip()]
        parts += [record, "COMMIT;"]
    return "\n".join(parts) + "\n"


async def check_current(executor: Executor) -> None:
    """Raise SchemaNotReady unless every shipped migration is applied unedited and every
    definitions file is applied as this release ships it (or as a newer release did)."""
    migrations = load_migrations()
    schema = current_schema()
    async with db.acquire(executor) as conn:
        applied = await _applied(conn)
        if not applied:
            others = await _elsewhere(conn, schema)
            if others:
                raise SchemaNotReady(_not_here(schema, others))
            raise SchemaNotReady(
                f"the database is not migrated (no outbox in schema {schema!r}): run "
                "`maintenance migrate`"
            )
        definitions = _definition_states(load_definitions(), await _applied_definitions(conn))
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
    stale = [d.name for d in definitions if d.state == "pending"]
    if stale:
        raise SchemaNotReady(
            f"{len(stale)} function definition file(s) out of date ({', '.join(stale)}): run "
            "`maintenance migrate`"
        )
