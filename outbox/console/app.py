"""The console's ASGI app: routes, templates, the JSON twins, and (with actions) the controls.

Read-only unless `actions=True`: then every request must authenticate (`auth`, default basic
auth from the environment) and every POST carries the actor's CSRF token. HTML is rendered by
Jinja2 with autoescaping, so ids, errors and payloads from the data are inert. Live figures
come from the shared `Poller`, never from a query per request; pages read once when opened.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from outbox import db
from outbox.config import Settings
from outbox.console import actions as controls
from outbox.console import reads
from outbox.console.history import polyline
from outbox.console.overview import Poller
from outbox.console.security import Auth, Csrf, basic_auth_from_env
from outbox.errors import Conflict, NotFound, OutboxError, ValidationError
from outbox.projection.app import Outbox
from outbox.retry import describe_error

__all__ = ["SCHEMA_VERSION", "create_app"]

SCHEMA_VERSION = 1
_STATIC = Path(__file__).with_name("static")
_STATUS: dict[type[OutboxError], int] = {NotFound: 404, Conflict: 409, ValidationError: 400}

Handler = Callable[[Request], Awaitable[Response]]


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
    poller = Poller(pool, park=settings.park, interval=refresh, bound=count_bound)
    csrf = Csrf()
    templates = Environment(
        loader=PackageLoader("outbox.console", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )

    async def render(
        name: str, request: Request, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """A template with the page's data, the actor and the live figures (the poller's)."""
        actor: str | None = getattr(request.state, "actor", None)
        if "overview" not in context:
            context.update(await _overview_context(poller))
        page = templates.get_template(name).render(
            request=request,
            actions=actions,
            discard=app is not None,
            actor=actor,
            csrf=csrf.token(actor) if actions and actor else "",
            refresh=poller.interval,
            **context,
        )
        return HTMLResponse(page, status_code=status)

    def page(
        template: str, mode: str, read: Callable[[Request], Awaitable[Any]], *, twin: bool
    ) -> Handler:
        """A page (or, `twin`, its JSON) from one read; an OutboxError renders as its message."""

        async def handle(request: Request) -> Response:
            try:
                data = await read(request)
            except Exception as exc:
                refused = _refusal(exc)
                if twin:
                    return _json(mode, error=str(refused), status=_status(refused))
                return await failure(request, refused)
            if twin:
                return _json(mode, data=data)
            return await render(template, request, data=data)

        return handle

    async def failure(request: Request, exc: OutboxError) -> Response:
        return await render("error.html", request, status=_status(exc), message=str(exc))

    async def overview_page(request: Request) -> Response:
        return await render("overview.html", request, **await _overview_context(poller))

    async def overview_fragment(request: Request) -> Response:
        return await render("_overview.html", request, **await _overview_context(poller))

    async def live_fragment(request: Request) -> Response:
        return await render("_live.html", request, **await _overview_context(poller))

    async def overview_json(request: Request) -> Response:
        overview = await poller.get()
        history = list(poller.trend.samples)
        return _json("overview", error=poller.error, overview=overview, history=history)

    async def read_failures(request: Request) -> Any:
        status = request.query_params.get("status") or None
        return await reads.read_failures(pool, status=status)

    async def read_blocked(request: Request) -> Any:
        order = request.query_params.get("order", "age")
        if order not in ("age", "waiting"):
            raise ValidationError("order", f"expected age or waiting, got {order!r}")
        return await reads.read_blocked(pool, park=settings.park, order=order)

    async def read_campaign(request: Request) -> Any:
        return await reads.read_campaign(pool, _text(request.query_params, "id"))

    async def read_preview(request: Request) -> Any:
        fingerprint = request.query_params.get("fingerprint") or None  # None: every dead row
        limit = _int(request.query_params.get("limit", str(controls.GROUP_LIMIT)), "limit")
        result = await controls.preview_group(pool, fingerprint, limit=limit)
        command = controls.group_command(fingerprint, limit, reason=None, dry_run=True)
        return {"fingerprint": fingerprint, "result": result, "command": command}

    async def read_projectors(request: Request) -> Any:
        return await reads.read_projectors(pool, app)

    async def read_fleet(request: Request) -> Any:
        return await reads.read_fleet(pool)

    async def read_system(request: Request) -> Any:
        return await reads.read_system(pool)

    def action(run: Callable[[Request, dict[str, str], str], Awaitable[controls.Done]]) -> Handler:
        """A control: the actor authenticated (middleware), its CSRF token checked, then `run`
        with the form; the result page names the equivalent command."""

        async def handle(request: Request) -> Response:
            actor: str = request.state.actor
            form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
            if not csrf.valid(actor, form.get("csrf", "")):
                message = "missing or bad CSRF token"
                return await render("error.html", request, status=403, message=message)
            try:
                done = await run(request, form, actor)
            except Exception as exc:
                return await failure(request, _refusal(exc))
            poller.invalidate()
            return await render("done.html", request, done=done)

        return handle

    async def requeue_row(request: Request, form: dict[str, str], actor: str) -> controls.Done:
        return await controls.requeue_row(
            pool, _text(form, "campaign_id"), _int(form.get("seq", ""), "seq"),
            actor=actor, reason=form.get("reason") or None,
        )  # fmt: skip

    async def discard_row(request: Request, form: dict[str, str], actor: str) -> controls.Done:
        if app is None:
            raise Conflict("discard needs the application (maintenance console --app)")
        return await controls.discard(
            pool, app, _text(form, "campaign_id"), _int(form.get("seq", ""), "seq"),
            actor=actor, reason=form.get("reason", ""),
        )  # fmt: skip

    async def requeue_group(request: Request, form: dict[str, str], actor: str) -> controls.Done:
        return await controls.requeue_group(
            pool, form.get("fingerprint") or None, limit=_int(form.get("limit", ""), "limit"),
            actor=actor, reason=form.get("reason") or None,
        )  # fmt: skip

    async def pause(request: Request, form: dict[str, str], actor: str) -> controls.Done:
        return await controls.pause(
            pool, app, _text(form, "projector"), actor=actor, reason=form.get("reason") or None
        )

    async def resume(request: Request, form: dict[str, str], actor: str) -> controls.Done:
        return await controls.resume(
            pool, app, _text(form, "projector"), actor=actor, reason=form.get("reason") or None
        )

    routes = [
        Route("/", overview_page, name="overview"),
        Route("/fragments/overview", overview_fragment, name="overview_fragment"),
        Route("/fragments/live", live_fragment, name="live_fragment"),
        Route("/api/overview", overview_json, name="overview_json"),
        *_twin("failures", "failures.html", page, read_failures),
        *_twin("failures/requeue", "preview.html", page, read_preview),
        *_twin("blocked", "blocked.html", page, read_blocked),
        *_twin("campaign", "campaign.html", page, read_campaign),
        *_twin("projectors", "projectors.html", page, read_projectors),
        *_twin("workers", "workers.html", page, read_fleet),
        *_twin("system", "system.html", page, read_system),
        Mount("/static", StaticFiles(directory=_STATIC), name="static"),
    ]
    if actions:
        routes += [
            Route("/actions/requeue", action(requeue_row), methods=["POST"], name="do_requeue"),
            Route("/actions/discard", action(discard_row), methods=["POST"], name="do_discard"),
            Route("/actions/pause", action(pause), methods=["POST"], name="do_pause"),
            Route("/actions/resume", action(resume), methods=["POST"], name="do_resume"),
            Route(
                "/actions/requeue-group",
                action(requeue_group),
                methods=["POST"],
                name="do_requeue_group",
            ),
        ]
    middleware = [Middleware(_Authenticate, auth=auth)] if auth is not None else []
    console = Starlette(routes=routes, middleware=middleware)
    console.state.poller = poller
    return console


def _twin(
    path: str,
    template: str,
    page: Callable[..., Handler],
    read: Callable[[Request], Awaitable[Any]],
) -> list[Route]:
    """`/path` (HTML) and `/api/path` (JSON, mode `console-path`) from one read."""
    name = path.replace("/", "_")
    return [
        Route(f"/{path}", page(template, name, read, twin=False), name=name),
        Route(f"/api/{path}", page(template, name, read, twin=True), name=f"{name}_json"),
    ]


def _json(mode: str, *, status: int = 200, **body: Any) -> Response:
    """A JSON twin: schema version, mode, then the body."""
    head = {"schema_version": SCHEMA_VERSION, "mode": f"console-{mode.replace('_', '-')}"}
    return Response(
        orjson.dumps({**head, **body}), status_code=status, media_type="application/json"
    )


def _refusal(exc: Exception) -> OutboxError:
    """What a page says when its read or action fails: the operation's own refusal, or the
    database's (a timeout, a missing privilege) as one line; anything else is a bug: raised."""
    if isinstance(exc, OutboxError):
        return exc
    if db.database_error(exc):
        return OutboxError(f"the database refused: {describe_error(exc)}")
    raise exc


def _status(exc: OutboxError) -> int:
    return next((s for t, s in _STATUS.items() if isinstance(exc, t)), 503)


def _text(values: Any, name: str) -> str:
    value = values.get(name, "")
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(name, "required")
    return value


def _int(value: str, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValidationError(name, f"expected an integer, got {value!r}") from None
    if number < 1:
        raise ValidationError(name, f"expected 1 or more, got {number}")
    return number


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


async def _overview_context(poller: Poller) -> dict[str, Any]:
    overview = await poller.get()
    samples = list(poller.trend.samples)
    charts = {
        "since": samples[0].at if samples else None,
        "applied": polyline([s.applied_per_second for s in samples], width=360, height=60),
        "lag": polyline([s.oldest_claimable_age_seconds for s in samples], width=360, height=60),
        "applied_max": max((s.applied_per_second or 0.0 for s in samples), default=0.0),
        "lag_max": max((s.oldest_claimable_age_seconds or 0.0 for s in samples), default=0.0),
    }
    return {"overview": overview, "error": poller.error, "charts": charts}
