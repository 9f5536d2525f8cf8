"""The console's front door: what every request passes and every response carries.

`Guard` (the outermost middleware of `app.create_app`), in order:
- a parameter holding NUL, a query longer than `MAX_QUERY` or a body longer than `MAX_BODY`
  is a bad request (400, 413), before anything reads it;
- with an `Auth`, every route needs it, the read-only pages and their JSON twins included:
  refused credentials count against the client (`security.Throttle`: 429 past its limit), a
  request without an actor gets 401;
- a POST must come from the console's own pages: a browser's `Sec-Fetch-Site` must say
  `same-origin`, else its `Origin` (or `Referer`) must name the console's host (or the
  configured `origin`); a request that carries none of the three is refused too (a browser
  that strips them all, behind a privacy proxy, cannot be told from a forgery);
- each browser gets a console session (an HttpOnly, SameSite=Strict cookie) that the CSRF
  tokens are bound to;
- every response carries `HEADERS` (a CSP with no inline script and no framing, nosniff, no
  referrer), and `Cache-Control: no-store` unless it is a static file;
- `access_log`, when given, receives one mapping per request: method, path, status, actor,
  client and milliseconds (never a header, a cookie or a form field).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any
from urllib.parse import urlsplit

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp

from outbox.console.security import Auth, Throttle, new_session

__all__ = ["HEADERS", "MAX_BODY", "MAX_QUERY", "SESSION_COOKIE", "AccessLog", "Guard"]

AccessLog = Callable[[Mapping[str, Any]], None]

HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
}
SESSION_COOKIE = "outbox_console_session"
MAX_QUERY = 2048  # bytes of a query string
MAX_BODY = 16 * 1024  # bytes of a form


class Guard(BaseHTTPMiddleware):
    """See the module."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: Auth | None,
        throttle: Throttle,
        origin: str | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        super().__init__(app)
        self.auth = auth
        self.throttle = throttle
        self.origin = origin.rstrip("/") if origin else None
        self.access_log = access_log

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        started = perf_counter()
        request.state.actor = None
        session = request.cookies.get(SESSION_COOKIE, "")
        minted = not (
            16 <= len(session) <= 64 and session.replace("-", "").replace("_", "").isalnum()
        )
        request.state.session = new_session() if minted else session
        response = await self._refusal(request) or await call_next(request)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        if not self._static(request):
            response.headers["cache-control"] = "no-store"
        if minted:
            response.set_cookie(
                SESSION_COOKIE,
                request.state.session,
                path=(request.scope.get("root_path") or "") + "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        if self.access_log is not None:
            self.access_log(
                {
                    "event": "console.request",
                    "method": request.method,
                    "path": request.url.path,
                    "status": response.status_code,
                    "actor": request.state.actor,
                    "client": request.client.host if request.client else None,
                    "ms": round((perf_counter() - started) * 1000, 2),
                }
            )
        return response

    async def _refusal(self, request: Request) -> Response | None:
        """Why `request` goes no further (a response), or None."""
        query = request.scope.get("query_string", b"")
        if len(query) > MAX_QUERY:
            return _refuse(400, f"the query is longer than {MAX_QUERY} bytes")
        if "\x00" in request.url.path or any(
            "\x00" in k or "\x00" in v for k, v in request.query_params.multi_items()
        ):
            return _refuse(400, "a parameter holds a NUL character")
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_BODY:
            return _refuse(413, f"the body is longer than {MAX_BODY} bytes")
        if self.auth is not None:
            client = request.client.host if request.client else "unknown"
            wait = self.throttle.retry_after(client)
            if wait is not None:
                refused = _refuse(429, "too many failed logins: try again later")
                refused.headers["retry-after"] = str(max(1, math.ceil(wait)))
                return refused
            actor = await self.auth(request)
            if not actor:
                if "authorization" in request.headers:
                    self.throttle.failed(client)
                refused = _refuse(401, "authentication required")
                refused.headers["www-authenticate"] = (
                    'Basic realm="outbox console", charset="UTF-8"'
                )
                return refused
            self.throttle.succeeded(client)
            request.state.actor = actor
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            if not any(h in request.headers for h in ("sec-fetch-site", "origin", "referer")):
                return _refuse(
                    403,
                    "request refused: it carries no Sec-Fetch-Site, Origin or Referer, "
                    "so it cannot be told from a forgery: post from the console's own pages",
                )
            if not self._same_origin(request):
                return _refuse(
                    403, "cross-origin request refused: post from the console's own pages"
                )
        return None

    def _same_origin(self, request: Request) -> bool:
        site = request.headers.get("sec-fetch-site")
        if site is not None:
            return site == "same-origin"
        named = request.headers.get("origin") or request.headers.get("referer") or "null"
        if self.origin is not None:
            parts = urlsplit(named)
            return f"{parts.scheme}://{parts.netloc}" == self.origin
        return named != "null" and urlsplit(named).netloc == request.headers.get("host")

    @staticmethod
    def _static(request: Request) -> bool:
        root = request.scope.get("root_path") or ""
        path = request.url.path
        return path.startswith(root + "/static/") or path.startswith("/static/")


def _refuse(status: int, message: str) -> Response:
    return PlainTextResponse(message + "\n", status_code=status)
