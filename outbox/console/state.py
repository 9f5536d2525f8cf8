"""What every console endpoint shares: the console's state, rendering, and answering errors.

`Console` is one console's state (its pool, the application, settings, the shared poller, CSRF
tokens, templates, whether it serves actions), kept on the Starlette app (`app.state.console`)
and read by the module-level endpoints through `of(request)`. `render` fills a template with
the page's data, the actor and the live figures; `json_response` is a JSON twin's body;
`refusal` turns a failed read or action into the one line a page shows (an unreachable
database included), and `status` into its HTTP status. HTML is rendered by Jinja2 with
autoescaping, so ids, errors and payloads from the data are inert, and with every
bidirectional control character shown as its escape (`\\u202e`), so none reorders the text
around it. Links are paths (`url_for`), never built from the request's Host.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from outbox import db
from outbox.append.validate import check_identifier
from outbox.config import Settings
from outbox.console.history import polyline
from outbox.console.overview import Alarms, Poller, describe_failure
from outbox.console.reads import COUNT_BOUND, LIST_LIMIT, aware_time
from outbox.console.security import Csrf
from outbox.errors import Conflict, NotFound, OutboxError, ValidationError
from outbox.projection.app import Outbox

__all__ = [
    "MAX_TEXT",
    "SCHEMA_VERSION",
    "Console",
    "Redact",
    "hide_payload",
    "json_response",
    "moment",
    "of",
    "overview_context",
    "positive_int",
    "refusal",
    "render",
    "required",
    "status",
    "text",
]

SCHEMA_VERSION = 1
_STATUS: dict[type[OutboxError], int] = {NotFound: 404, Conflict: 409, ValidationError: 400}
# Characters of a form's or a query's text field at most (a reason, an id).
MAX_TEXT = 2000
_INT64 = 2**63 - 1
# Bidirectional controls (embeddings, overrides, isolates, marks): shown as escapes.
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")

# What a page shows of a payload (decoded JSON, or the stored text when it is not JSON).
Redact = Callable[[Any], Any]


def hide_payload(payload: Any) -> Any:
    """A `Redact` that hides every payload (`maintenance console --redact-payloads`)."""
    return "(hidden)"


def when(at: datetime | None, now: datetime | None = None) -> str:
    """A time as UTC with how long ago (or ahead) it is: `2026-11-26 10:00:00 UTC (3 min ago)`."""
    if at is None:
        return ""
    delta = ((now or datetime.now(UTC)) - at).total_seconds()
    span = abs(delta)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if span >= size:
            amount = f"{span // size:.0f} {unit}"
            break
    else:
        amount = f"{span:.0f} s"
    relative = f"{amount} ago" if delta >= 0 else f"in {amount}"
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({relative})"


def json_text(value: Any) -> str:
    """A payload as the pages show it: stored text as it is, decoded JSON as compact JSON (the
    same escaping in every table: autoescape's)."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _shown(value: Any) -> Any:
    """Jinja's finalize: text (and markup made from data, `tojson`'s) with its bidirectional
    controls escaped."""
    if isinstance(value, str):
        for control in set(_BIDI.findall(value)):  # Markup's replace keeps it Markup
            value = value.replace(control, f"\\u{ord(control):04x}")
    return value


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
    redact: Redact | None = None  # what pages show of payloads (None: all of them)
    # The last action's result per browser session, for the page a POST redirects to.
    results: dict[str, Any] = field(default_factory=dict)

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
        redact: Redact | None = None,
        alarms: Alarms | None = None,
    ) -> Console:
        templates = Environment(
            loader=PackageLoader("outbox.console", "templates"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=_shown,
        )
        templates.filters["when"] = when
        templates.filters["json_text"] = json_text
        templates.globals["list_limit"] = LIST_LIMIT
        templates.globals["count_bound"] = COUNT_BOUND
        poller = Poller(
            pool, park=settings.park, interval=refresh, bound=count_bound, alarms=alarms or Alarms()
        )
        return cls(pool, settings, app, actions, poller, Csrf(), templates, redact)


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
    alarms = poller.alarms.raised(overview) if overview is not None else []
    return {"overview": overview, "error": poller.error, "charts": charts, "alarms": alarms}


async def render(name: str, request: Request, status: int = 200, **context: Any) -> HTMLResponse:
    """A template with the page's data, the actor and the live figures (the poller's)."""
    console = of(request)
    actor: str | None = getattr(request.state, "actor", None)
    session: str = getattr(request.state, "session", "")
    if "overview" not in context:
        context.update(await overview_context(console.poller))

    def url_for(name: str, /, **params: Any) -> URL:
        return URL(request.url_for(name, **params).path)

    page = console.templates.get_template(name).render(
        request=request,
        url_for=url_for,
        actions=console.actions,
        discard=console.app is not None,
        actor=actor,
        csrf=console.csrf.token(actor, session) if console.actions and actor else "",
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
    if db.database_error(exc) or isinstance(exc, OSError | TimeoutError):
        return OutboxError(describe_failure(exc))
    raise exc


def status(exc: OutboxError) -> int:
    """The HTTP status of a refusal: 404, 409, 400, else 503."""
    return next((s for t, s in _STATUS.items() if isinstance(exc, t)), 503)


def text(values: Any, name: str) -> str | None:
    """An optional text field of a query or a form: None when absent or blank; at most
    `MAX_TEXT` characters and no NUL (ValidationError)."""
    value = values.get(name, "")
    if not isinstance(value, str) or not value.strip():
        return None
    return check_identifier(name, value, MAX_TEXT)


def required(values: Any, name: str) -> str:
    """A non-blank text field of a query or a form (`text`'s bounds)."""
    value = text(values, name)
    if value is None or not value.strip():
        raise ValidationError(name, "required")
    return value


def moment(values: Any, name: str) -> datetime:
    """A time with its zone, in ISO 8601, from a query's or a form's text."""
    value = required(values, name)
    at = aware_time(value)
    if at is None:
        raise ValidationError(name, f"expected an ISO 8601 time with its zone, got {value[:40]!r}")
    return at


def positive_int(value: str, name: str) -> int:
    """An integer of 1 or more (a bigint's range), from a query's or a form's text."""
    try:
        number = int(value) if len(value) <= 20 else None
    except ValueError:
        number = None
    if number is None:
        raise ValidationError(name, f"expected an integer, got {value[:40]!r}")
    if not 1 <= number <= _INT64:
        raise ValidationError(name, f"expected 1 to {_INT64}, got {number}")
    return number
