"""The worker's gauges, refreshed from the report's reads every `REFRESH_INTERVAL`: rows by
status, the oldest claimable head, blocked campaigns, each projector's holds, catch-up and
latest build, the oldest snapshot held, and how far each ordered projector stands behind."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from outbox import db
from outbox.obs.metrics import Metrics
from outbox.projection.builds import list_builds
from outbox.projection.guards import projector_lag
from outbox.projection.sweep import catch_up_holds
from outbox.queue import inspect
from outbox.queue.holds import count_holds
from outbox.queue.horizon import horizon_holder

__all__ = ["refresh_gauges"]


async def refresh_gauges(
    metrics: Metrics,
    executor: db.Executor,
    *,
    park: bool,
    ordered: Mapping[str, Iterable[str]] | None = None,
) -> None:
    """Set the queue gauges from the report's reads (rows by status, oldest head, blocked, each
    projector's holds and catch-up campaigns, its latest build, the oldest snapshot held), and
    how far each projector in `ordered` (name -> its types) stands behind the journal."""
    async with db.acquire(executor) as conn:
        counts = await inspect.count_rows(conn)
        oldest = await inspect.oldest_claimable(conn, park=park)
        _, blocked = await inspect.blocked_campaigns(conn, park=park, limit=1)
        shadow = await inspect.shadow_observations(conn)
        holds = await count_holds(conn)
        catching_up = await catch_up_holds(conn)
        holder = await horizon_holder(conn)
        builds = {
            b.projector: (b.events, b.events_total, b.state == "running")
            for b in await list_builds(conn)
        }
        behind = {}
        for name, events in sorted((ordered or {}).items()):
            lag = await projector_lag(conn, name, events)
            behind[name] = (lag.events_behind, lag.oldest_unapplied_seconds)
    metrics.set_holds(holds)
    metrics.set_snapshot(
        holder.held_seconds if holder else None, holder.xmin_age if holder else None
    )
    metrics.set_progress(behind, catching_up)
    metrics.set_builds(builds)
    metrics.set_queue(
        dataclasses.asdict(counts),
        oldest_age=oldest.age_seconds if oldest else None,
        blocked=blocked,
        shadow_max_lag=shadow.max_lag_seconds,
    )
