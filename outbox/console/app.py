"""The console's ASGI app: routes, templates, the JSON twins.

Read-only: every route is a GET (anything else is 405). HTML is rendered by Jinja2 with
autoescaping, so ids, errors and payloads from the data are inert. The overview page polls its
own fragment with htmx; the figures come from the shared `Poller`, never from a query per
request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from outbox import db
from outbox.config import Settings
from outbox.console.overview import COUNT_BOUND, Overview, Poller

__all__ = ["SCHEMA_VERSION", "create_app"]

SCHEMA_VERSION = 1
_STATIC = Path(__file__).with_name("static")


def create_app(
    pool: db.Pool,
    *,
    settings: Settings | None = None,
    refresh: float = 2.0,
    count_bound: int = COUNT_BOUND,
) -> Starlette:
    """The console on `pool` (the application's, or one of its own). `refresh`: seconds between
    reads of the figures, whatever the number of open pages; `count_bound`: rows counted per
    status at most. The dead policy comes from `settings` (default: the environment's)."""
    settings = settings if settings is not None else Settings.from_env()
    poller = Poller(pool, park=settings.park, interval=refresh, bound=count_bound)
    templates = Environment(
        loader=PackageLoader("outbox.console", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )

    def render(name: str, request: Request, **context: Any) -> HTMLResponse:
        page = templates.get_template(name).render(request=request, **context)
        return HTMLResponse(page)

    async def overview_page(request: Request) -> Response:
        return render("overview.html", request, **await _overview_context(poller))

    async def overview_fragment(request: Request) -> Response:
        return render("_overview.html", request, **await _overview_context(poller))

    async def overview_json(request: Request) -> Response:
        overview = await poller.get()
        body = {
            "schema_version": SCHEMA_VERSION,
            "mode": "console-overview",
            "error": poller.error,
            "overview": overview,
        }
        return Response(orjson.dumps(body), media_type="application/json")

    app = Starlette(
        routes=[
            Route("/", overview_page, name="overview"),
            Route("/fragments/overview", overview_fragment, name="overview_fragment"),
            Route("/api/overview", overview_json, name="overview_json"),
            Mount("/static", StaticFiles(directory=_STATIC), name="static"),
        ]
    )
    app.state.poller = poller
    return app


async def _overview_context(poller: Poller) -> dict[str, Any]:
    overview: Overview | None = await poller.get()
    return {"overview": overview, "error": poller.error, "refresh": poller.interval}
