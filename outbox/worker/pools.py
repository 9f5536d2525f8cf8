"""The worker's pools: sessions that carry the worker's settings (timeouts, application name,
the outbox's schema), sized for its claim loops, or for the catch-up engine it runs.

It owns how a worker opens a pool from `Settings`; `runtime` opens the service's, `catch_ups`
the engine's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox import db
from outbox.worker.loops import ceiling_of

if TYPE_CHECKING:
    from outbox.config import Settings
    from outbox.db import Pool

__all__ = ["open_pool"]


async def open_pool(
    settings: Settings, *, max_size: int | None = None, application_name: str = "outbox-worker"
) -> Pool:
    """A pool of worker sessions for `settings.dsn`, one connection per claim loop the worker
    may run (`loops.ceiling_of`) and one to spare unless `max_size` says otherwise (timeouts
    per `Settings.session_timeouts`)."""
    sent, fallback = settings.session_settings(application_name)
    return await db.create_pool(
        settings.dsn,
        min_size=1,
        max_size=max_size if max_size is not None else ceiling_of(settings, own_pool=True) + 1,
        server_settings=sent,
        session_defaults=fallback,
    )
