"""Projectors: the `Outbox` app, its registry, exactly-once dispatch of one event (S8, S17, S18).

`apply_event()` runs every projector subscribed to an event on the caller's connection, inside
the caller's transaction (the worker wraps each event in one savepoint, so all projectors of an
event apply atomically). Ordered projectors advance a checkpoint per campaign before running;
unordered `idempotent=True` projectors reserve a processed marker first; either guard turns a
redelivery into a skip. This module never claims, deletes or retries work rows.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outbox import db, queue
from outbox.config import Settings
from outbox.errors import ConfigError, OutboxError
from outbox.journal import (
    AppendResult,
    Event,
    StoredEvent,
    append,
    decode_event,
    load_events,
    outcome_unknown_on_connection_loss,
)
from outbox.queries import Queries
from outbox.queue import Failure
from outbox.retry import ErrorClass, after_failure, classify, describe_error

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
    list_campaigns: str
    reset_checkpoint: str
    set_checkpoint: str
    delete_markers: str
    journal_for_rebuild: str
    checkpoints_of: str
    markers_of: str


Q = ProjectorQueries


ProjectorFn = Callable[["Connection", StoredEvent], Awaitable[None]]
# Clears one campaign's projection rows before a rebuild re-applies its journal (S19).
ResetFn = Callable[["Connection", str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Projector:
    name: str
    events: frozenset[str]
    fn: ProjectorFn
    ordered: bool = True
    idempotent: bool = False
    reset: ResetFn | None = None


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
    _ordered: list[str] = field(default_factory=list)

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

    def subscribers(self, event_type: str) -> tuple[Projector, ...]:
        self._index()
        return self._by_type.get(event_type, ())

    def ordered_names(self) -> list[str]:
        """Every ordered projector, sorted (a fixed lock order for their checkpoints)."""
        self._index()
        return self._ordered

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
        reset: ResetFn | None = None,
    ) -> Callable[[ProjectorFn], ProjectorFn]:
        if isinstance(events, str):
            raise ConfigError(f"projector {name!r}: events must be a list of types, not a string")

        def register(fn: ProjectorFn) -> ProjectorFn:
            self.registry.add(Projector(name, frozenset(events), fn, ordered, idempotent, reset))
            return fn

        return register

    def ignore(self, types: Sequence[str]) -> None:
        """Declare event types that need no projection: completed and counted as skipped."""
        self.registry.ignore(types)

    def validate(self) -> None:
        self.registry.validate(self.settings)

    async def append(
        self,
        executor: Executor,
        campaign_id: str,
        events: Sequence[Event],
        *,
        apply_inline: bool | None = None,
        **options: Any,
    ) -> AppendResult:
        """`outbox.append` with this app's settings, and the inline fast path (S5) when
        `apply_inline` (default: OUTBOX_INLINE_APPLY) and enqueueing are on.

        After the inserts, in one savepoint of the append's transaction, the new events are
        applied and their work rows deleted (zero lag). On failure the savepoint rolls back,
        the failing row records attempt 1 and its error, and the append commits all the same.
        Skipped when an earlier row of the campaign is still outstanding (ordering, S9).
        """
        inline = self.settings.inline_apply if apply_inline is None else apply_inline
        if not (inline and self.settings.enabled):
            return await append(executor, campaign_id, events, settings=self.settings, **options)
        with outcome_unknown_on_connection_loss(campaign_id):
            async with db.acquire(executor) as conn, conn.transaction():
                result = await append(conn, campaign_id, events, settings=self.settings, **options)
                if not result.duplicate:
                    await self._apply_inline(conn, result)
        return result

    async def _apply_inline(self, conn: Connection, result: AppendResult) -> None:
        cid = result.campaign_id
        if await queue.outstanding_upto(conn, cid, result.first_seq - 1):
            return  # earlier work of this campaign comes first: the worker takes these too
        stored = await load_events(conn, cid, result.first_seq, result.last_seq)
        current = stored[0]
        try:
            async with conn.transaction():
                for current in stored:
                    await apply_event(conn, self.registry, current)
                await queue.delete_rows(conn, [(cid, seq) for seq in result.seqs])
        except Exception as exc:
            kind = classify(exc)
            if kind is ErrorClass.TRANSIENT:
                raise
            s = self.settings
            dead, delay = after_failure(
                1,
                permanent=kind is ErrorClass.PERMANENT,
                max_attempts=s.max_attempts,
                base=s.backoff_base,
                cap=s.backoff_cap,
                rand=random.random,
            )
            failure = Failure(cid, current.seq, 1, delay, describe_error(exc), dead)
            await queue.record_failures(conn, [failure])


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


def rebuildable(registry: Registry, name: str) -> Projector:
    """The projector to rebuild, or a ConfigError saying why it cannot be."""
    projector = registry.projectors.get(name)
    if projector is None:
        known = ", ".join(sorted(registry.projectors)) or "none"
        raise ConfigError(f"no projector named {name!r} (registered: {known})")
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


async def campaigns_to_rebuild(executor: Executor, campaign_id: str | None) -> list[str]:
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(Q.list_campaigns, campaign_id)
    return [r["campaign_id"] for r in rows]


async def rebuild_campaign(executor: Executor, projector: Projector, campaign_id: str) -> int:
    """Reset one campaign's projection and re-apply its journal in seq order, in one
    transaction that holds the campaign's queued rows and the projector's checkpoint, so a
    running worker neither interleaves nor applies twice (S19). Returns events applied."""
    reset = projector.reset
    if reset is None:
        raise ConfigError(f"projector {projector.name!r} has no reset hook")
    applied = 0
    async with db.acquire(executor) as conn, conn.transaction():
        await queue.lock_campaign_rows(conn, campaign_id)
        if projector.ordered:
            await conn.execute(Q.reset_checkpoint, campaign_id, projector.name)
        if projector.idempotent and not projector.ordered:
            await conn.execute(Q.delete_markers, campaign_id, projector.name)
        await reset(conn, campaign_id)
        head = 0
        types = sorted(projector.events)
        async for r in conn.cursor(Q.journal_for_rebuild, campaign_id, types, prefetch=500):
            head = r["last_seq"]
            if r["seq"] is None:
                continue
            event = decode_event(
                campaign_id,
                r["seq"],
                r["event_type"],
                r["payload"],
                r["metadata"],
                r["recorded_at"],
            )
            if projector.idempotent and not projector.ordered:
                await conn.fetchval(Q.reserve_marker, campaign_id, event.seq, projector.name)
            await projector.fn(conn, event)
            applied += 1
        if projector.ordered:
            await conn.execute(Q.set_checkpoint, campaign_id, projector.name, head)
    return applied


async def applied_events(
    conn: Connection, registry: Registry, events: Sequence[tuple[str, int, str]]
) -> set[tuple[str, int]]:
    """Which of `(campaign_id, seq, type)` count as applied: the type is declared ignored, or
    every projector subscribed to it applied the event (checkpoint at or past its seq, or its
    processed marker). Unguarded projectors cannot tell, so their events never count as applied;
    nor do types the app does not know (S8)."""
    if not events:
        return set()
    checkpoints = {
        (r["campaign_id"], r["projector"]): r["applied_seq"]
        for r in await conn.fetch(Q.checkpoints_of, sorted({e[0] for e in events}))
    }
    markers = {
        (r["campaign_id"], r["seq"], r["handler"])
        for r in await conn.fetch(Q.markers_of, [e[0] for e in events], [e[1] for e in events])
    }
    applied = set()
    for campaign_id, seq, event_type in events:
        subscribed = registry.subscribers(event_type)
        if not subscribed:
            if event_type in registry.ignored:
                applied.add((campaign_id, seq))
            continue
        if all(
            checkpoints.get((campaign_id, p.name), 0) >= seq
            if p.ordered
            else p.idempotent and (campaign_id, seq, p.name) in markers
            for p in subscribed
        ):
            applied.add((campaign_id, seq))
    return applied
