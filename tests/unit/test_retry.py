"""The backoff schedule, the error classes and the failure policy (pure, seeded randomness)."""

from __future__ import annotations

import random

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import PermanentError
from outbox.config import Settings
from outbox.retry import (
    ErrorClass,
    FailurePolicy,
    backoff_delay,
    classify,
    describe_error,
    nominal_delay,
    sole_error,
)


@pytest.mark.parametrize("attempt", range(1, 9))
def test_delay_bounds_for_attempts_1_to_8_with_defaults(attempt: int) -> None:
    rng = random.Random(attempt)
    nominal = min(300.0, 1.0 * 2 ** (attempt - 1))
    delays = [backoff_delay(attempt, base=1.0, cap=300.0, rand=rng.random) for _ in range(500)]
    assert all(nominal / 2 <= d <= nominal for d in delays)
    # The jitter spreads: not every draw lands on the same value.
    assert max(delays) - min(delays) > nominal / 4


def test_cap_is_honoured_and_the_schedule_doubles() -> None:
    assert [nominal_delay(n, base=1.0, cap=300.0) for n in range(1, 11)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        300,
    ]
    assert nominal_delay(10_000, base=2.0, cap=60.0) == 60.0
    assert backoff_delay(50, base=1.0, cap=5.0, rand=lambda: 0.999999) <= 5.0


def test_extremes_of_the_random_source() -> None:
    assert backoff_delay(3, base=1.0, cap=300.0, rand=lambda: 0.0) == 2.0
    assert backoff_delay(3, base=1.0, cap=300.0, rand=lambda: 1.0) == 4.0


@given(
    attempt=st.integers(1, 10_000),
    base=st.floats(0.001, 86_400),
    spread=st.floats(1, 100),
    r=st.floats(0, 1, exclude_max=True),
)
def test_delay_is_always_within_half_and_whole_of_the_capped_nominal(
    attempt: int, base: float, spread: float, r: float
) -> None:
    cap = base * spread
    d = backoff_delay(attempt, base=base, cap=cap, rand=lambda: r)
    nominal = nominal_delay(attempt, base=base, cap=cap)
    assert nominal <= cap
    assert nominal / 2 <= d <= nominal


def test_attempt_zero_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="attempt"):
        nominal_delay(0, base=1, cap=2)


def _pg_error(cls: type[asyncpg.PostgresError]) -> asyncpg.PostgresError:
    return cls("boom")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (PermanentError("never"), ErrorClass.PERMANENT),
        (_pg_error(asyncpg.SerializationError), ErrorClass.TRANSIENT),
        (_pg_error(asyncpg.DeadlockDetectedError), ErrorClass.TRANSIENT),
        (_pg_error(asyncpg.LockNotAvailableError), ErrorClass.TRANSIENT),
        (_pg_error(asyncpg.QueryCanceledError), ErrorClass.TRANSIENT),
        (_pg_error(asyncpg.AdminShutdownError), ErrorClass.TRANSIENT),
        (_pg_error(asyncpg.ConnectionFailureError), ErrorClass.TRANSIENT),
        (_pg_error(asyncpg.TooManyConnectionsError), ErrorClass.TRANSIENT),
        (asyncpg.ConnectionDoesNotExistError("gone"), ErrorClass.TRANSIENT),
        (asyncpg.InterfaceError("closed"), ErrorClass.TRANSIENT),
        (ConnectionResetError(), ErrorClass.TRANSIENT),
        (TimeoutError(), ErrorClass.TRANSIENT),
        (_pg_error(asyncpg.UniqueViolationError), ErrorClass.FAILURE),
        (_pg_error(asyncpg.UndefinedTableError), ErrorClass.FAILURE),
        (ValueError("bad payload"), ErrorClass.FAILURE),
        (KeyError("x"), ErrorClass.FAILURE),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_error_classes(exc: BaseException, expected: ErrorClass) -> None:
    assert classify(exc) is expected


def test_describe_error_is_one_bounded_line() -> None:
    text = describe_error(ValueError("line one\nline two " + "x" * 5000))
    assert text.startswith("ValueError: line one line two")
    assert "\n" not in text
    assert len(text) == 2000


def test_the_policy_counts_the_attempt_and_draws_the_delay_from_its_random_source() -> None:
    policy = FailurePolicy(max_attempts=8, backoff_base=2.0, backoff_cap=60.0, rand=lambda: 0.5)
    failure = policy.fail("c", 4, 2, KeyError("memo"), projector="alerts")
    assert (failure.campaign_id, failure.seq, failure.attempts, failure.dead) == ("c", 4, 3, False)
    assert failure.delay == 0.75 * nominal_delay(3, base=2.0, cap=60.0)  # [d/2, d] at 0.5
    assert failure.error == "projector 'alerts': KeyError: 'memo'"
    assert failure.projector == "alerts"


def test_the_last_attempt_and_a_permanent_error_are_dead_at_once() -> None:
    policy = FailurePolicy(max_attempts=3, rand=lambda: 0.0)
    assert policy.fail("c", 1, 1, ValueError("x")).dead is False
    last = policy.fail("c", 1, 2, ValueError("x"))
    assert (last.attempts, last.dead, last.delay) == (3, True, 0.0)
    permanent = policy.fail("c", 1, 0, PermanentError("never"))
    assert (permanent.attempts, permanent.dead) == (1, True)
    assert policy.fail("c", 1, 0, ValueError("x"), permanent=True).dead


def test_the_policy_follows_the_settings_knobs() -> None:
    settings = Settings(max_attempts=5, backoff_base=0.5, backoff_cap=4.0)
    policy = FailurePolicy.of(settings, rand=lambda: 0.999)
    assert (policy.max_attempts, policy.backoff_base, policy.backoff_cap) == (5, 0.5, 4.0)
    delays = [policy.fail("c", 1, n, ValueError("x")).delay for n in range(4)]
    assert delays == pytest.approx([0.5, 1.0, 2.0, 4.0], rel=1e-3)
    assert policy.fail("c", 1, 4, ValueError("x")).dead


def test_sole_error_names_what_a_group_of_one_holds() -> None:
    """A task group wraps its task's error: a one-line report names that error, not the group;
    a group of several, or a plain error, is itself."""
    inner = asyncpg.exceptions.CannotConnectNowError("the database system is shutting down")
    assert sole_error(ExceptionGroup("tg", [ExceptionGroup("inner", [inner])])) is inner
    several = ExceptionGroup("tg", [ValueError("a"), KeyError("b")])
    assert sole_error(several) is several
    plain = ValueError("plain")
    assert sole_error(plain) is plain
