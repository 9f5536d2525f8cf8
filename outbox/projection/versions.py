"""Projector versions (S29): a later version is a new track of the same projector, built
beside the live one from the journal, made live in one step.

A version is a registration with `version=N`; its track's key is `name@vN` (`track_name`),
and every row a projector's name keys (checkpoints, markers, holds, pauses, the record) is
keyed by it, so the catch-up (S25), the holds (S24) and the guards serve a version unchanged.
The database keeps, per declared name, the live version (`outbox_projector_live`): readers ask
for it (`live_version`), operators move it (`promote`), and the versions below it are
superseded: owed no work. A worker reads which versions are superseded at most once per poll
interval (`SupersededVersions`) and runs none of them; a batch that ran one all the same (its
read was older than the promotion) is refused by its settle under the versions' lock and runs
again without it, so no batch that ran a superseded version commits after its promotion.

It owns the statements on the live versions and the promotion; it never runs a projector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic
from typing import TYPE_CHECKING

from outbox import db
from outbox.errors import Conflict, NotFound
from outbox.projection.known import owe_nothing
from outbox.projection.registry import track_name
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor
    from outbox.projection.registry import Registry

__all__ = [
    "AutoPromotions",
    "Promoted",
    "SupersededVersions",
    "Version",
    "VersionLag",
    "list_versions",
    "live_version",
    "promote",
    "version_lag",
]

# How long a promotion waits for the batches that settled and have not committed (their
# shared hold of the versions' lock) before it gives up, so that it never stalls the apply
# path behind a batch stuck in a projector: the settles that come after it wait for it.
PROMOTE_LOCK_TIMEOUT_MS = 5000
# How often a worker looks whether a version registered `promote="auto"` is caught up.
AUTO_PROMOTE_INTERVAL = 5.0


class VersionsQueries(Queries):
    get_live_version: str
    list_superseded_versions: str
    list_versions: str
    lock_versions: str
    get_version_lag: str
    promote_version: str


Q = VersionsQueries


@dataclass(frozen=True, slots=True)
class Version:
    """A recorded version: its key, the declared name, the number, its state (`live`,
    `superseded`, `building`) and, for every version of the name, the live one's promotion."""

    projector: str
    base: str
    version: int
    state: str
    promoted_at: datetime | None
    promoted_by: str | None


@dataclass(frozen=True, slots=True)
class VersionLag:
    """How far a version stands from caught up: its sweep done (S25), its holds (catching up,
    failing or dead), and the campaigns with work rows whose history it lacks (an ordered
    version that starts at the beginning). Caught up when the sweep is done and both are 0:
    from then on the batches apply it with the live version, event for event."""

    projector: str
    swept: bool
    holds: int
    campaigns: int

    @property
    def caught_up(self) -> bool:
        return self.swept and not self.holds and not self.campaigns

    def describe(self) -> str:
        """What still keeps it from caught up, in words."""
        parts = [] if self.swept else ["its sweep of the journal is under way"]
        if self.holds:
            parts.append(f"{self.holds} hold(s) (catching up, failing or dead)")
        if self.campaigns:
            parts.append(f"{self.campaigns} campaign(s) with queued rows whose history it lacks")
        return "; ".join(parts) or "caught up"


@dataclass(frozen=True, slots=True)
class Promoted:
    """A promotion: the projector, the version made live, the one live before (None: none
    recorded), whether it was forced past a lag (`lag` as it stood), and the holds of the
    versions it superseded that went with it."""

    projector: str
    version: int
    previous: int | None
    forced: bool
    lag: VersionLag
    released: int

    @property
    def changed(self) -> bool:
        return self.previous != self.version


async def live_version(executor: Executor, projector: str) -> int:
    """The version of `projector` (its declared name) that readers read now: call it inside
    the reader's transaction, then read that version's read model. A projector no worker has
    recorded reads as version 1. Other languages call `outbox.outbox_live_version(name)`."""
    async with db.acquire(executor) as conn:
        found = await conn.fetchval(Q.get_live_version, projector)
    return int(found)


async def list_versions(executor: Executor, projector: str | None = None) -> list[Version]:
    """Every recorded version of `projector` (None: of every projector), lowest first."""
    async with db.acquire(executor) as conn:
        return [Version(*r) for r in await conn.fetch(Q.list_versions, projector)]


async def version_lag(conn: Connection, key: str) -> VersionLag | None:
    """How far the version keyed `key` stands from caught up (None: not recorded)."""
    row = await conn.fetchrow(Q.get_version_lag, key)
    return None if row is None else VersionLag(key, row["swept"], row["holds"], row["campaigns"])


async def promote(
    conn: Connection,
    projector: str,
    version: int,
    *,
    actor: str,
    reason: str | None,
    force: bool = False,
) -> Promoted:
    """Make `version` of `projector` live, in the caller's transaction (audited): refused
    while it is not caught up (a Conflict saying what it lacks) unless `force`. The versions
    below it are owed nothing from the commit on: their holds go now, and the workers' batches
    that ran them are refused from here (S29). Promoting the live version changes nothing.
    `version` is a registered one or an operator's, checked (`ops.versions.check_version`)."""
    key = track_name(projector, version)
    await conn.execute(Q.lock_versions, PROMOTE_LOCK_TIMEOUT_MS)
    lag = await version_lag(conn, key)
    if lag is None:
        recorded = ", ".join(str(v.version) for v in await list_versions(conn, projector))
        raise NotFound(
            f"version {version} of projector {projector!r} is not recorded: a worker records "
            f"it as it starts with it (recorded versions: {recorded or 'none'})"
        )
    if not (lag.caught_up or force):
        raise Conflict(
            f"version {version} of projector {projector!r} is not caught up: {lag.describe()}; "
            "promote it once it is (maintenance outbox-report shows its progress), or pass "
            "--force to expose it as it stands"
        )
    previous = await conn.fetchval(Q.promote_version, projector, version, actor, reason, key)
    released = 0
    for v in await list_versions(conn, projector):
        if v.version < version:
            released += await owe_nothing(conn, v.projector)
    return Promoted(projector, version, previous, force and not lag.caught_up, lag, released)


@dataclass
class SupersededVersions:
    """The superseded versions as a worker sees them, read at most once per `interval`, and
    the registry in force: the app's, less them (built once per change)."""

    interval: float
    names: frozenset[str] = frozenset()
    _read_at: float = field(default=float("-inf"), repr=False)
    _in_force: tuple[Registry, frozenset[str], Registry] | None = field(default=None, repr=False)

    def expire(self) -> None:
        """Read them again at the next call (a settle refused a superseded version)."""
        self._read_at = float("-inf")

    async def registry(self, conn: Connection, registry: Registry) -> Registry:
        """`registry` less the versions superseded now."""
        if monotonic() - self._read_at >= self.interval:
            rows = await conn.fetch(Q.list_superseded_versions)
            self.names = frozenset(r["projector"] for r in rows)
            self._read_at = monotonic()
        cached = self._in_force
        if cached is None or cached[0] is not registry or cached[1] != self.names:
            cached = (registry, self.names, registry.without(self.names))
            self._in_force = cached
        return cached[2]


@dataclass
class AutoPromotions:
    """A worker's part in promoting the versions it runs registered `promote="auto"`: at most
    once per `interval`, each one still building is promoted once caught up (audited, as the
    worker). A version found live or superseded is never looked at again by this worker."""

    interval: float
    pending: set[tuple[str, int]] = field(default_factory=set)
    _looked_at: float = field(default=float("-inf"), repr=False)

    @classmethod
    def of(cls, registry: Registry, *, applies: bool) -> AutoPromotions:
        names = {(p.base, p.version) for p in registry.projectors.values() if p.promote == "auto"}
        return cls(AUTO_PROMOTE_INTERVAL, names if applies else set())

    async def step(self, executor: Executor, worker_id: str) -> list[Promoted]:
        """Look at the pending versions (at most once per interval); the promotions made."""
        if not self.pending or monotonic() - self._looked_at < self.interval:
            return []
        self._looked_at = monotonic()
        made: list[Promoted] = []
        async with db.acquire(executor) as conn:
            states = {v.projector: v.state for v in await list_versions(conn)}
            for base, version in sorted(self.pending):
                key = track_name(base, version)
                state = states.get(key)
                if state in ("live", "superseded"):
                    self.pending.discard((base, version))
                    continue
                lag = await version_lag(conn, key) if state else None
                if lag is None or not lag.caught_up:
                    continue
                try:
                    async with conn.transaction():
                        made.append(
                            await promote(
                                conn,
                                base,
                                version,
                                actor=f"worker {worker_id}",
                                reason="promote='auto': caught up",
                            )
                        )
                except Conflict:
                    continue  # it fell behind between the look and the lock: next time
                self.pending.discard((base, version))
        return made
