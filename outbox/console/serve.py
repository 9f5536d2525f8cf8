"""`outbox.console.serve()`: the console served on an address of its own until cancelled.

What `maintenance console` runs, and what an operator's own script can run: refuse to serve
a non-loopback address without authentication (unless told `insecure_no_auth`), bind the
address first (a taken port is one line before anything else happens), open a small pool of
its own, check the schema, then serve `create_app` with uvicorn (no lifespan, no access log of
uvicorn's: the console's own, one JSON object per request, goes to stdout), under `base_path`
when given. On loopback only loopback Host names are served (a page of another site that
rebinds its name to 127.0.0.1 gets 400). A request's client is the peer that connected:
`X-Forwarded-For` is believed only from the proxies `forwarded_allow_ips` names (the login
throttle and the access log key on the client, so a header anyone can send must not choose
it). The pool closes and the socket is released when serving ends.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from outbox import db
from outbox.config import Settings
from outbox.console.app import create_app
from outbox.console.security import Auth, configured_auth
from outbox.console.state import Redact
from outbox.errors import UsageError
from outbox.projection.app import Outbox
from outbox.schema import check_current

__all__ = ["is_loopback", "serve", "trusted_proxies"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine alone."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def trusted_proxies(value: str) -> str:
    """`--forwarded-allow-ips` checked: addresses or networks, comma-separated, or `*` (any
    peer: only behind a proxy that every request passes). UsageError naming a bad item."""
    items = [item.strip() for item in value.split(",")]
    for item in items:
        if item == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise UsageError(
                f"--forwarded-allow-ips: {item!r} is not an address or a network "
                "(expected e.g. 10.0.0.5,10.1.0.0/16 or *)"
            ) from None
    return ",".join(items)


def _stdout_line(entry: Mapping[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE))
    sys.stdout.flush()


async def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    base_path: str = "",
    refresh: float = 5.0,
    actions: bool = False,
    auth: Auth | None = None,
    app: Outbox | None = None,
    announce: Callable[[str], None] | None = None,
    redact: Redact | None = None,
    insecure_no_auth: bool = False,
    forwarded_allow_ips: str | None = None,
) -> None:
    """Serve the console for `settings.dsn` on `host`:`port` (0: any free one) under
    `base_path` ('' or '/a/b') until cancelled; `announce` receives the one line saying where
    (and in which mode) it serves. `auth` defaults to basic auth from the environment when
    set. `forwarded_allow_ips`: the proxies whose `X-Forwarded-For` names the client (none
    by default). UsageError when the address cannot be bound, or is not loopback and nothing
    authenticates (unless `insecure_no_auth`)."""
    proxies = None if forwarded_allow_ips is None else trusted_proxies(forwarded_allow_ips)
    if not settings.dsn:
        raise UsageError("no database given: pass --dsn or set OUTBOX_DSN")
    if auth is None:
        auth = configured_auth()
    if auth is None and not is_loopback(host) and not insecure_no_auth:
        raise UsageError(
            f"--host {host}: not a loopback address, and no authentication is configured: "
            "set OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD (or pass --insecure-no-auth)"
        )
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise UsageError(f"--host/--port: cannot listen on {host}:{port}: {exc}") from None
    listener.listen(128)
    pool: db.Pool | None = None
    try:
        pool = await db.create_pool(settings.dsn, min_size=1, max_size=2)
        await check_current(pool)
        console = create_app(
            pool,
            actions=actions,
            auth=auth,
            app=app,
            settings=settings,
            refresh=refresh,
            redact=redact,
            allowed_hosts=[*LOOPBACK_HOSTS, host] if is_loopback(host) else None,
            access_log=_stdout_line,
        )
        served = Starlette(routes=[Mount(base_path, app=console)]) if base_path else console
        config = uvicorn.Config(
            served,
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=proxies is not None,
            forwarded_allow_ips=proxies,
        )
        if announce is not None:
            bound = listener.getsockname()[1]
            mode = "actions enabled" if actions else "read-only"
            mode += ", authenticated" if auth is not None else ", no authentication"
            announce(f"console: http://{host}:{bound}{base_path}/ ({mode}; Ctrl-C stops it)")
        await uvicorn.Server(config).serve(sockets=[listener])
    finally:
        if pool is not None:
            await pool.close()
        listener.close()
