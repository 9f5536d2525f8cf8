"""The projector registry: what an app registered, indexed for the apply hot path.

`Projector` is one registration (name, event types, function, guard, per-event or batch);
`Registry` validates registrations and settings against each other and answers "who
subscribes to this type" from an index built once. No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from outbox.config import Settings
from outbox.errors import ConfigError
from outbox.model import EventBatch, StoredEvent

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = [
    "STARTS",
    "BatchProjectorFn",
    "Projector",
    "ProjectorFn",
    "Registry",
    "ResetFn",
    "Start",
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


@dataclass(frozen=True, slots=True)
class Projector:
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

    @property
    def sweeps(self) -> bool:
        """Whether it catches up from the journal when first recorded (S25)."""
        return self.start == "beginning"

    async def run(self, conn: Connection, events: Sequence[StoredEvent]) -> None:
        """Call the function: once with `events` as an EventBatch (batch), or once per event."""
        if self.batch:
            await self.fn(conn, EventBatch.of(events))  # type: ignore[arg-type]
            return
        for event in events:
            await self.fn(conn, event)  # type: ignore[arg-type]


@dataclass
class Registry:
    projectors: dict[str, Projector] = field(default_factory=dict)
    ignored: set[str] = field(default_factory=set)
    _by_type: dict[str, tuple[Projector, ...]] = field(default_factory=dict)
    _ordered: list[str] = field(default_factory=list)
    _now: list[str] = field(default_factory=list)
    _checkpointed: list[str] = field(default_factory=list)
    _leased: frozenset[str] = frozenset()
    _leasing: frozenset[str] = frozenset()

    def add(self, projector: Projector) -> None:
        if not projector.name.strip():
            raise ConfigError("a projector needs a non-empty name")
        if not projector.transactional and (
            projector.ordered or projector.idempotent or projector.batch
        ):
            raise ConfigError(
                f"projector {projector.name!r}: transactional=False runs outside the queue's "
                "transaction, where no checkpoint, marker or batch can guard it; drop "
                "ordered/idempotent/batch (the queue keeps per-campaign order)"
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
            raise ConfigError(f"projector {projector.name!r} is registered twice")
        if not projector.events:
            raise ConfigError(f"projector {projector.name!r} subscribes to no event type")
        if overlap := projector.events & self.ignored:
            raise ConfigError(
                f"projector {projector.name!r} subscribes to ignored {sorted(overlap)}"
            )
        self.projectors[projector.name] = projector
        self._by_type.clear()  # the indexes are rebuilt on next use

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
