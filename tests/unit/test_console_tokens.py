"""CSRF tokens and the failed-login throttle, on a clock the test moves."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")

from outbox.console.security import Csrf, Throttle


def test_a_token_is_its_actors_and_sessions_until_it_expires() -> None:
    now = [1_000_000.0]
    csrf = Csrf("secret", ttl=3600, clock=lambda: now[0])
    token = csrf.token("ann", "session-a")
    assert csrf.valid("ann", "session-a", token)
    assert not csrf.valid("bob", "session-a", token)
    assert not csrf.valid("ann", "session-b", token)
    assert not Csrf("other secret", clock=lambda: now[0]).valid("ann", "session-a", token)
    stamp, _, mac = token.partition(".")
    assert not csrf.valid("ann", "session-a", f"{int(stamp) + 60}.{mac}")  # restamped
    for junk in ("", ".", "x.y", "9" * 40 + "." + mac, mac):
        assert not csrf.valid("ann", "session-a", junk)
    now[0] += 3600
    assert csrf.valid("ann", "session-a", token)
    now[0] += 1
    assert not csrf.valid("ann", "session-a", token)


def test_the_throttle_counts_failures_per_client_within_its_window() -> None:
    now = [0.0]
    throttle = Throttle(limit=2, window=10.0, clock=lambda: now[0])
    throttle.failed("a")
    assert throttle.retry_after("a") is None
    now[0] = 4.0
    throttle.failed("a")
    assert throttle.retry_after("a") == 6.0
    assert throttle.retry_after("b") is None  # another client
    now[0] = 10.0
    assert throttle.retry_after("a") is None  # the first failure left the window
    throttle.failed("a")
    throttle.succeeded("a")
    assert throttle.retry_after("a") is None
