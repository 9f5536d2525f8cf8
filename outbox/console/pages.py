"""The console's endpoints, at module level: the pages with their JSON twins, and the controls.

A page reads once when it is opened (`reads`, in a read-only transaction under the console's
session); the overview and its fragments show the shared poller's figures. `PAGES` lists every
page as (path, template, read): each is served as `/path` (HTML) and `/api/path` (JSON) by
`app.create_app`. A control (`CONTROLS`) checks the actor's CSRF token, runs its operation
(`actions`) and names the command that does the same. Every endpoint finds its console through
`state.of(request)`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from outbox.console import actions as controls
from outbox.console import reads
from outbox.console.overview import Poller
from outbox.console.state import (
    json_response,
    moment,
    of,
    overview_context,
    positive_int,
    refusal,
    render,
    required,
    status,
    text,
)
from outbox.errors import Conflict, NotFound, OutboxError, ValidationError
from outbox.queue.attention import START, parse_cursor

__all__ = ["CONTROLS", "PAGES", "control", "live_fragment", "overview_fragment", "overview_json"]

Read = Callable[[Request], Awaitable[Any]]
Handler = Callable[[Request], Awaitable[Response]]
Run = Callable[[Request, dict[str, str], str], Awaitable[controls.Done]]

RESULTS_KEPT = 1_000  # browser sessions whose last action's result is kept


def _outage(context: dict[str, Any]) -> int:
    """503 while the figures were never read because the database does not answer."""
    return 503 if context["overview"] is None and context["error"] else 200


async def overview_page(request: Request) -> Response:
    context = await overview_context(of(request).poller)
    return await render("overview.html", request, _outage(context), **context)


async def overview_fragment(request: Request) -> Response:
    context = await overview_context(of(request).poller)
    return await render("_overview.html", request, _outage(context), **context)


async def live_fragment(request: Request) -> Response:
    context = await overview_context(of(request).poller)
    return await render("_live.html", request, _outage(context), **context)


async def overview_json(request: Request) -> Response:
    poller = of(request).poller
    overview = await poller.get()
    history = list(poller.trend.samples)
    outage = _outage({"overview": overview, "error": poller.error})
    # Like every twin, its figures under `data`; `error` says why the last read failed (the
    # figures then the last ones read, or none: 503).
    data = {"overview": overview, "history": history}
    return json_response("overview", status=outage, data=data, error=poller.error)


async def read_failures(request: Request) -> Any:
    chosen = text(request.query_params, "status")
    return await reads.read_failures(of(request).pool, status=chosen)


async def read_blocked(request: Request) -> Any:
    console = of(request)
    order = request.query_params.get("order", "age")
    if order not in ("age", "waiting"):
        raise ValidationError("order", f"expected age or waiting, got {order!r}")
    after = text(request.query_params, "after")
    return await reads.read_blocked(
        console.pool,
        park=console.settings.park,
        order=order,
        after=reads.time_cursor(after) if after else None,
        ordered=console.settings.ordered,
    )


async def read_campaign(request: Request) -> Any:
    console = of(request)
    after = request.query_params.get("after")
    audit_before = text(request.query_params, "audit_before")
    found = await reads.read_campaign(
        console.pool,
        required(request.query_params, "id"),
        after=positive_int(after, "after") if after else 0,
        audit_before=reads.audit_cursor(audit_before) if audit_before else None,
    )
    return found if console.redact is None else reads.redacted(found, console.redact)


# The rows page's filters: query parameter -> `reads.read_rows` keyword.
ROW_FILTERS = {
    "status": "status",
    "event_type": "event_type",
    "projector": "projector",
    "error": "fingerprint",
    "prefix": "prefix",
}


async def read_rows(request: Request) -> Any:
    query = request.query_params
    filters = {name: text(query, name) for name in ROW_FILTERS}
    after = text(query, "after")
    page = await reads.read_rows(
        of(request).pool,
        **{ROW_FILTERS[name]: value for name, value in filters.items()},
        after=parse_cursor(after) if after else START,
    )
    given = {name: value for name, value in filters.items() if value is not None}
    return {"filters": filters, "given": given, "page": page}


async def read_row(request: Request) -> Any:
    console = of(request)
    campaign_id = required(request.query_params, "campaign_id")
    seq = positive_int(request.query_params.get("seq", ""), "seq")
    view = await reads.read_row(console.pool, campaign_id, seq)
    if console.redact is not None:
        view = reads.redacted_row(view, console.redact)
    return {"view": view, "commands": controls.row_commands(campaign_id, seq, view.event.status)}


async def read_preview(request: Request) -> Any:
    fingerprint = text(request.query_params, "fingerprint")  # None: every dead row
    limit = positive_int(request.query_params.get("limit", str(controls.GROUP_LIMIT)), "limit")
    async with reads.reading(of(request).pool) as conn:  # the session's timeout, read-only
        preview = await controls.preview_group(conn, fingerprint, limit=limit)
    command = controls.group_command(fingerprint, limit, reason=None, dry_run=True)
    return {
        "fingerprint": fingerprint,
        "as_of": preview.as_of,
        "result": preview.result,
        "shown": preview.result.rows[: reads.LIST_LIMIT],
        "command": command,
    }


async def read_projectors(request: Request) -> Any:
    console = of(request)
    return await reads.read_projectors(console.pool, console.app)


async def read_fleet(request: Request) -> Any:
    return await reads.read_fleet(of(request).pool)


async def read_system(request: Request) -> Any:
    return await reads.read_system(of(request).pool)


# (path, template, read): each page and its JSON twin (mode `console-<path>`).
PAGES: tuple[tuple[str, str, Read], ...] = (
    ("failures", "failures.html", read_failures),
    ("failures/requeue", "preview.html", read_preview),
    ("rows", "rows.html", read_rows),
    ("row", "row.html", read_row),
    ("blocked", "blocked.html", read_blocked),
    ("campaign", "campaign.html", read_campaign),
    ("projectors", "projectors.html", read_projectors),
    ("workers", "workers.html", read_fleet),
    ("system", "system.html", read_system),
)


def page(template: str, mode: str, read: Read, *, twin: bool) -> Handler:
    """A page (or, `twin`, its JSON) from one read; an OutboxError renders as its message."""

    async def handle(request: Request) -> Response:
        try:
            data = await read(request)
        except Exception as exc:
            refused = refusal(exc)
            if twin:
                return json_response(mode, error=str(refused), status=status(refused))
            return await failure(request, refused)
        if twin:
            return json_response(mode, data=data)
        return await render(template, request, data=data)

    return handle


async def failure(request: Request, exc: OutboxError) -> Response:
    return await render("error.html", request, status=status(exc), message=str(exc))


def control(run: Run) -> Handler:
    """A control: the actor authenticated (middleware), its CSRF token checked, then `run`
    with the form; the result page names the equivalent command."""

    async def handle(request: Request) -> Response:
        console = of(request)
        actor: str = request.state.actor
        form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        if not console.csrf.valid(actor, request.state.session, form.get("csrf", "")):
            message = "missing or bad CSRF token"
            return await render("error.html", request, status=403, message=message)
        try:
            done = await run(request, form, actor)
        except Exception as exc:
            return await failure(request, refusal(exc))
        console.poller.invalidate()
        # Post/redirect/get: a reload shows the result again and does not act again.
        console.results.pop(request.state.session, None)
        console.results[request.state.session] = done
        while len(console.results) > RESULTS_KEPT:
            console.results.pop(next(iter(console.results)))
        redirect = RedirectResponse(request.url_for("done").path, status_code=303)
        if done.job is not None:
            redirect.background = BackgroundTask(_then_invalidate, done.job, console.poller)
        return redirect

    return handle


async def _then_invalidate(job: Callable[[], Awaitable[None]], poller: Poller) -> None:
    await job()
    poller.invalidate()


async def done_page(request: Request) -> Response:
    """The result of this browser session's last action (where a control redirects)."""
    done = of(request).results.get(request.state.session)
    if done is None:
        return await failure(request, NotFound("no action was taken in this browser session"))
    return await render("done.html", request, done=done)


async def requeue_row(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    return await controls.requeue_row(
        of(request).pool,
        required(form, "campaign_id"),
        positive_int(form.get("seq", ""), "seq"),
        actor=actor,
        reason=text(form, "reason"),
    )


async def retry_row(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    return await controls.retry_row(
        of(request).pool,
        required(form, "campaign_id"),
        positive_int(form.get("seq", ""), "seq"),
        actor=actor,
        reason=text(form, "reason"),
    )


async def discard_row(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    console = of(request)
    if console.app is None:
        raise Conflict("discard needs the application (maintenance console --app)")
    return await controls.discard(
        console.pool,
        console.app,
        required(form, "campaign_id"),
        positive_int(form.get("seq", ""), "seq"),
        actor=actor,
        reason=text(form, "reason") or "",
    )


async def requeue_group(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    return controls.requeue_group(
        of(request).pool,
        text(form, "fingerprint"),
        died_by=moment(form, "died_by"),
        limit=positive_int(form.get("limit", ""), "limit"),
        actor=actor,
        reason=text(form, "reason"),
    )


async def pause(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    console = of(request)
    reason = text(form, "reason")
    return await controls.pause(
        console.pool, console.app, required(form, "projector"), actor=actor, reason=reason
    )


async def resume(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    console = of(request)
    reason = text(form, "reason")
    return await controls.resume(
        console.pool, console.app, required(form, "projector"), actor=actor, reason=reason
    )


async def promote(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    return await controls.promote(
        of(request).pool,
        required(form, "projector"),
        positive_int(form.get("version", ""), "version"),
        actor=actor,
        reason=text(form, "reason"),
        force=form.get("force") == "on",
    )


async def retire(request: Request, form: dict[str, str], actor: str) -> controls.Done:
    console = of(request)
    return await controls.retire(
        console.pool,
        console.app,
        required(form, "projector"),
        positive_int(form.get("version", ""), "version"),
        actor=actor,
        reason=required(form, "reason"),
    )


# (path under /actions, route name, run): the controls, served only with actions.
CONTROLS: tuple[tuple[str, str, Run], ...] = (
    ("requeue", "do_requeue", requeue_row),
    ("retry", "do_retry", retry_row),
    ("discard", "do_discard", discard_row),
    ("pause", "do_pause", pause),
    ("resume", "do_resume", resume),
    ("requeue-group", "do_requeue_group", requeue_group),
    ("promote", "do_promote", promote),
    ("retire", "do_retire", retire),
)
