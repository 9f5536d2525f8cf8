"""The console's ASGI app: its routes, its state and who may use it.

`create_app` builds one console's state (`state.Console`, on `app.state.console`) and routes
to the module-level endpoints of `pages`: the overview and its fragments, each page at `/path`
with its JSON twin at `/api/path`, the vendored htmx and styles under `/static`, and, with
`actions`, the controls under `/actions`. Read-only unless `actions=True`. Every request
passes `guard.Guard`: with an `auth` (or basic auth configured in the environment, which
actions require) every route needs it; every response carries the security headers; every
POST comes from the console's own pages and carries the actor's CSRF token. Live figures come
from the shared `Poller`, never from a query per request; pages read once when opened.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from outbox import db
from outbox.config import Settings
from outbox.console import pages, reads
from outbox.console.guard import AccessLog, Guard
from outbox.console.overview import Alarms
from outbox.console.security import Auth, Throttle, basic_auth_from_env, configured_auth
from outbox.console.state import SCHEMA_VERSION, Console, Redact
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
    redact: Redact | None = None,
    origin: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    access_log: AccessLog | None = None,
    throttle: Throttle | None = None,
    alarms: Alarms | None = None,
) -> Starlette:
    """The console on `pool` (the application's, or one of its own).

    `auth` guards every route (default: basic auth from OUTBOX_CONSOLE_USER/_PASSWORD when
    set; `actions` needs one: a ConfigError without). `actions`: serve the controls. `app`:
    the application, whose ordered projectors a discard moves past the row (without it the
    console offers no discard). `refresh`: seconds between reads of the live figures, whatever
    the number of open pages; `count_bound`: rows counted per status at most. `redact`: what
    pages show of each payload (`state.hide_payload` hides them all). `origin`: the console's
    public origin (`https://ops.example.com`), which a POST must come from (default: the
    request's own host); `allowed_hosts`: the Host names served (default: any);
    `access_log`: receives a mapping per request; `throttle`: the failed-login limit;
    `alarms`: when every page shows a banner (`overview.Alarms`). The dead
    policy comes from `settings` (default: `app`'s, else the environment's)."""
    if settings is None:
        settings = app.settings if app is not None else Settings.from_env()
    if auth is None:
        auth = basic_auth_from_env() if actions else configured_auth()
    console = Console.build(
        pool,
        settings,
        app,
        actions=actions,
        refresh=refresh,
        count_bound=count_bound,
        redact=redact,
        alarms=alarms,
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
        routes.append(Route("/done", pages.done_page, name="done"))
    guard = Middleware(
        Guard, auth=auth, throttle=throttle or Throttle(), origin=origin, access_log=access_log
    )
    middleware = [guard]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    served = Starlette(routes=routes, middleware=middleware)
    served.state.console = console
    served.state.poller = console.poller
    return served
