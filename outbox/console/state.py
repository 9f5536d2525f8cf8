"""What every console endpoint shares: the console's state, rendering, and answering errors.

`Console` is one console's state (its pool, the application, settings, the shared poller, CSRF
tokens, templates, whether it serves actions), kept on the Starlette app (`app.state.console`)
and read by the module-level endpoints through `of(request)`. `render` fills a template with
the page's data, the actor and the live figures; `json_response` is a JSON twin's body;
`refusal` turns a failed read or action into the one line a page shows, and `status` into its
HTTP status. HTML is rendered by Jinja2 with autoescaping, so ids, errors and payloads from the
data are inert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from outbox import db
from outbox.config import Settings
from outbox.console.history import polyline
from outbox.console.overview import Poller
from outbox.console.security import Csrf
from outbox.errors import Conflict, NotFound, OutboxError, ValidationError
from outbox.projection.app import Outbox
from outbox.retry import describe_error

__all__ = [
    "SCHEMA_VERSION",
    "Console",
    "json_response",
    "of",
    "overview_context",
    "positive_int",
    "refusal",
    "render",
    "required",
    "status",
]

SCHEMA_VERSION = 1
_STATUS: dict[type[OutboxError], int] = {NotFound: 404, Conflict: 409, ValidationError: 400}


@dataclass(frozen=True, slots=True)
class Console:
    """One console: where it reads, what it may do, and what its pages share."""

    pool: db.Pool
    settings: Settings
    app: Outbox | None  # the application: its projectors, and discards (None: no discard)
    actions: bool
    poller: Poller
    csrf: Csrf
    templates: Environment

    @classmethod
    def build(
        cls,
        pool: db.Pool,
        settings: Settings,
        app: Outbox | None,
        *,
        actions: bool,
        refresh: float,
        count_bound: int,
    ) -> Console:
        templates = Environment(
            loader=PackageLoader("outbox.console", "templates"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        poller = Poller(pool, park=settings.park, interval=refresh, bound=count_bound)
        return cls(pool, settings, app, actions, poller, Csrf(), templates)


def of(request: Request) -> Console:
    """The console that serves `request`."""
    console: Console = request.app.state.console
    return console


async def overview_context(poller: Poller) -> dict[str, Any]:
    """The live figures and their last hour, as the overview's templates show them."""
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


async def render(name: str, request: Request, status: int = 200, **context: Any) -> HTMLResponse:
    """A template with the page's data, the actor and the live figures (the poller's)."""
    console = of(request)
    actor: str | None = getattr(request.state, "actor", None)
    if "overview" not in context:
        context.update(await overview_context(console.poller))
    page = console.templates.get_template(name).render(
        request=request,
        actions=console.actions,
        discard=console.app is not None,
        actor=actor,
        csrf=console.csrf.token(actor) if console.actions and actor else "",
        refresh=console.poller.interval,
        **context,
    )
    return HTMLResponse(page, status_code=status)


def json_response(mode: str, *, status: int = 200, **body: Any) -> Response:
    """A JSON twin: schema version, mode, then the body."""
    head = {"schema_version": SCHEMA_VERSION, "mode": f"console-{mode.replace('_', '-')}"}
    return Response(
        orjson.dumps({**head, **body}), status_code=status, media_type="application/json"
    )


def refusal(exc: Exception) -> OutboxError:
    """What a page says when its read or action fails: the operation's own refusal, or the
    database's (a timeout, a missing privilege) as one line; anything else is a bug: raised."""
    if isinstance(exc, OutboxError):
        return exc
    if db.database_error(exc):
        return OutboxError(f"the database refused: {describe_error(exc)}")
    raise exc


def status(exc: OutboxError) -> int:
    """The HTTP status of a refusal: 404, 409, 400, else 503."""
    return next((s for t, s in _STATUS.items() if isinstance(exc, t)), 503)


def required(values: Any, name: str) -> str:
    """A non-blank text field of a query or a form."""
    value = values.get(name, "")
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(name, "required")
    return value


def positive_int(value: str, name: str) -> int:
    """An integer of 1 or more, from a query's or a form's text."""
    try:
        number = int(value)
    except ValueError:
        raise ValidationError(name, f"expected an integer, got {value!r}") from None
    if number < 1:
        raise ValidationError(name, f"expected 1 or more, got {number}")
    return number
