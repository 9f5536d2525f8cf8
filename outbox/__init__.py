"""outbox: durable projection apply for PostgreSQL event-sourced systems.

Append events and enqueue their work rows in one transaction (`append`); workers claim due
rows, run the registered projectors exactly once, and dead-letter what keeps failing.
"""

from outbox.config import Settings
from outbox.db import create_pool
from outbox.errors import (
    ConcurrencyError,
    ConfigError,
    Conflict,
    DatabaseUnavailable,
    DuplicateAppendError,
    MigrationError,
    NotFound,
    OutboxError,
    PermanentError,
    SchemaNotReady,
    ValidationError,
)
from outbox.journal import AppendResult, Event, append

__all__ = [
    "AppendResult",
    "ConcurrencyError",
    "ConfigError",
    "Conflict",
    "DatabaseUnavailable",
    "DuplicateAppendError",
    "Event",
    "MigrationError",
    "NotFound",
    "OutboxError",
    "PermanentError",
    "SchemaNotReady",
    "Settings",
    "ValidationError",
    "append",
    "create_pool",
]

__version__ = "0.1.0"
