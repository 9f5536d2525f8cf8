"""outbox: durable projection apply for PostgreSQL event-sourced systems.

Append events and enqueue their work rows in one transaction (`append`); workers claim due
rows, run the registered projectors exactly once, and dead-letter what keeps failing.
"""

from outbox.config import Settings
from outbox.db import create_pool
from outbox.errors import (
    AppendOutcomeUnknown,
    ConcurrencyError,
    ConfigError,
    Conflict,
    DatabaseUnavailable,
    DuplicateAppendError,
    EventUnavailable,
    IdempotencyKeyConflict,
    MigrationError,
    NotFound,
    OutboxError,
    PermanentError,
    SchemaNotReady,
    TransactionRequired,
    ValidationError,
)
from outbox.inprocess import drain_now, running_worker
from outbox.journal import AppendResult, Event, StoredEvent, append
from outbox.projectors import Outbox
from outbox.queue import wait_applied
from outbox.worker import BatchCounts

__all__ = [
    "AppendOutcomeUnknown",
    "AppendResult",
    "BatchCounts",
    "ConcurrencyError",
    "ConfigError",
    "Conflict",
    "DatabaseUnavailable",
    "DuplicateAppendError",
    "Event",
    "EventUnavailable",
    "IdempotencyKeyConflict",
    "MigrationError",
    "NotFound",
    "Outbox",
    "OutboxError",
    "PermanentError",
    "SchemaNotReady",
    "Settings",
    "StoredEvent",
    "TransactionRequired",
    "ValidationError",
    "append",
    "create_pool",
    "drain_now",
    "running_worker",
    "wait_applied",
]

__version__ = "0.1.0"
