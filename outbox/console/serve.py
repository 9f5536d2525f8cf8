"""`outbox.console.serve()`: the console served on an address of its own until cancelled.

What `maintenance console` runs, and what an operator's own script can run: bind the address
first (a taken port is one line before anything else happens), open a small pool of its own,
check the schema, then serve `create_app` with uvicorn (no lifespan, no access log of its own:
the process's logging is the caller's), under `base_path` when given. The pool closes and the
socket is released when serving ends.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from outbox import db
from outbox.config import Settings
from outbox.console.app import create_app
from outbox.console.security import Auth
from outbox.errors import UsageError
from outbox.projection.app import Outbox
from outbox.schema import check_current

__all__ = ["serve"]


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
) -> None:
    """Serve the console for `settings.dsn` on `host`:`port` (0: any free one) under
    `base_path` ('' or '/a/b') until cancelled; `announce` receives the one line saying where
    (and in which mode) it serves. UsageError when the address cannot be bound."""
    if not settings.dsn:
        raise UsageError("no database given: pass --dsn or set OUTBOX_DSN")
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
            pool, actions=actions, auth=auth, app=app, settings=settings, refresh=refresh
        )
        served = Starlette(routes=[Mount(base_path, app=console)]) if base_path else console
        config = uvicorn.Config(served, lifespan="off", log_config=None, access_log=False)
        if announce is not None:
            bound = listener.getsockname()[1]
            mode = "actions enabled, basic auth" if actions else "read-only"
            announce(f"console: http://{host}:{bound}{base_path}/ ({mode}; Ctrl-C stops it)")
        await uvicorn.Server(config).serve(sockets=[listener])
    finally:
        if pool is not None:
            await pool.close()
        listener.close()
