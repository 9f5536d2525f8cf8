"""Who may use the console, and proof that a person meant each action.

- **Authentication.** An `Auth` is an async callable taking the request and returning the
  actor's name (what the audit records) or None (refused: 401). A mounting application passes
  its own (its session, its SSO); `maintenance console` uses HTTP basic auth from
  `OUTBOX_CONSOLE_USER` and `OUTBOX_CONSOLE_PASSWORD`, compared in constant time. Once
  configured it guards every route, the read-only pages included (`configured_auth`).
- **Throttling.** `Throttle` counts refused credentials per client: past `limit` within
  `window` seconds the client gets 429 until the window has passed, whatever it sends.
- **CSRF.** Every form that changes something carries a token bound to the actor and to the
  browser's console session (a random cookie), stamped with its issue time and valid for
  `Csrf.ttl` seconds: an HMAC under a secret drawn when the app starts
  (`OUTBOX_CONSOLE_SECRET` keeps it across restarts and replicas). A POST without a live token
  of its actor and session is refused (403), so another site cannot make a logged-in browser
  act, and a token copied out of one session is worth nothing in another or a day later.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from starlette.requests import Request

from outbox.errors import ConfigError

__all__ = [
    "Auth",
    "Csrf",
    "Throttle",
    "basic_auth",
    "basic_auth_from_env",
    "configured_auth",
    "new_session",
]

Auth = Callable[[Request], Awaitable[str | None]]
Clock = Callable[[], float]

USER_ENV = "OUTBOX_CONSOLE_USER"
PASSWORD_ENV = "OUTBOX_CONSOLE_PASSWORD"  # noqa: S105 (a variable's name, not a password)
SECRET_ENV = "OUTBOX_CONSOLE_SECRET"  # noqa: S105


def basic_auth(user: str, password: str) -> Auth:
    """HTTP basic auth against one user and password."""
    want = f"{user}:{password}".encode()

    async def check(request: Request) -> str | None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            given = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        return user if hmac.compare_digest(given, want) else None

    return check


def basic_auth_from_env(env: Mapping[str, str] | None = None) -> Auth:
    """Basic auth from OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD; ConfigError when either
    is missing or blank (actions are never served unauthenticated)."""
    found = configured_auth(env)
    if found is None:
        raise ConfigError(
            f"console actions need authentication: set {USER_ENV} and {PASSWORD_ENV} "
            "(or mount outbox.console.create_app with an auth hook)"
        )
    return found


def configured_auth(env: Mapping[str, str] | None = None) -> Auth | None:
    """Basic auth when OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD are both set; None when
    neither is; ConfigError when only one is, or the user name cannot be a basic-auth one."""
    env = os.environ if env is None else env
    user, password = env.get(USER_ENV, ""), env.get(PASSWORD_ENV, "")
    if not user.strip() and not password:
        return None
    if not user.strip() or not password:
        missing = PASSWORD_ENV if user.strip() else USER_ENV
        raise ConfigError(f"{missing} is not set: console authentication needs both")
    if ":" in user:
        raise ConfigError(f"{USER_ENV}: a basic-auth user name cannot contain ':'")
    return basic_auth(user, password)


def new_session() -> str:
    """A browser's console session id (the cookie's value)."""
    return secrets.token_urlsafe(24)


class Csrf:
    """Tokens bound to the actor and the session, valid `ttl` seconds (see the module)."""

    def __init__(
        self, secret: str | None = None, *, ttl: float = 8 * 3600, clock: Clock = time.time
    ) -> None:
        given = secret if secret is not None else os.environ.get(SECRET_ENV)
        self._key = given.encode() if given else secrets.token_bytes(32)
        self.ttl = ttl
        self._clock = clock

    def _mac(self, actor: str, session: str, issued: int) -> str:
        message = f"{issued}\n{session}\n{actor}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def token(self, actor: str, session: str) -> str:
        issued = int(self._clock())
        return f"{issued}.{self._mac(actor, session, issued)}"

    def valid(self, actor: str, session: str, token: str) -> bool:
        stamp, _, mac = token.partition(".")
        if not stamp.isdigit() or len(stamp) > 12:
            return False
        issued = int(stamp)
        if not 0 <= self._clock() - issued <= self.ttl:
            return False
        return hmac.compare_digest(self._mac(actor, session, issued), mac)


@dataclass
class Throttle:
    """Refused credentials per client: `limit` within `window` seconds, then 429 until the
    oldest of them leaves the window."""

    limit: int = 5
    window: float = 60.0
    clock: Clock = time.monotonic
    _failures: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def _recent(self, client: str) -> list[float]:
        now = self.clock()
        kept = [t for t in self._failures.get(client, []) if now - t < self.window]
        if kept:
            self._failures[client] = kept
        else:
            self._failures.pop(client, None)
        return kept

    def retry_after(self, client: str) -> float | None:
        """Seconds until `client` may try again; None: it may now."""
        recent = self._recent(client)
        if len(recent) < self.limit:
            return None
        return max(0.0, self.window - (self.clock() - recent[0]))

    def failed(self, client: str) -> None:
        self._failures.setdefault(client, []).append(self.clock())
        if len(self._failures) > 10_000:  # bounded memory under a spray of clients
            self._failures.pop(next(iter(self._failures)))

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)
