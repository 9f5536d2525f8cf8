"""The projectors the database knows: what the workers that apply record as they start, and
an operator's retirement or redefinition of one.

A worker records every projector it runs (its definition, S33: subscribed types, guard, kind,
transactional, start, function), so the database knows a projector as soon as one worker of a
deploy runs it, and keeps knowing it while older workers without it still run. A worker whose
definition of a recorded projector differs is refused and writes nothing (`DefinitionDrift`);
an operator records a change safe in place (`redefine`, audited), and workers already running
stop running a projector whose recorded fingerprint is no longer theirs. A projector leaves
only by `retire` (audited beside pauses and resumes, optionally dropping its checkpoints and
markers): never because one worker's code lacks it. It owns every statement on
`outbox_projectors`; it never runs a projector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any

import orjson

from outbox import db
from outbox.config.fields import DEFAULT_GROUP
from outbox.errors import NotFound
from outbox.obs import log
from outbox.projection.definition import (
    Change,
    DefinitionDrift,
    changes,
    check,
    definition,
    fingerprint,
    legacy_definition,
)
from outbox.queries import Queries
from outbox.queue.holds import count_holds, delete_projector_holds
from outbox.queue.settle import refresh_campaigns, settle

if TYPE_CHECKING:
    from collections.abc import Sequence

    from outbox.db import Connection, Executor
    from outbox.projection.registry import Projector, Registry

__all__ = [
    "AbsentProjectors",
    "KnownProjector",
    "Retired",
    "check_recorded",
    "list_known",
    "owe_nothing",
    "record",
    "redefine",
    "require_known",
    "require_recorded",
    "retire",
]


class KnownQueries(Queries):
    record_projectors: str
    list_projectors: str
    retire_projector: str
    redefine_projector: str
    lock_projector: str
    delete_checkpoints: str
    delete_markers: str


Q = KnownQueries

_logger = log.get_logger("outbox.worker")

# Times a worker records its projectors before a race with another worker's first record of
# them (a unique key's violation) is its failure.
RECORD_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class KnownProjector:
    """A recorded projector: what the last worker to start with it said, and when; where it
    started when first seen (S25)."""

    projector: str
    events: list[str]
    ordered: bool
    transactional: bool
    start: str
    first_seen_at: datetime
    last_seen_at: datetime
    last_seen_by: str
    paused: bool
    # The declared name, this version of it, and the version's state (S29): live, superseded
    # (owed no work) or building.
    base: str
    version: int
    state: str
    # What decides what it owes and how it is guarded (S33), and a digest of it; None: recorded
    # by a worker of a release before definitions (the fields it kept are `recorded`).
    definition: dict[str, Any] | None = None
    fingerprint: str | None = None
    # The worker group that serves it (S35).
    group: str = DEFAULT_GROUP

    @property
    def recorded(self) -> dict[str, Any]:
        """Its definition, or what a record from before definitions kept of one."""
        if self.definition is not None:
            return self.definition
        return legacy_definition(self.events, self.ordered, self.transactional)


@dataclass(frozen=True, slots=True)
class Retired:
    """`maintenance projector-retire`: the record as it was, the guards dropped with it
    (checkpoints, markers; 0 when they were kept), and whether its read model was dropped."""

    record: KnownProjector
    checkpoints: int
    markers: int
    # Whether its `drop` hook dropped its read model (a superseded version, the app given).
    dropped: bool = False


def _known(r: db.Record) -> KnownProjector:
    return KnownProjector(
        r["projector"],
        list(r["events"]),
        r["ordered"],
        r["transactional"],
        r["start"],
        r["first_seen_at"],
        r["last_seen_at"],
        r["last_seen_by"],
        r["paused"],
        r["base"],
        r["version"],
        r["state"],
        r["definition"],
        r["fingerprint"],
        r["group_name"],
    )


async def record(
    executor: Executor, registry: Registry, worker_id: str, group: str = DEFAULT_GROUP
) -> list[str]:
    """Record `registry`'s projectors as run by `worker_id` in worker group `group` (S35); the
    names seen for the first time. A recorded projector whose definition differs from this
    worker's (its group included) refuses the whole record (`DefinitionDrift`, naming each
    field) and nothing is written."""
    document = []
    for p in registry.projectors.values():
        mine = definition(p, group)
        document.append(
            {
                "projector": p.name,
                "events": mine["events"],
                "ordered": p.ordered,
                "transactional": p.transactional,
                "start": p.start,
                "definition": mine,
                "fingerprint": fingerprint(mine),
            }
        )
    if not document:
        return []
    text = orjson.dumps(document).decode()
    once = partial(_record_once, executor, text, len(document), registry, worker_id, group)
    for _ in range(RECORD_ATTEMPTS - 1):
        try:
            return await once()
        except Exception as exc:
            # Two workers recording a new projector at once: the insert that came second met
            # the first's row in the (base, version) key, which ON CONFLICT (its name) does not
            # arbitrate. The first has committed: again, this one finds the record.
            if db.sqlstate_of(exc) != db.UNIQUE_VIOLATION:
                raise
    return await once()


async def _record_once(
    executor: Executor, text: str, count: int, registry: Registry, worker_id: str, group: str
) -> list[str]:
    """One try of `record`, in a transaction of its own."""
    async with db.acquire(executor) as conn, conn.transaction():
        rows = await conn.fetch(Q.record_projectors, text, worker_id)
        if len(rows) < count:  # a recorded definition differs: refuse, write nothing
            raise drift(list(registry.projectors.values()), await list_known(conn), group)
    return sorted(r["projector"] for r in rows if r["new"])


def drift(
    projectors: Sequence[Projector], known: Sequence[KnownProjector], group: str | None = None
) -> DefinitionDrift:
    """The refusal of code whose `projectors` (served in `group`; None: wherever each is
    recorded) are defined otherwise than recorded."""
    mine = {p.name: p for p in projectors}
    found: list[tuple[str, int, int, list[Change]]] = []
    for k in known:
        p = mine.get(k.projector)
        served = k.group if group is None else group
        if p is not None and (diff := changes(k.recorded, definition(p, served))):
            versions = [x.version for x in known if x.base == k.base]
            versions += [x.version for x in projectors if x.base == k.base]
            found.append((k.projector, k.version, max(versions) + 1, diff))
    return DefinitionDrift(found)


async def check_recorded(executor: Executor, projectors: Sequence[Projector]) -> None:
    """Refuse (`DefinitionDrift`) `projectors` whose recorded definition differs from theirs:
    a build or a rebuild applies what the record says a projector owes, under its guard,
    whichever worker group serves it (S35). One not recorded yet passes (a version built
    before any worker runs it)."""
    known = await list_known(executor)
    refusal = drift(projectors, known)
    if refusal.drifts:
        raise refusal


async def redefine(
    conn: Connection, projector: Projector, *, actor: str, reason: str
) -> list[Change] | None:
    """Record `projector`'s definition in place of the recorded one, in the caller's
    transaction, audited with the change: refused (ConfigError) unless every change is safe in
    place (S33); the changes made ([]: none), or None when it is not recorded."""
    row = await conn.fetchrow(Q.lock_projector, projector.name)
    if row is None:
        return None
    recorded = (
        legacy_definition(row["events"], row["ordered"], row["transactional"])
        if row["definition"] is None
        else row["definition"]
    )
    mine = definition(projector, row["group_name"])  # a group changes by a version alone
    found = check(projector.name, recorded, mine)
    if found or row["definition"] is None:
        change = "; ".join(c.describe() for c in found) or "definition recorded"
        await conn.execute(
            Q.redefine_projector,
            projector.name,
            mine,
            fingerprint(mine),
            actor,
            reason,
            change,
        )
    return found


async def list_known(executor: Executor) -> list[KnownProjector]:
    async with db.acquire(executor) as conn:
        return [_known(r) for r in await conn.fetch(Q.list_projectors)]


async def require_recorded(executor: Executor, name: str) -> KnownProjector:
    """The record of projector `name`; NotFound naming the recorded ones when the database
    does not know it (a typo in an operator's command must not act on nothing)."""
    recorded = await list_known(executor)
    found = next((k for k in recorded if k.projector == name), None)
    if found is None:
        raise _unknown(name, recorded)
    return found


async def require_known(executor: Executor, name: str) -> None:
    """NotFound (as `require_recorded`'s) unless projector `name` is recorded or holds work
    (S24: an embedded worker's projector may hold rows it never recorded): what a requeue,
    retry or discard for one projector checks, so a typo repairs nothing."""
    async with db.acquire(executor) as conn:
        recorded = await list_known(conn)
        if any(k.projector == name for k in recorded):
            return
        if any(h.projector == name for h in await count_holds(conn)):
            return
        raise _unknown(name, recorded)


def _unknown(name: str, recorded: Sequence[KnownProjector]) -> NotFound:
    names = ", ".join(k.projector for k in recorded) or "none"
    return NotFound(f"projector {name!r} is not recorded (recorded: {names})")


async def retire(
    conn: Connection, projector: str, *, actor: str, reason: str, drop_guards: bool
) -> Retired | None:
    """Retire `projector` (audited), dropping its holds (and the rows that stood for them
    alone) and, when `drop_guards`, its checkpoints and markers, all in the caller's
    transaction; None when it is not recorded."""
    row = await conn.fetchrow(Q.retire_projector, projector, actor, reason)
    if row is None:
        return None
    await owe_nothing(conn, projector)
    checkpoints = markers = 0
    if drop_guards:
        checkpoints = db.affected(await conn.execute(Q.delete_checkpoints, projector))
        markers = db.affected(await conn.execute(Q.delete_markers, projector))
    return Retired(_known(row), checkpoints, markers)


async def owe_nothing(conn: Connection, projector: str) -> int:
    """`projector` owes nothing from now on (retired, or a superseded version): its holds go,
    the rows that stood for them alone with them (S24), in the caller's transaction; the holds
    gone."""
    gone = await delete_projector_holds(conn, projector)
    if gone:
        await settle(conn, released=gone)
        await refresh_campaigns(conn, sorted({cid for cid, _, _ in gone}), park=True)
    return len(gone)


@dataclass
class AbsentProjectors:
    """The projectors the database knows that an applier's code lacks (a rolling deploy runs
    workers with and without a projector), or defines otherwise since an operator redefined
    them (S33): their share of an event waits in holds for a worker that runs them as
    recorded (S24), never completed on their behalf. Read at most once per `interval`."""

    interval: float
    group: str = DEFAULT_GROUP  # this applier's worker group (S35): others' are not its own
    known: tuple[KnownProjector, ...] = ()
    _read_at: float = field(default=float("-inf"), repr=False)
    # The registry last asked about, its fingerprints, the names redefined, and the registry
    # less them (built once per change).
    _mine: tuple[Registry, dict[str, str]] | None = field(default=None, repr=False)
    _in_force: tuple[Registry, frozenset[str], Registry] | None = field(default=None, repr=False)
    _redefined: frozenset[str] = field(default=frozenset(), repr=False)

    def expire(self) -> None:
        """Read the record again at the next call."""
        self._read_at = float("-inf")

    async def _read(self, conn: Connection) -> None:
        if monotonic() - self._read_at >= self.interval:
            self.known = tuple(await list_known(conn))
            self._read_at = monotonic()

    async def in_force(self, conn: Connection, registry: Registry) -> Registry:
        """`registry` less the projectors whose recorded fingerprint is not this worker's: an
        operator recorded another definition since this worker started (S33), and it runs
        them no more (logged once each)."""
        await self._read(conn)
        if self._mine is None or self._mine[0] is not registry:
            mine = {
                n: fingerprint(definition(p, self.group)) for n, p in registry.projectors.items()
            }
            self._mine = (registry, mine)
        mine = self._mine[1]
        names = frozenset(
            k.projector
            for k in self.known
            if k.fingerprint is not None and mine.get(k.projector, k.fingerprint) != k.fingerprint
        )
        for name in sorted(names - self._redefined):
            recorded = next(k.fingerprint for k in self.known if k.projector == name)
            _logger.warning(
                "projector.redefined",
                extra={
                    "projector": name,
                    "recorded": recorded,
                    "mine": mine[name],
                    "action": "this worker runs it no more; its share waits for a worker "
                    "that runs the recorded definition",
                },
            )
        self._redefined = names
        cached = self._in_force
        if cached is None or cached[0] is not registry or cached[1] != names:
            cached = (registry, names, registry.without(names))
            self._in_force = cached
        return cached[2]

    def running(self, registry: Registry) -> dict[str, str]:
        """What this worker runs of `registry` now, each with its fingerprint: less what an
        operator redefined since it started (the worker registry's `projectors`)."""
        mine = {n: fingerprint(definition(p, self.group)) for n, p in registry.projectors.items()}
        return {n: f for n, f in mine.items() if n not in self._redefined}

    async def of(self, conn: Connection, registry: Registry) -> tuple[KnownProjector, ...]:
        """The recorded transactional projectors of this worker's group that `registry` lacks
        (lease-mode ones are leased by the workers that run them), superseded versions aside
        (owed nothing)."""
        await self._read(conn)
        return tuple(
            k
            for k in self.known
            if k.transactional
            and k.group == self.group
            and k.state != "superseded"
            and k.projector not in registry.projectors
        )

    async def others(self, conn: Connection) -> frozenset[str]:
        """The projectors recorded in other worker groups (S35): their holds are not its."""
        await self._read(conn)
        return frozenset(k.projector for k in self.known if k.group != self.group)
