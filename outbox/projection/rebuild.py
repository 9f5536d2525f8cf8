"""Projection rebuild, the final repair path: reset a projector's projection of one campaign
and re-apply its journal in seq order.

One transaction per campaign holds the campaign's queued rows (so no worker interleaves) and
resets the projector's checkpoint or markers, then replays the journal up to the head it read,
in chunks (a batch projector gets each chunk in one call). It never touches other projectors.
`rebuild()` runs it over projectors and campaigns for `maintenance projections-rebuild`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import db
from outbox.append.journal import list_campaigns, rebuild_events
from outbox.errors import ConfigError, UsageError
from outbox.model import StoredEvent
from outbox.projection.builds import buildable
from outbox.projection.guards import delete_markers, reserve_markers
from outbox.projection.known import check_recorded
from outbox.projection.registry import Projector, Registry, track_name
from outbox.queue.claim import lock_campaign_rows
from outbox.queue.settle import settle

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "RebuildResult",
    "rebuild",
    "rebuild_campaign",
    "rebuildable",
    "registered",
    "versioned",
]

CHUNK = 500


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """What a rebuild covered: the projectors, how many campaigns, whether it ran (without
    `apply` it only says what it would do), and the events re-applied per projector."""

    projectors: list[str]
    campaigns: int
    rebuilt: bool
    applied: dict[str, int]


def versioned(registry: Registry, name: str, version: int) -> Projector:
    """Version `version` of projector `name` as the app registers it (S29), or a ConfigError
    naming the versions it has."""
    found = registry.projectors.get(track_name(name, version))
    if found is None:
        has = ", ".join(str(p.version) for p in registry.versions(name)) or "none"
        raise ConfigError(
            f"the app registers no version {version} of projector {name!r} (versions: {has}): "
            f"register it with @app.projector({name!r}, version={version}, ...) first"
        )
    return found


def registered(registry: Registry, name: str) -> Projector:
    """The app's projector `name` (a track's key), or a ConfigError naming those it has."""
    projector = registry.projectors.get(name)
    if projector is None:
        known = ", ".join(sorted(registry.projectors)) or "none"
        raise ConfigError(f"no projector named {name!r} (registered: {known})")
    return projector


def rebuildable(registry: Registry, name: str) -> Projector:
    """The projector to rebuild, or a ConfigError saying why it cannot be."""
    projector = registered(registry, name)
    if not projector.transactional:  # lease mode: its history given again, if it asks
        buildable(projector)
        return projector
    if projector.reset is None:
        raise ConfigError(
            f"projector {name!r} has no reset hook: register it with reset= to rebuild it"
        )
    if not projector.ordered and not projector.idempotent:
        raise ConfigError(
            f"projector {name!r} has no guard (neither ordered nor idempotent): a rebuild "
            "beside running workers could apply an event twice"
        )
    return projector


async def rebuild(
    executor: Executor,
    registry: Registry,
    *,
    projectors: Sequence[str] = (),
    campaign_id: str | None = None,
    apply: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> RebuildResult:
    """Rebuild `projectors` (default: every one with a reset hook) over one campaign or all;
    with `apply` False nothing changes. `progress(done, total)` after each (projector,
    campaign). A projector that cannot be rebuilt is a ConfigError saying why."""
    names = list(projectors) or sorted(n for n, p in registry.projectors.items() if p.reset)
    # (a lease-mode projector with replay=True is replayed only when named)
    if not names:
        raise UsageError("no projector has a reset hook: nothing can be rebuilt")
    chosen = [rebuildable(registry, n) for n in names]
    await check_recorded(executor, chosen)  # what it owes is what the record says (S33)
    campaigns = await list_campaigns(executor, campaign_id)
    applied = dict.fromkeys(names, 0)
    if apply:
        total, done = len(chosen) * len(campaigns), 0
        for p in chosen:
            for c in campaigns:
                applied[p.name] += await rebuild_campaign(executor, p, c)
                done += 1
                if progress is not None:
                    progress(done, total)
    return RebuildResult(names, len(campaigns), apply, applied)


async def _replay(conn: Connection, projector: Projector, events: list[StoredEvent]) -> None:
    if projector.idempotent and not projector.ordered:
        await reserve_markers(conn, [(e.campaign_id, e.seq, projector.name) for e in events])
    await projector.run(conn, events, replaying=True)


async def rebuild_campaign(executor: Executor, projector: Projector, campaign_id: str) -> int:
    """Reset one campaign's projection and re-apply its journal in seq order, in one
    transaction that holds the campaign's queued rows and the projector's checkpoint, so a
    running worker neither interleaves nor applies twice. Returns events applied."""
    applied = 0
    async with db.acquire(executor) as conn, conn.transaction():
        await lock_campaign_rows(conn, campaign_id)
        if projector.ordered:  # back to 0, its row locked until the rebuild commits
            await settle(conn, checkpoints=[(campaign_id, projector.name, 0)])
        if projector.idempotent and not projector.ordered:
            await delete_markers(conn, campaign_id, projector.name)
        await projector.reset_campaign(conn, campaign_id)
        head = 0
        chunk: list[StoredEvent] = []
        types = sorted(projector.events)
        async for last_seq, event in rebuild_events(conn, campaign_id, types, prefetch=CHUNK):
            head = last_seq
            if event is None:
                continue
            chunk.append(event)
            if len(chunk) == CHUNK:
                await _replay(conn, projector, chunk)
                applied, chunk = applied + len(chunk), []
        if chunk:
            await _replay(conn, projector, chunk)
            applied += len(chunk)
        if projector.ordered:  # at the journal head the rebuild read
            await settle(conn, checkpoints=[(campaign_id, projector.name, head)])
    return applied
