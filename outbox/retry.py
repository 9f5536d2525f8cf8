"""Retry schedule and error classes (S15, S16). Pure functions: no clock, no database.

The delay after failed attempt n is drawn from [d/2, d] where d = min(cap, base * 2**(n-1))
("equal jitter": spread out so a fleet does not retry in lockstep, yet never hammering sooner
than half the nominal delay). The random source is injected; the worker turns the delay into an
instant with the database clock (`clock_timestamp() + delay`), never its own.
"""

from __future__ import annotations

import enum
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

import asyncpg

from outbox import log
from outbox.errors import PermanentError

if TYPE_CHECKING:
    from outbox.queue import Failure

__all__ = [
    "ErrorClass",
    "after_failure",
    "backoff_delay",
    "classify",
    "connection_lost",
    "describe_error",
    "log_failure",
    "nominal_delay",
    "sqlstate_of",
]

MAX_ERROR_LENGTH = 2000

# Failed attempts are the worker's story: they log under its name.
_logger = log.get_logger("outbox.worker")

# SQLSTATEs that say "try again" about the session or the moment, not about the event.
_TRANSIENT_SQLSTATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "53300",  # too_many_connections
    "25P03",  # idle_in_transaction_session_timeout
}
_TRANSIENT_CLASSES = ("08",)  # connection_exception and its kin


# SQLSTATEs after which the session itself is gone (the server ends it, or never had it).
_SESSION_ENDING_SQLSTATES = {"57P01", "57P02", "57P03", "25P03"}


# InterfaceErrors that describe a query's arguments or the client, not the connection: a
# projector passing a string for an integer is a failure of its event, not a transient error.
_NOT_CONNECTION_ERRORS = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions.ClientConfigurationError,
    asyncpg.exceptions.UnsupportedClientFeatureError,
    asyncpg.exceptions.UnsupportedServerFeatureError,
)


class ErrorClass(enum.Enum):
    TRANSIENT = "transient"  # retry, consume no attempt
    PERMANENT = "permanent"  # dead at once
    FAILURE = "failure"  # consume one attempt


def nominal_delay(attempt: int, *, base: float, cap: float) -> float:
    """min(cap, base * 2**(attempt-1)) for attempt >= 1, without overflow for large attempts."""
    if attempt < 1:
        raise ValueError("attempt starts at 1")
    exponent = min(attempt - 1, 1024)
    try:
        return min(cap, base * 2.0**exponent)
    except OverflowError:
        return cap


def backoff_delay(attempt: int, *, base: float, cap: float, rand: Callable[[], float]) -> float:
    """Seconds to wait after failed attempt `attempt`; `rand()` returns a float in [0, 1)."""
    nominal = nominal_delay(attempt, base=base, cap=cap)
    return nominal / 2 + rand() * nominal / 2


def after_failure(
    attempt: int,
    *,
    permanent: bool,
    max_attempts: int,
    base: float,
    cap: float,
    rand: Callable[[], float],
) -> tuple[bool, float]:
    """(dead, delay) after failed attempt `attempt`: dead at `max_attempts` or on a permanent
    error, otherwise the jittered backoff delay. The one place that policy lives (the worker
    and inline apply both call it)."""
    if permanent or attempt >= max_attempts:
        return True, 0.0
    return False, backoff_delay(attempt, base=base, cap=cap, rand=rand)


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE a server error carries (None for client-side errors)."""
    if isinstance(exc, asyncpg.PostgresError):
        return getattr(exc, "sqlstate", None) or None
    return None


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection it came from is unusable: the socket is gone, the
    server ended the session, or the driver's protocol state is broken. asyncpg raises
    `InternalClientError` ("cannot switch to state ...; another operation is in progress")
    when a connection whose backend was terminated mid-statement is reset or released
    (MagicStack/asyncpg#784): that is a lost connection too, never a projector's failure."""
    if isinstance(exc, _NOT_CONNECTION_ERRORS):
        return False  # bad arguments or features: the caller's mistake, not the connection
    if isinstance(exc, asyncpg.InternalClientError | asyncpg.InterfaceError):
        return True
    state = sqlstate_of(exc)
    if state is not None:
        return state.startswith(_TRANSIENT_CLASSES) or state in _SESSION_ENDING_SQLSTATES
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError | PermissionError)


def classify(exc: BaseException) -> ErrorClass:
    if isinstance(exc, PermanentError):
        return ErrorClass.PERMANENT
    if connection_lost(exc):
        return ErrorClass.TRANSIENT
    state = sqlstate_of(exc)
    if state is not None and state in _TRANSIENT_SQLSTATES:
        return ErrorClass.TRANSIENT
    return ErrorClass.FAILURE


def describe_error(exc: BaseException, *, projector: str | None = None) -> str:
    """`Type: message` on one line, bounded in length, for `last_error`; prefixed with
    `projector 'name': ` when a projector raised it."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if projector is not None:
        text = f"projector {projector!r}: {text}"
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - 1] + "…"
    return text


def log_failure(
    campaign_id: str, seq: int, failure: Failure, exc: BaseException, **extra: object
) -> None:
    """One line per failed attempt, with the traceback as a field: at debug while retries
    remain, at warning when the row goes dead (the dead-letter an operator must act on)."""
    level = logging.WARNING if failure.dead else logging.DEBUG
    if not _logger.isEnabledFor(level):
        return
    _logger.log(
        level,
        "apply.dead" if failure.dead else "apply.failed",
        extra={
            "campaign_id": campaign_id,
            "seq": seq,
            "attempt": failure.attempts,
            "dead": failure.dead,
            "error": failure.error,
            "traceback": "".join(traceback.format_exception(exc)).rstrip(),
            **extra,
        },
    )
