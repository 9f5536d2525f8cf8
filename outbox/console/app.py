"""The console's ASGI app: its routes, its state and who may use it.

`create_app` builds one console's state (`state.Console`, on `app.state.console`) and routes
to the module-level endpoints of `pages`: the overview and its fragments, each page at `/path`
with its JSON twin at `/api/path`, the vendored htmx and styles under `/static`, and, with
`actions`, the controls under `/actions`. Read-only unless `actions=True`: then every request
must authenticate (`auth`, default basic auth from the environment) and every POST carries the
actor's CSRF token. Live figures come from the shared `Poller`, never from a query per
request; pages read once when opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from outbox import db
from outbox.config import Settings
from outbox.console import pages, reads
from outbox.console.security import Auth, basic_auth_from_env
from outbox.console.state import SCHEMA_VERSION, Console
from outbox.projection.app import Outbox

__all__ = ["SCHEMA_VERSION", "create_app"]

_STATIC = Path(__file__).with_name("static")


def create_app(
    pool: db.Pool,
    *,
    actions: bool = False,
    auth: Auth | None = None,
    app: Outbox | None = None,
    settings: Settings | None = None,
    refresh: float = 5.0,
    count_bound: int = reads.COUNT_BOUND,
) -> Starlette:
    """The console on `pool` (the application's, or one of its own). `actions`: serve the
    controls, behind `auth` (default: basic auth from OUTBOX_CONSOLE_USER/_PASSWORD; a
    ConfigError when unset). `app`: the application, whose ordered projectors a discard moves
    past the row (without it the console offers no discard). `refresh`: seconds between reads
    of the live figures, whatever the number of open pages; `count_bound`: rows counted per
    status at most. The dead policy comes from
    `settings` (default: `app`'s, else the environment's)."""
    if settings is None:
        settings = app.settings if app is not None else Settings.from_env()
    if actions and auth is None:
        auth = basic_auth_from_env()
    console = Console.build(
        pool, settings, app, actions=actions, refresh=refresh, count_bound=count_bound
    )
    routes: list[BaseRoute] = [
        Route("/", pages.overview_page, name="overview"),
        Route("/fragments/overview", pages.overview_fragment, name="overview_fragment"),
        Route("/fragments/live", pages.live_fragment, name="live_fragment"),
        Route("/api/overview", pages.overview_json, name="overview_json"),
    ]
    for path, template, read in pages.PAGES:
        name = path.replace("/", "_")
        routes += [
            Route(f"/{path}", pages.page(template, name, read, twin=False), name=name),
            Route(f"/api/{path}", pages.page(template, name, read, twin=True), name=f"{name}_json"),
        ]
    routes.append(Mount("/static", StaticFiles(directory=_STATIC), name="static"))
    if actions:
        routes += [
            Route(f"/actions/{path}", pages.control(run), methods=["POST"], name=name)
            for path, name, run in pages.CONTROLS
        ]
    middleware = [Middleware(_Authenticate, auth=auth)] if auth is not None else []
    served = Starlette(routes=routes, middleware=middleware)
    served.state.console = console
    served.state.poller = console.poller
    return served


class _Authenticate(BaseHTTPMiddleware):
    """Every request names its actor (`request.state.actor`) or gets 401."""

    def __init__(self, app: Any, auth: Auth) -> None:
        super().__init__(app)
        self.auth = auth

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        actor = await self.auth(request)
        if not actor:
            return Response(
                "authentication required\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="outbox console", charset="UTF-8"'},
            )
        request.state.actor = actor
        return await call_next(request)
