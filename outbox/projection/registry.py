"""The projector registry: what an app registered, indexed for the apply hot path.

`Projector` is one registration (name, event types, function, guard, per-event or batch);
`Registry` validates registrations and settings against each other and answers "who
subscribes to this type" from an index built once. No I/O happens here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from outbox.config import Settings
from outbox.errors import ConfigError
from outbox.model import EventBatch, StoredEvent
from outbox.projection.upcasting import Upcasters

if TYPE_CHECKING:
    from outbox.db import Connection
    from outbox.projection.sql_projectors import SqlFunctions

__all__ = [
    "PROMOTIONS",
    "STARTS",
    "BatchProjectorFn",
    "DropFn",
    "Projector",
    "ProjectorFn",
    "Promotion",
    "Registry",
    "ResetFn",
    "Start",
    "running_projector",
    "track_name",
]

# A per-event projector: (transaction, event); a non-transactional one gets the worker's pool
# instead of a transaction (lease mode).
ProjectorFn = Callable[["Connection", StoredEvent], Awaitable[None]]
# A batch projector: (transaction, the batch's events it subscribes to, in (campaign_id, seq)
# order, that its guard lets through), as an EventBatch: columns, or StoredEvents on demand.
BatchProjectorFn = Callable[["Connection", EventBatch], Awaitable[None]]
# Where a projector starts when first deployed (S25).
Start = Literal["beginning", "now"]
STARTS: tuple[Start, ...] = ("beginning", "now")
# Clears one campaign's projection rows before a rebuild re-applies its journal.
ResetFn = Callable[["Connection", str], Awaitable[None]]
# Drops a retired version's read model (its tables), in the retirement's transaction.
DropFn = Callable[["Connection"], Awaitable[None]]
# Who makes a version live (S29): an operator (`projector-promote`), or the workers once it is
# caught up.
Promotion = Literal["manual", "auto"]
PROMOTIONS: tuple[Promotion, ...] = ("manual", "auto")
# A version's track is keyed `name@vN` (version 1 keeps the bare name, so projectors declared
# before versions existed keep their checkpoints and markers); a declared name never ends so.
_VERSIONED = re.compile(r"@v[0-9]+$")


def track_name(name: str, version: int) -> str:
    """The key of projector `name`'s `version`: its checkpoints, markers, holds and pauses
    are kept under it (`roster`, `roster@v2`)."""
    return name if version == 1 else f"{name}@v{version}"


def running_projector() -> Projector:
    """The projector whose function is running now (in that function's task): its `base`
    name, its `version` and its track (`name`), so one function registered for several
    versions knows which read model to write. A RuntimeError outside a projector's call."""
    projector = _running.get()
    if projector is None:
        raise RuntimeError("running_projector() is called from inside a projector's function")
    return projector


def replaying() -> bool:
    """Whether the projector's function running now is given history again rather than live
    events (S31): a build or rebuild by the catch-up engine, a per-campaign rebuild, or a
    worker's catch-up from the journal (a call whose events all came from the journal, not
    from their work rows). A projector with side effects (mail, webhooks) skips them when it
    is. False outside a projector's call."""
    return _replaying.get()


@dataclass(frozen=True, slots=True)
class Projector:
    # The track's key: the declared name for version 1, `name@vN` for a later version.
    name: str
    events: frozenset[str]
    fn: ProjectorFn | BatchProjectorFn
    ordered: bool = True
    idempotent: bool = False
    reset: ResetFn | None = None
    batch: bool = False
    # False: runs outside any queue transaction, under a lease (at-least-once).
    transactional: bool = True
    # Where it starts when first deployed (S25): "beginning" catches up from the journal, every
    # campaign of it; "now" starts at what the queue holds when a worker first meets a campaign.
    start: Start = "now"
    # Which version of the declared name this is (S29), who promotes it, and what drops its
    # read model when an operator retires it.
    version: int = 1
    promote: Promotion = "manual"
    drop: DropFn | None = None
    # A lease-mode projector whose history a rebuild may give again (S31).
    replay: bool = False
    # A SQL projector's functions (`fn` calls them); None: a Python projector.
    sql: SqlFunctions | None = None
    # The app's upcasters (shared with its registry, so those registered later count too):
    # each event is handed over at the newest version they reach. Not part of its definition.
    upcast: Upcasters | None = field(default=None, compare=False, repr=False)

    @property
    def base(self) -> str:
        """The declared name, every version's (`roster` for `roster@v2`)."""
        return self.name if self.version == 1 else self.name.removesuffix(f"@v{self.version}")

    @property
    def sweeps(self) -> bool:
        """Whether it catches up from the journal when first recorded (S25)."""
        return self.start == "beginning"

    async def run(
        self, conn: Connection, events: Sequence[StoredEvent], *, replaying: bool = False
    ) -> None:
        """Call the function: once with `events` as an EventBatch (batch), or once per event;
        `running_projector()` is this projector meanwhile, and `replaying()` says whether the
        events are history given again (a build, a rebuild, a catch-up from the journal)."""
        with self._as_running(replaying):
            upcast = self.upcast
            if self.sql is not None:  # the server reads the events and upcasts them (SQL)
                chains = upcast.sql_chains(self.events) if upcast is not None else {}
                await self.sql.apply(conn, EventBatch.of(events), chains)
                return
            if upcast:
                events = upcast.apply(EventBatch.of(events))
            if self.batch:
                await self.fn(conn, EventBatch.of(events))  # type: ignore[arg-type]
                return
            for event in events:
                await self.fn(conn, event)  # type: ignore[arg-type]

    async def reset_campaign(self, conn: Connection, campaign_id: str) -> None:
        """Call its reset hook on one campaign (a rebuild's first step there), as its
        function runs: `running_projector()` is this projector, `replaying()` true."""
        if self.reset is None:
            raise ConfigError(f"projector {self.name!r} has no reset hook")
        with self._as_running(True):
            await self.reset(conn, campaign_id)

    @contextmanager
    def _as_running(self, replaying: bool) -> Iterator[None]:
        """`running_projector()` this projector and `replaying()` `replaying` in the block."""
        token, replay = _running.set(self), _replaying.set(replaying)
        try:
            yield
        finally:
            _replaying.reset(replay)
            _running.reset(token)


# The projector whose function runs in this task now (`running_projector`).
_running: ContextVar[Projector | None] = ContextVar("outbox_running_projector", default=None)
# Whether the events it runs on now are history given again (`replaying`).
_replaying: ContextVar[bool] = ContextVar("outbox_replaying", default=False)


@dataclass
class Registry:
    projectors: dict[str, Projector] = field(default_factory=dict)
    ignored: set[str] = field(default_factory=set)
    upcasters: Upcasters = field(default_factory=Upcasters)
    _by_type: dict[str, tuple[Projector, ...]] = field(default_factory=dict)
    _ordered: list[str] = field(default_factory=list)
    _now: list[str] = field(default_factory=list)
    _checkpointed: list[str] = field(default_factory=list)
    _leased: frozenset[str] = frozenset()
    _leasing: frozenset[str] = frozenset()

    def add(self, projector: Projector) -> None:
        if not projector.base.strip():
            raise ConfigError("a projector needs a non-empty name")
        version = projector.version
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigError(
                f"projector {projector.base!r}: version must be a whole number from 1, "
                f"not {version!r}"
            )
        if _VERSIONED.search(projector.base):
            raise ConfigError(
                f"projector {projector.base!r}: a name ending '@v<number>' is a version's key; "
                "declare the name alone and pass version="
            )
        if projector.name != track_name(projector.base, version):
            raise ConfigError(f"projector {projector.name!r}: its key must be its track_name")
        if projector.promote not in PROMOTIONS:
            raise ConfigError(
                f"projector {projector.name!r}: promote must be 'manual' or 'auto', "
                f"not {projector.promote!r}"
            )
        if not projector.transactional and (
            projector.ordered or projector.idempotent or projector.batch
        ):
            raise ConfigError(
                f"projector {projector.name!r}: transactional=False runs outside the queue's "
                "transaction, where no checkpoint, marker or batch can guard it; drop "
                "ordered/idempotent/batch (the queue keeps per-campaign order)"
            )
        if projector.replay and projector.transactional:
            raise ConfigError(
                f"projector {projector.name!r}: replay=True is for lease-mode projectors "
                "(transactional=False), whose side effects are never replayed unasked; a "
                "transactional projector is rebuilt under its guard (reset=)"
            )
        if projector.start not in STARTS:
            raise ConfigError(
                f"projector {projector.name!r}: start must be 'beginning' or 'now', "
                f"not {projector.start!r}"
            )
        if projector.sweeps and not (
            projector.transactional and (projector.ordered or projector.idempotent)
        ):
            raise ConfigError(
                f"projector {projector.name!r}: start='beginning' catches up from the journal "
                "inside the queue's transaction, where a guard keeps it from applying an event "
                "twice; register it ordered (a checkpoint, the default of a transactional "
                "projector) or ordered=False, idempotent=True (processed markers), or use "
                "start='now'"
            )
        if projector.name in self.projectors:
            twice = "registered twice" if version == 1 else f"version {version} registered twice"
            raise ConfigError(f"projector {projector.base!r}: {twice}")
        if not projector.events:
            raise ConfigError(f"projector {projector.name!r} subscribes to no event type")
        if overlap := projector.events & self.ignored:
            raise ConfigError(
                f"projector {projector.name!r} subscribes to ignored {sorted(overlap)}"
            )
        if projector.upcast is None:  # one registered elsewhere keeps its app's upcasters
            projector = dataclasses.replace(projector, upcast=self.upcasters)
        self.projectors[projector.name] = projector
        self._by_type.clear()  # the indexes are rebuilt on next use

    def without(self, names: frozenset[str]) -> Registry:
        """This registry less the projectors `names` (superseded versions, S29): a new one, its
        indexes built afresh; this one when none of them is here."""
        if not names & self.projectors.keys():
            return self
        kept = Registry(ignored=set(self.ignored), upcasters=self.upcasters)
        kept.projectors = {n: p for n, p in self.projectors.items() if n not in names}
        return kept

    def versions(self, base: str) -> list[Projector]:
        """The registered versions of declared name `base`, lowest first."""
        return sorted(
            (p for p in self.projectors.values() if p.base == base), key=lambda p: p.version
        )

    def ignore(self, types: Iterable[str]) -> None:
        types = set(types)
        for p in self.projectors.values():
            if overlap := p.events & types:
                raise ConfigError(
                    f"cannot ignore {sorted(overlap)}: projector {p.name!r} uses them"
                )
        self.ignored |= types

    def _index(self) -> None:
        # Built once after registration, read on every event (the apply hot path).
        if self._by_type or not self.projectors:
            return
        index: dict[str, list[Projector]] = {}
        for p in sorted(self.projectors.values(), key=lambda p: p.name):
            for t in p.events:
                index.setdefault(t, []).append(p)
        self._by_type = {t: tuple(ps) for t, ps in index.items()}
        self._ordered = sorted(p.name for p in self.projectors.values() if p.ordered)
        self._now = [n for n in self._ordered if self.projectors[n].start == "now"]
        self._checkpointed = sorted(
            p.name for p in self.projectors.values() if p.ordered or p.sweeps
        )
        self._leasing = frozenset(p.name for p in self.projectors.values() if not p.transactional)
        self._leased = frozenset(
            t for t, ps in self._by_type.items() if any(p.name in self._leasing for p in ps)
        )

    def subscribers(self, event_type: str) -> tuple[Projector, ...]:
        self._index()
        return self._by_type.get(event_type, ())

    def sql_signatures(self) -> dict[str, str]:
        """Each function the SQL projectors call (`schema.fn(jsonb)`, a hook's too), with the
        projector that calls it."""
        found: dict[str, str] = {}
        for projector in self.projectors.values():
            if projector.sql is not None:
                for signature in projector.sql.signatures:
                    found.setdefault(signature, projector.name)
                for chain in self.upcasters.sql_chains(projector.events).values():
                    for function in chain.values():
                        found.setdefault(f"{function}(jsonb)", projector.name)
        return found

    def leased_types(self) -> frozenset[str]:
        """Event types with a non-transactional subscriber: their rows go through lease mode."""
        self._index()
        return self._leased

    def leased_names(self) -> frozenset[str]:
        """The non-transactional (lease-mode) projectors."""
        self._index()
        return self._leasing

    def starting_now(self) -> list[str]:
        """The ordered projectors that start at what the queue holds (S25), sorted."""
        self._index()
        return self._now

    def ordered_names(self) -> list[str]:
        """Every ordered projector, sorted (a fixed lock order for their checkpoints)."""
        self._index()
        return self._ordered

    def checkpointed_names(self) -> list[str]:
        """The projectors with checkpoints, sorted (the claim locks them in this order): every
        ordered one, and each unordered one that catches up from the journal (its catch-up
        cursor per campaign, S25)."""
        self._index()
        return self._checkpointed

    def validate(self, settings: Settings) -> None:
        """Refuse settings that contradict the registered projectors (one-line ConfigError)."""
        for projector in self.projectors.values():
            if projector.sql is not None:  # the server must upcast what a Python one would
                self.upcasters.check_sql(projector.name, projector.events)
        ordered = self.ordered_names()
        if ordered and settings.ordering == "none":
            raise ConfigError(
                f"OUTBOX_ORDERING=none cannot serve ordered (checkpointed) projectors: "
                f"{', '.join(ordered)}; register them with ordered=False or use ordering=campaign"
            )
        catching = sorted(p.name for p in self.projectors.values() if p.sweeps and not p.ordered)
        if catching and settings.ordering == "none":
            raise ConfigError(
                f"OUTBOX_ORDERING=none cannot catch up projectors from the journal: "
                f"{', '.join(catching)}; the catch-up takes each campaign through the campaign "
                "queue: use ordering=campaign, or start='now'"
            )
        leased = sorted(p.name for p in self.projectors.values() if not p.transactional)
        if leased and settings.ordering == "none":
            raise ConfigError(
                f"OUTBOX_ORDERING=none cannot serve non-transactional projectors: "
                f"{', '.join(leased)}; their leases are reclaimed through the campaign queue: "
                "use ordering=campaign"
            )
        if ordered and settings.park:
            raise ConfigError(
                f"OUTBOX_DEAD_POLICY=park would skip events that ordered projectors must see "
                f"({', '.join(ordered)}); use dead_policy=block or ordered=False"
            )
        others = sorted(
            p.name for p in self.projectors.values() if not (p.ordered and p.transactional)
        )
        if settings.grouped and others:
            raise ConfigError(
                f"worker group {settings.group!r} (OUTBOX_GROUP, --group) serves ordered, "
                f"transactional projectors, each from its checkpoint: {', '.join(others)} "
                "is not one; run it in the default group"
            )
