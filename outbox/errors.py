"""The exception hierarchy: everything the library raises on purpose derives from OutboxError.

    OutboxError
    ├── UsageError               a command line used wrongly (the CLIs exit 2, nothing connected)
    ├── ConfigError              bad settings or flag combination (one line, names the variable)
    ├── ValidationError          bad input, refused before any write (names the field)
    ├── TransactionRequired      a same-transaction dedup claim outside a transaction (or the
    │                            reverse)
    ├── AppendRefused            the append refused; nothing written, the caller's transaction
    │   │                        goes on
    │   ├── ConcurrencyError     expected_seq did not match the campaign head
    │   ├── DuplicateAppendError idempotency key already used (only with raise_on_duplicate)
    │   └── IdempotencyKeyConflict  the key was used for different events
    ├── DatabaseError            the database, its link or its schema
    │   ├── DatabaseUnavailable  cannot connect; the message carries the redacted DSN only
    │   ├── AppendOutcomeUnknown the connection failed during an append; retry with the same key
    │   ├── TransientBatchError  a batch met a transient database error and rolled back whole
    │   ├── SchemaNotReady       the database lacks migrations or definitions this code needs
    │   └── MigrationError       migration refused (edited file, unknown version, old server)
    ├── RowFailure               a work row's failure, recorded on the row like a projector's
    │   │                        own error
    │   ├── EventUnavailable     the row's journal event is missing or cannot be decoded
    │   ├── UnknownEventType     no projector subscribes to the type and the app does not
    │   │                        ignore it
    │   ├── UpcastFailed         an upcaster raised on an event (the receiving projector's)
    │   ├── LeaseExpired         a leased row's lease ran out before its worker ended it
    │   └── PermanentError       raised by a projector: the row goes dead at once
    │       └── CheckpointGap    the journal lacks events an ordered projector must apply
    ├── OperatorError            an operator's action that does not fit the queue
    │   ├── NotFound             an operator named a row that does not exist
    │   └── Conflict             an operator action does not fit the row's state
    ├── QueryFileError           a named-SQL file and its declaring class disagree (at import)
    └── LocalClusterError        the local development cluster could not be made or run

Messages are single lines, so the CLIs print them as they are. This module imports only the
shared value types (`model`).
"""

from __future__ import annotations

from outbox.model import AppendResult

__all__ = [
    "AppendOutcomeUnknown",
    "AppendRefused",
    "CheckpointGap",
    "ConcurrencyError",
    "ConfigError",
    "Conflict",
    "DatabaseError",
    "DatabaseUnavailable",
    "DuplicateAppendError",
    "EventUnavailable",
    "IdempotencyKeyConflict",
    "LeaseExpired",
    "LocalClusterError",
    "MigrationError",
    "NotFound",
    "OperatorError",
    "OutboxError",
    "PermanentError",
    "QueryFileError",
    "RowFailure",
    "SchemaNotReady",
    "TransactionRequired",
    "TransientBatchError",
    "UnknownEventType",
    "UsageError",
    "ValidationError",
]


class OutboxError(Exception):
    """Root of every error the library raises on purpose."""


class UsageError(OutboxError):
    """A command line was used wrongly (found after parsing): exit 2, nothing connected."""


class ConfigError(OutboxError, ValueError):
    """A setting or a combination of settings is invalid."""


class ValidationError(OutboxError, ValueError):
    """Input is invalid; `field` names the offending part (e.g. `events[2].type`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class AppendRefused(OutboxError):
    """The append refused: nothing was written, and the caller's transaction goes on."""


class DatabaseError(OutboxError):
    """The database, the link to it, or its schema stood in the way (not the input)."""


class RowFailure(OutboxError):
    """A work row's failure: recorded on the row like a projector's own error, retried as the
    failure policy says; every other row goes on."""


class OperatorError(OutboxError):
    """An operator's action does not fit the queue as it is: nothing changed."""


class ConcurrencyError(AppendRefused):
    """The campaign head moved: `expected_seq` did not match `actual_seq`."""

    def __init__(self, campaign_id: str, expected_seq: int, actual_seq: int) -> None:
        super().__init__(
            f"campaign {campaign_id!r}: expected seq {expected_seq}, head is {actual_seq}"
        )
        self.campaign_id = campaign_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq


class DuplicateAppendError(AppendRefused):
    """The idempotency key was used before; `result` is what the first append returned."""

    def __init__(self, result: AppendResult) -> None:
        super().__init__(
            f"campaign {result.campaign_id!r}: idempotency key already appended "
            f"seqs {result.first_seq}..{result.last_seq}"
        )
        self.result = result


class IdempotencyKeyConflict(AppendRefused):
    """The idempotency key was used before for different events: a retry must resend the same
    events (type, payload, metadata); nothing was written. `result` is the first append's."""

    def __init__(self, key: str, result: AppendResult) -> None:
        super().__init__(
            f"campaign {result.campaign_id!r}: idempotency key {key!r} already appended "
            f"seqs {result.first_seq}..{result.last_seq} with different events; a retry must "
            "send the same events, a new request needs a new key"
        )
        self.key = key
        self.result = result


class AppendOutcomeUnknown(DatabaseError):
    """The connection failed while an append was in flight: whether it committed is unknown.

    Retry the same append with the same `idempotency_key`: if the first attempt committed, the
    retry returns its result (`duplicate=True`) and writes nothing; if not, the retry appends.
    Without a key, a retry may append the events twice. When the append ran on your own
    connection inside your transaction, that transaction is lost: start your unit of work over.
    """


class TransactionRequired(OutboxError):
    """A call's transaction contract does not hold: `dedup.claim_in_transaction` needs the
    caller's open transaction; `dedup.claim_now` commits on its own and refuses a connection
    inside one (it would silently join it, and roll back with it)."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached; the message never contains a password. `transient`:
    trying again later may succeed (refused, too many connections, starting up), unlike a bad
    password or a missing database."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class SchemaNotReady(DatabaseError):
    """The database is not migrated to the version this code needs."""


class MigrationError(DatabaseError):
    """A migration cannot be applied safely."""


class QueryFileError(OutboxError):
    """A named-SQL file and its declaring class disagree, or the file is malformed."""


class TransientBatchError(DatabaseError):
    """A transient database error rolled the batch back; nothing changed, retry later.
    `connection_lost`: the connection itself failed (discarded; the database may be down)."""

    def __init__(
        self, message: str, *, connection_lost: bool = False, sqlstate: str | None = None
    ) -> None:
        super().__init__(message)
        self.connection_lost = connection_lost
        self.sqlstate = sqlstate


class EventUnavailable(RowFailure):
    """A work row's journal event is missing or cannot be decoded: a failure of that row
    alone, recorded on it like a projector's failure; every other row goes on."""


class UnknownEventType(RowFailure):
    """No projector subscribes to the type and the app did not declare it ignorable."""


class UpcastFailed(RowFailure):
    """An upcaster raised on an event (`app.upcaster`, issue 62): the event fails for the
    projector that was to receive it (its track, S24), the upcaster named in `last_error`."""


class LeaseExpired(RowFailure):
    """A leased row's lease ran out before its worker finished (the worker died or hung)."""


class PermanentError(RowFailure):
    """Raised by a projector for an event that can never succeed: the row goes dead at once."""


class CheckpointGap(PermanentError):
    """An ordered projector is behind an event and the journal lacks the events between (the
    worker applies any it has first): corruption, so the row goes dead at once."""


class NotFound(OperatorError):
    """The row an operator named does not exist."""


class Conflict(OperatorError):
    """The row an operator named is not in a state the action accepts."""


class LocalClusterError(OutboxError):
    """The local cluster could not be created, started or stopped."""
