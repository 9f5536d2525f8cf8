"""outbox: durable projection apply for PostgreSQL event-sourced systems.

Append events and enqueue their work rows in one transaction (`append`); workers claim due
rows, run the registered projectors exactly once, and dead-letter what keeps failing. This
module is the public API: everything in `__all__` is kept stable; the subpackages are the
implementation (docs/architecture.md draws them).
"""

from outbox import sync
from outbox.append.api import append
from outbox.config import Settings
from outbox.db import Connection, Executor, Pool, create_pool
from outbox.errors import (
    AppendOutcomeUnknown,
    AppendRefused,
    CheckpointGap,
    ConcurrencyError,
    ConfigError,
    Conflict,
    DatabaseError,
    DatabaseUnavailable,
    DuplicateAppendError,
    EventUnavailable,
    IdempotencyKeyConflict,
    LeaseExpired,
    MigrationError,
    NotFound,
    OperatorError,
    OutboxError,
    PermanentError,
    RowFailure,
    SchemaNotReady,
    TransactionRequired,
    UnknownEventType,
    ValidationError,
)
from outbox.model import AppendResult, BatchCounts, Event, EventBatch, StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.registry import replaying, running_projector
from outbox.projection.versions import live_version
from outbox.queries import using_schema
from outbox.queue.applied import Applied, wait_applied
from outbox.version import __version__ as __version__
from outbox.worker.runtime import drain_now, running_worker

__all__ = [
    "AppendOutcomeUnknown",
    "AppendRefused",
    "AppendResult",
    "Applied",
    "BatchCounts",
    "CheckpointGap",
    "ConcurrencyError",
    "ConfigError",
    "Conflict",
    "Connection",
    "DatabaseError",
    "DatabaseUnavailable",
    "DuplicateAppendError",
    "Event",
    "EventBatch",
    "EventUnavailable",
    "Executor",
    "IdempotencyKeyConflict",
    "LeaseExpired",
    "MigrationError",
    "NotFound",
    "OperatorError",
    "Outbox",
    "OutboxError",
    "PermanentError",
    "Pool",
    "RowFailure",
    "SchemaNotReady",
    "Settings",
    "StoredEvent",
    "TransactionRequired",
    "UnknownEventType",
    "ValidationError",
    "append",
    "create_pool",
    "drain_now",
    "live_version",
    "replaying",
    "running_projector",
    "running_worker",
    "sync",
    "using_schema",
    "wait_applied",
]
