"""Projectors: the `Outbox` app, its registry, exactly-once dispatch of one event (S8, S17, S18).

`apply_event()` runs every projector subscribed to an event on the caller's connection, inside
the caller's transaction (the worker wraps each event in one savepoint, so all projectors of an
event apply atomically). Ordered projectors advance a checkpoint per campaign before running;
unordered `idempotent=True` projectors reserve a processed marker first; either guard turns a
redelivery into a skip. This module never claims, deletes or retries work rows.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outbox.config import Settings
from outbox.errors import ConfigError, OutboxError
from outbox.journal import AppendResult, Event, StoredEvent, append
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "ApplyOutcome",
    "CheckpointGap",
    "Outbox",
    "Projector",
    "ProjectorFn",
    "Registry",
    "StoredEvent",
    "UnknownEventType",
    "apply_event",
]


class ProjectorQueries(Queries, file="projectors.sql"):
    advance_checkpoints: str
    reserve_marker: str


Q = ProjectorQueries


ProjectorFn = Callable[["Connection", StoredEvent], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Projector:
    name: str
    events: frozenset[str]
    fn: ProjectorFn
    ordered: bool = True
    idempotent: bool = False


class UnknownEventType(OutboxError):
    """No projector subscribes to the type and the app did not declare it ignorable (S8)."""


class CheckpointGap(OutboxError):
    """An ordered projector was handed seq n while its checkpoint is below n-1 (S17)."""


class ApplyOutcome(enum.Enum):
    APPLIED = "applied"  # at least one projector ran
    DUPLICATE = "duplicate"  # every subscribed projector had already applied it
    IGNORED = "ignored"  # the app declared the type as needing no projection


@dataclass
class Registry:
    projectors: dict[str, Projector] = field(default_factory=dict)
    ignored: set[str] = field(default_factory=set)
    _by_type: dict[str, tuple[Projector, ...]] = field(default_factory=dict)

    def add(self, projector: Projector) -> None:
        if not projector.name.strip():
            raise ConfigError("a projector needs a non-empty name")
        if projector.name in self.projectors:
            raise ConfigError(f"projector {projector.name!r} is registered twice")
        if not projector.events:
            raise ConfigError(f"projector {projector.name!r} subscribes to no event type")
        if overlap := projector.events & self.ignored:
            raise ConfigError(
                f"projector {projector.name!r} subscribes to ignored {sorted(overlap)}"
            )
        self.projectors[projector.name] = projector
        self._by_type.clear()

    def ignore(self, types: Iterable[str]) -> None:
        types = set(types)
        for p in self.projectors.values():
            if overlap := p.events & types:
                raise ConfigError(
                    f"cannot ignore {sorted(overlap)}: projector {p.name!r} uses them"
                )
        self.ignored |= types

    def subscribers(self, event_type: str) -> tuple[Projector, ...]:
        if not self._by_type:
            index: dict[str, list[Projector]] = {}
            for p in sorted(self.projectors.values(), key=lambda p: p.name):
                for t in p.events:
                    index.setdefault(t, []).append(p)
            self._by_type = {t: tuple(ps) for t, ps in index.items()}
        return self._by_type.get(event_type, ())

    def ordered_names(self) -> list[str]:
        """Every ordered projector, sorted (a fixed lock order for their checkpoints)."""
        return sorted(p.name for p in self.projectors.values() if p.ordered)

    def validate(self, settings: Settings) -> None:
        """Refuse settings that contradict the registered projectors (one-line ConfigError)."""
        ordered = self.ordered_names()
        if ordered and settings.ordering == "none":
            raise ConfigError(
                f"OUTBOX_ORDERING=none cannot serve ordered (checkpointed) projectors: "
                f"{', '.join(ordered)}; register them with ordered=False or use ordering=campaign"
            )
        if ordered and settings.dead_policy == "park":
            raise ConfigError(
                f"OUTBOX_DEAD_POLICY=park would skip events that ordered projectors must see "
                f"({', '.join(ordered)}); use dead_policy=block or ordered=False"
            )


class Outbox:
    """The app object: settings plus the projector registry.

    app = Outbox()

    @app.projector("roster", events=["character.joined"])
    async def roster(tx, event): ...
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self.registry = Registry()

    def projector(
        self,
        name: str,
        *,
        events: Sequence[str],
        ordered: bool = True,
        idempotent: bool = False,
    ) -> Callable[[ProjectorFn], ProjectorFn]:
        if isinstance(events, str):
            raise ConfigError(f"projector {name!r}: events must be a list of types, not a string")

        def register(fn: ProjectorFn) -> ProjectorFn:
            self.registry.add(Projector(name, frozenset(events), fn, ordered, idempotent))
            return fn

        return register

    def ignore(self, types: Sequence[str]) -> None:
        """Declare event types that need no projection: completed and counted as skipped."""
        self.registry.ignore(types)

    def validate(self) -> None:
        self.registry.validate(self.settings)

    async def append(
        self, executor: Executor, campaign_id: str, events: Sequence[Event], **options: Any
    ) -> AppendResult:
        """`outbox.append` with this app's settings."""
        return await append(executor, campaign_id, events, settings=self.settings, **options)


async def apply_event(conn: Connection, registry: Registry, event: StoredEvent) -> ApplyOutcome:
    """Run the event's projectors once each, guarded; call inside a transaction (savepoint).

    Every ordered projector's checkpoint moves past the event (S17), subscribed or not; then the
    subscribers run, each unless its guard says the event was already applied.
    """
    subscribed = registry.subscribers(event.type)
    if not subscribed and event.type not in registry.ignored:
        raise UnknownEventType(f"no projector subscribes to event type {event.type!r}")
    verdicts: dict[str, str] = {}
    ordered = registry.ordered_names()
    if ordered:
        rows = await conn.fetch(Q.advance_checkpoints, event.campaign_id, event.seq, ordered)
        for row in rows:
            if row["verdict"] == "gap":
                raise CheckpointGap(
                    f"projector {row['projector']!r} is at seq {row['applied_seq']} of campaign "
                    f"{event.campaign_id!r} and cannot apply seq {event.seq}"
                )
            verdicts[row["projector"]] = row["verdict"]
    if not subscribed:
        return ApplyOutcome.IGNORED
    ran = False
    for projector in subscribed:
        if projector.ordered:
            if verdicts[projector.name] == "duplicate":
                continue
        elif projector.idempotent:
            reserved = await conn.fetchval(
                Q.reserve_marker, event.campaign_id, event.seq, projector.name
            )
            if not reserved:
                continue
        await projector.fn(conn, event)
        ran = True
    return ApplyOutcome.APPLIED if ran else ApplyOutcome.DUPLICATE
