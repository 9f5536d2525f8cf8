"""`maintenance console`: serve the web console (outbox.console) until interrupted."""

from __future__ import annotations

from typing import Annotated

import typer

from outbox.cli.common import (
    AppOption,
    DsnOption,
    prepare_app,
    require_dsn,
    run,
    settings_for,
    stderr,
)
from outbox.cli.operator import app
from outbox.errors import UsageError


def _base_path(value: str) -> str:
    """'' or '/a/b' (no trailing slash)."""
    base = value.strip().rstrip("/")
    if base and (not base.startswith("/") or any(c in base for c in "?#% ")):
        raise UsageError(f"--base-path: expected a path like /outbox, got {value!r}")
    return base


@app.command("console")
def console_command(
    dsn: DsnOption = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port (0: any free one).")
    ] = 8765,
    base_path: Annotated[
        str, typer.Option("--base-path", help="Serve under this path, e.g. /outbox.")
    ] = "",
    refresh: Annotated[
        float,
        typer.Option("--refresh", min=0.5, max=3600, help="Seconds between reads of the figures."),
    ] = 5.0,
    allow_actions: Annotated[
        bool,
        typer.Option(
            "--allow-actions",
            help="Serve the controls (requeue, discard), behind basic auth from "
            "OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD.",
        ),
    ] = False,
    app_path: AppOption = None,
    redact_payloads: Annotated[
        bool, typer.Option("--redact-payloads", help="Show no event payload on any page.")
    ] = False,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve a non-loopback address without authentication (read-only only).",
        ),
    ] = False,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            "--forwarded-allow-ips",
            help="Proxies (addresses or networks, comma-separated) whose X-Forwarded-For names "
            "the client; without it the client is the peer that connected.",
        ),
    ] = None,
) -> None:
    """Serve the web console until interrupted: the queue, live; read-only unless
    --allow-actions (with --app, discards too). Every page needs basic auth when
    OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD are set, and a non-loopback --host needs
    them."""
    base = _base_path(base_path)
    outbox_app = prepare_app(app_path, dsn=dsn) if app_path else None
    settings = outbox_app.settings if outbox_app else settings_for(dsn=dsn)
    target = require_dsn(settings)
    try:
        from outbox.console import serve
        from outbox.console.security import basic_auth_from_env, configured_auth
        from outbox.console.serve import trusted_proxies
        from outbox.console.state import hide_payload
    except ImportError as exc:
        raise UsageError(
            f"the console needs the console extra ({exc.name} is missing): "
            "pip install 'pg-outbox[console]'"
        ) from None

    auth = basic_auth_from_env() if allow_actions else configured_auth()  # refused early
    proxies = None if forwarded_allow_ips is None else trusted_proxies(forwarded_allow_ips)

    async def body() -> None:
        await serve(
            settings.replace(dsn=target),
            host=host,
            port=port,
            base_path=base,
            refresh=refresh,
            actions=allow_actions,
            auth=auth,
            app=outbox_app,
            announce=stderr.print,
            redact=hide_payload if redact_payloads else None,
            insecure_no_auth=insecure_no_auth,
            forwarded_allow_ips=proxies,
        )

    run(body)
