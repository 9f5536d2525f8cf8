"""The outbox's schema in the database: its files, and installing and upgrading it.

    files      the migrations (`sql/NNNN_*.sql`: DDL and data moves, each applied once) and the
               definitions (`*_fn.sql` beside their callers: one CREATE OR REPLACE per server
               function, applied again whenever the file changes); loading, checksums, order
    install    `migrate`, `status`, `check_current`, `script`: the bookkeeping in the install's
               schema (`OUTBOX_SCHEMA`, default `outbox`), the migrators' lock

Everything is re-exported here.
"""

from outbox.schema.files import (
    Definition,
    Migration,
    defined_functions,
    load_definitions,
    load_migrations,
)
from outbox.schema.install import (
    DefinitionState,
    MigrationState,
    check_current,
    definition_status,
    migrate,
    script,
    status,
)

__all__ = [
    "Definition",
    "DefinitionState",
    "Migration",
    "MigrationState",
    "check_current",
    "defined_functions",
    "definition_status",
    "load_definitions",
    "load_migrations",
    "migrate",
    "script",
    "status",
]
