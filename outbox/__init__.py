"""outbox: durable projection apply for PostgreSQL event-sourced systems.

Append events and enqueue their work rows in one transaction (`append`); workers claim due
rows, run the registered projectors exactly once, and dead-letter what keeps failing. This
module is the public API: everything in `__all__` is kept stable; the subpackages are the
implementation (docs/architecture.md draws them).

Each public name is imported on first use (PEP 562): `import outbox` costs nothing more, so a
console script's entry (`outbox._entry`) holds its signals before the worker's imports run.
"""

import sys as _sys
import typing as _typing
from importlib import import_module as _import_module
from types import ModuleType as _ModuleType

from outbox.version import __version__ as __version__

if _typing.TYPE_CHECKING:
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
        UpcastFailed,
        ValidationError,
    )
    from outbox.model import AppendResult, BatchCounts, Event, EventBatch, StoredEvent
    from outbox.projection.app import Outbox
    from outbox.projection.registry import replaying, running_projector
    from outbox.projection.versions import live_version
    from outbox.queries import using_schema
    from outbox.queue.applied import Applied, wait_applied
    from outbox.worker.runtime import drain_now, running_worker

# Where each public name lives (`sync` is a module of its own).
_HOMES: dict[str, str] = {
    "append": "outbox.append.api",
    "AppendOutcomeUnknown": "outbox.errors",
    "AppendRefused": "outbox.errors",
    "AppendResult": "outbox.model",
    "Applied": "outbox.queue.applied",
    "BatchCounts": "outbox.model",
    "CheckpointGap": "outbox.errors",
    "ConcurrencyError": "outbox.errors",
    "ConfigError": "outbox.errors",
    "Conflict": "outbox.errors",
    "Connection": "outbox.db",
    "create_pool": "outbox.db",
    "DatabaseError": "outbox.errors",
    "DatabaseUnavailable": "outbox.errors",
    "drain_now": "outbox.worker.runtime",
    "DuplicateAppendError": "outbox.errors",
    "Event": "outbox.model",
    "EventBatch": "outbox.model",
    "EventUnavailable": "outbox.errors",
    "Executor": "outbox.db",
    "IdempotencyKeyConflict": "outbox.errors",
    "LeaseExpired": "outbox.errors",
    "live_version": "outbox.projection.versions",
    "MigrationError": "outbox.errors",
    "NotFound": "outbox.errors",
    "OperatorError": "outbox.errors",
    "Outbox": "outbox.projection.app",
    "OutboxError": "outbox.errors",
    "PermanentError": "outbox.errors",
    "Pool": "outbox.db",
    "replaying": "outbox.projection.registry",
    "RowFailure": "outbox.errors",
    "running_projector": "outbox.projection.registry",
    "running_worker": "outbox.worker.runtime",
    "SchemaNotReady": "outbox.errors",
    "Settings": "outbox.config",
    "StoredEvent": "outbox.model",
    "sync": "outbox.sync",
    "TransactionRequired": "outbox.errors",
    "UnknownEventType": "outbox.errors",
    "UpcastFailed": "outbox.errors",
    "using_schema": "outbox.queries",
    "ValidationError": "outbox.errors",
    "wait_applied": "outbox.queue.applied",
}


class _Package(_ModuleType):
    """`outbox` itself. `outbox.append` is the function, as it always was: the import system
    sets a package's attribute to each subpackage it imports (`outbox.append`, the append's
    modules), which here would replace the function once anything imported them."""

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        if name == "append" and isinstance(value, _ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> _typing.Any:
    """A public name, imported from its home on first use; else a submodule of that name (what
    `import outbox; outbox.db` found when this module imported everything)."""
    home = _HOMES.get(name)
    try:
        module = _import_module(home if home is not None else f"outbox.{name}")
    except ModuleNotFoundError as exc:
        if home is not None or exc.name != f"outbox.{name}":
            raise
        raise AttributeError(f"module 'outbox' has no attribute {name!r}") from None
    value = module if home is None or home == f"outbox.{name}" else getattr(module, name)
    globals()[name] = value
    return value


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
    "UpcastFailed",
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
