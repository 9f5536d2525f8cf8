"""Who may act in the console, and proof that a person meant each action.

- **Authentication.** An `Auth` is an async callable taking the request and returning the
  actor's name (what the audit records) or None (refused: 401). A mounting application passes
  its own (its session, its SSO); `maintenance console --allow-actions` uses HTTP basic auth
  from `OUTBOX_CONSOLE_USER` and `OUTBOX_CONSOLE_PASSWORD`, compared in constant time.
- **CSRF.** Every form that changes something carries a token: an HMAC of the actor under a
  secret drawn when the app starts (`OUTBOX_CONSOLE_SECRET` keeps it across restarts and
  replicas). A POST without the actor's token is refused (403), so another site cannot make a
  logged-in browser act.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request

from outbox.errors import ConfigError

__all__ = ["Auth", "Csrf", "basic_auth", "basic_auth_from_env"]

Auth = Callable[[Request], Awaitable[str | None]]

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
    env = os.environ if env is None else env
    user, password = env.get(USER_ENV, ""), env.get(PASSWORD_ENV, "")
    if not user.strip() or not password:
        raise ConfigError(
            f"console actions need authentication: set {USER_ENV} and {PASSWORD_ENV} "
            "(or mount outbox.console.create_app with an auth hook)"
        )
    if ":" in user:
        raise ConfigError(f"{USER_ENV}: a basic-auth user name cannot contain ':'")
    return basic_auth(user, password)


class Csrf:
    """Tokens bound to the actor (see the module)."""

    def __init__(self, secret: str | None = None) -> None:
        given = secret if secret is not None else os.environ.get(SECRET_ENV)
        self._key = given.encode() if given else secrets.token_bytes(32)

    def token(self, actor: str) -> str:
        return hmac.new(self._key, actor.encode(), hashlib.sha256).hexdigest()

    def valid(self, actor: str, token: str) -> bool:
        return hmac.compare_digest(self.token(actor), token)
