"""What a failure costs: error classes, the retry schedule, and the one failure policy.

- **Error classes.** A transient database error (a lost connection, a deadlock, a lock or
  statement timeout, a shutdown; `db.transient` says which) retries without consuming an
  attempt; a projector raising `PermanentError` goes dead at once; anything else consumes one
  attempt.
- **Schedule.** The delay after failed attempt n is drawn from [d/2, d] where
  d = min(cap, base * 2**(n-1)) ("equal jitter": spread out so a fleet does not retry in
  lockstep, yet never sooner than half the nominal delay). The random source is injected; the
  caller turns the delay into an instant with the database clock, never its own.
- **Policy.** `FailurePolicy.fail` turns one failed attempt of a work row into the `Failure`
  to record (attempts, delay or dead, the `last_error` line); `log_failure` writes its line
  once it is recorded. The batch, lease mode, replay and inline apply all call them; nothing
  else decides attempts, backoff or death.

No clock and no database here; the only I/O is the log line.
"""

from __future__ import annotations

import enum
import logging
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import PermanentError
from outbox.model import Failure
from outbox.obs import log

if TYPE_CHECKING:
    from outbox.config import Settings

__all__ = [
    "MAX_ERROR_LENGTH",
    "ErrorClass",
    "FailurePolicy",
    "backoff_delay",
    "classify",
    "describe_error",
    "leaves",
    "log_failure",
    "nominal_delay",
    "sole_error",
]

MAX_ERROR_LENGTH = 2000

# Failed attempts are the worker's story: they log under its name.
_logger = log.get_logger("outbox.worker")


class ErrorClass(enum.Enum):
    TRANSIENT = "transient"  # retry, consume no attempt
    PERMANENT = "permanent"  # dead at once
    FAILURE = "failure"  # consume one attempt


def classify(exc: BaseException) -> ErrorClass:
    if isinstance(exc, PermanentError):
        return ErrorClass.PERMANENT
    if db.transient(exc):
        return ErrorClass.TRANSIENT
    return ErrorClass.FAILURE


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


def leaves(exc: BaseException) -> list[BaseException]:
    """`exc`, or the exceptions inside it when it is a group (a task group's), depth first."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def sole_error(exc: BaseException) -> BaseException:
    """The one error inside `exc` when it is a group holding one (a task group wraps what one
    of its tasks raised), else `exc`: what a one-line report should name."""
    found = leaves(exc)
    return found[0] if len(found) == 1 else exc


def describe_error(exc: BaseException, *, projector: str | None = None) -> str:
    """`Type: message` on one line, bounded in length, for `last_error`; prefixed with
    `projector 'name': ` when a projector raised it."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if projector is not None:
        text = f"projector {projector!r}: {text}"
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - 1] + "…"
    return text


def _default_rand() -> Callable[[], float]:
    # Jitter only spreads retries; it needs no cryptographic randomness.
    return random.Random().random  # noqa: S311


@dataclass(frozen=True)
class FailurePolicy:
    """Attempts, backoff and death of a work row's failed attempt (see the module docstring).
    `rand` is the jitter's random source (tests inject a fixed one)."""

    max_attempts: int = 8
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    rand: Callable[[], float] = field(default_factory=_default_rand)

    @classmethod
    def of(cls, settings: Settings, rand: Callable[[], float] | None = None) -> FailurePolicy:
        return cls(
            settings.max_attempts,
            settings.backoff_base,
            settings.backoff_cap,
            rand if rand is not None else _default_rand(),
        )

    def fail(
        self,
        campaign_id: str,
        seq: int,
        attempts_before: int,
        exc: BaseException,
        *,
        projector: str | None = None,
        permanent: bool | None = None,
    ) -> Failure:
        """The failure of a row's next attempt: attempts, backoff or dead, the error line
        naming the `projector` that raised. `permanent` defaults to what the error's class says
        (PermanentError: dead at once). Call only for errors that consume an attempt (`classify`
        is not TRANSIENT); log it with `log_failure` once it is recorded."""
        if permanent is None:
            permanent = classify(exc) is ErrorClass.PERMANENT
        attempts = attempts_before + 1
        if permanent or attempts >= self.max_attempts:
            dead, delay = True, 0.0
        else:
            delay = backoff_delay(
                attempts, base=self.backoff_base, cap=self.backoff_cap, rand=self.rand
            )
            dead = False
        error = describe_error(exc, projector=projector)
        return Failure(campaign_id, seq, attempts, delay, error, dead, projector)


def log_failure(failure: Failure, exc: BaseException, **extra: object) -> None:
    """One line per failed attempt: at debug while retries remain, at warning when the row goes
    dead (the dead-letter an operator must act on). The message itself names the campaign, seq,
    projector, attempt and error, so an application's own log format shows them; with
    `outbox.obs.log` formatting the line is `event` plus those fields and the traceback."""
    level = logging.WARNING if failure.dead else logging.DEBUG
    if not _logger.isEnabledFor(level):
        return
    event = "apply.dead" if failure.dead else "apply.failed"
    _logger.log(
        level,
        "%s campaign_id=%r seq=%s projector=%r attempt=%s error=%s",
        event,
        failure.campaign_id,
        failure.seq,
        failure.projector,
        failure.attempts,
        failure.error,
        extra={
            "event": event,
            "campaign_id": failure.campaign_id,
            "seq": failure.seq,
            "projector": failure.projector,
            "attempt": failure.attempts,
            "dead": failure.dead,
            "error": failure.error,
            "traceback": "".join(traceback.format_exception(exc)).rstrip(),
            **extra,
        },
    )
