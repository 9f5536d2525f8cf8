"""Retry schedule and error classes (S15, S16). Pure functions: no clock, no database.

The delay after failed attempt n is drawn from [d/2, d] where d = min(cap, base * 2**(n-1))
("equal jitter": spread out so a fleet does not retry in lockstep, yet never hammering sooner
than half the nominal delay). The random source is injected; the worker turns the delay into an
instant with the database clock (`clock_timestamp() + delay`), never its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import asyncpg

from outbox.errors import PermanentError

__all__ = [
    "ErrorClass",
    "after_failure",
    "backoff_delay",
    "classify",
    "connection_lost",
    "describe_error",
    "nominal_delay",
    "sqlstate_of",
]

MAX_ERROR_LENGTH = 2000

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


def describe_error(exc: BaseException) -> str:
    """`Type: message` on one line, bounded in length, for `last_error`."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - 1] + "…"
    return text
