"""The `Outbox` app: settings, the projector registry, the failure policy, and the append.

Applications build one `Outbox`, register projectors with `@app.projector(...)` (or
`@app.statement(...)`, a per-event projector that is one SQL statement), and append
with `app.append(...)`. The worker (`outbox.worker`) and the operators' tools take the app.
Registrations live in `registry`, dispatch in `dispatch`, the exactly-once guards in
`guards`, inline apply in `inline`, rebuilds in `rebuild`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from outbox import db
from outbox.append.api import append
from outbox.config import Settings
from outbox.errors import ConfigError
from outbox.model import AppendResult, Event, StoredEvent
from outbox.projection.inline import append_inline
from outbox.projection.known import AbsentProjectors
from outbox.projection.pauses import PausedProjectors
from outbox.projection.registry import (
    DropFn,
    Projector,
    Promotion,
    Registry,
    ResetFn,
    Start,
    track_name,
)
from outbox.projection.sql_projectors import SqlFunctions, function_name
from outbox.projection.upcasting import Upcaster
from outbox.projection.versions import SupersededVersions
from outbox.queries import using_schema
from outbox.retry import FailurePolicy

__all__ = ["Outbox"]

F = TypeVar("F", bound=Callable[..., Awaitable[None]])
# A statement projector's function: an event -> the statement's arguments (None: skip it).
A = TypeVar("A", bound=Callable[[StoredEvent], Sequence[Any] | None])
# An upcaster: a payload of one version made into the next's.
U = TypeVar("U", bound=Callable[[Any], Any])


def _check_events(name: str, events: object) -> None:
    if isinstance(events, str):
        raise ConfigError(f"projector {name!r}: events must be a list of types, not a string")


class Outbox:
    """The app object: settings plus the projector registry.

    app = Outbox()

    @app.projector("roster", events=["character.joined"])
    async def roster(tx, event): ...
    """

    def __init__(
        self, settings: Settings | None = None, *, rand: Callable[[], float] | None = None
    ) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self.registry = Registry()
        # The jitter's random source for this app's failures (None: a fresh generator).
        self.rand = rand
        # Paused projectors as this process's appliers see them (outbox.projection.pauses),
        # the projectors the database knows that this code lacks (outbox.projection.known), and
        # the versions superseded by a promoted one (outbox.projection.versions).
        self.pauses = PausedProjectors(self.settings.poll_interval)
        self.absent = AbsentProjectors(self.settings.poll_interval)
        self.superseded = SupersededVersions(self.settings.poll_interval)

    async def in_force(self, conn: db.Connection) -> Registry:
        """The projectors this process runs now: the app's, less the versions superseded by a
        promoted one (S29) and those an operator redefined since it started (S33)."""
        registry = await self.superseded.registry(conn, self.registry)
        self.absent.group = self.settings.group  # settings may be replaced after construction
        return await self.absent.in_force(conn, registry)

    def projector(
        self,
        name: str,
        *,
        events: Sequence[str],
        ordered: bool | None = None,
        idempotent: bool = False,
        reset: ResetFn | None = None,
        batch: bool = False,
        transactional: bool = True,
        start: Start | None = None,
        version: int = 1,
        promote: Promotion = "manual",
        drop: DropFn | None = None,
        replay: bool = False,
    ) -> Callable[[F], F]:
        """Register a projector of `events` (a list of types) under `name`.

        - `name`: the projector's identity; its checkpoints and markers are keyed by it, so a
          rename starts it afresh (docs/idempotency.md, hazards).
        - `events`: the event types it receives; `fn(tx, event)` gets each as a StoredEvent
          (campaign_id, seq, type, payload, metadata, recorded_at; docs/projections.md).
        - `ordered` (default True): a checkpoint per campaign; duplicates are skipped,
          a gap is refused. `ordered=False, idempotent=True`: a processed marker per event.
          `ordered=False` alone: no guard (only the queue's transaction).
        - `batch=True`: `fn(tx, events)` is called once per claimed batch with the events it
          subscribes to that its guard lets through, in (campaign_id, seq) order; otherwise
          `fn(tx, event)` once per event. See docs/worker.md for the batch contract.
        - `reset(tx, campaign_id)`: clears one campaign's projection, for rebuilds.
        - `transactional=False`: for projectors that write outside the database or run long
          (lease mode). `fn(pool, event)` runs outside any queue transaction while a
          heartbeat extends the row's lease; delivery is at-least-once, so the projector must
          be idempotent towards its target (docs/worker.md, docs/idempotency.md). Per-campaign
          order still holds. It takes no guard: `ordered` defaults to False for it.
        - `start`: where it starts when first deployed (S25). `"beginning"` (the default of
          an ordered projector) catches up from the journal on its own, every campaign of it,
          dormant ones too, while the other projectors go on; an unordered projector may ask
          for it with `idempotent=True` (its markers keep the catch-up and its live rows from
          applying an event twice). `"now"` (the default of the others: a lease-mode
          projector's side effects are never replayed unasked, and an unordered one has no
          checkpoint to tell its history from an upgrade's) starts on each campaign at the
          first event the queue holds for it.
        - `version` (default 1): a later version is a new track of the same projector (S29),
          keyed `name@vN`, with checkpoints, markers, holds and pauses of its own; it catches
          up from the journal beside the live version, which goes on serving readers until
          the new one is promoted (`maintenance projector-promote`, or `promote="auto"`: the
          workers promote it once it is caught up). `outbox.live_version(conn, name)` says
          which version readers read; `outbox.running_projector()` tells a function
          registered for several versions which one it runs as.
        - `drop(tx)`: drops a version's read model when `maintenance projector-retire`
          retires it.
        - `replay=True` (lease mode only): `maintenance projections-rebuild` may give it its
          history again (S31), at least once, outside any transaction; without it, a lease
          projector's side effects are never replayed. `outbox.replaying()` is true meanwhile.
        """
        _check_events(name, events)

        def register(fn: F) -> F:
            self._declare(
                name, events, fn, ordered, idempotent, reset, batch, transactional, start,
                version, promote, drop, replay,
            )  # fmt: skip
            return fn

        return register

    def _declare(
        self,
        name: str,
        events: Sequence[str],
        fn: Callable[..., Awaitable[None]],
        ordered: bool | None,
        idempotent: bool,
        reset: ResetFn | None,
        batch: bool,
        transactional: bool,
        start: Start | None,
        version: int,
        promote: Promotion,
        drop: DropFn | None,
        replay: bool,
        sql: SqlFunctions | None = None,
    ) -> None:
        """A projector's registration, with what its arguments imply (its guard, where it
        starts, its track's key)."""
        _check_events(name, events)
        guarded = transactional if ordered is None else ordered
        begins: Start = start or ("beginning" if guarded and transactional else "now")
        key = track_name(name, version) if isinstance(version, int) else name
        self.registry.add(
            Projector(
                key, frozenset(events), fn, guarded, idempotent, reset, batch, transactional,
                begins, version, promote, drop, replay, sql,
            )
        )  # fmt: skip

    def statement(
        self,
        name: str,
        *,
        events: Sequence[str],
        sql: str,
        ordered: bool | None = None,
        idempotent: bool = False,
        reset: ResetFn | None = None,
        start: Start | None = None,
        version: int = 1,
        promote: Promotion = "manual",
        drop: DropFn | None = None,
    ) -> Callable[[A], A]:
        """Register a per-event projector that is one SQL statement per event: `fn(event)`
        returns the statement's arguments for that event (None: nothing to write for it),
        and the batch's statements are sent together, pipelined (asyncpg's `executemany`),
        instead of one round trip per event.

        @app.statement("totals", events=["deposited"], sql=UPSERT)
        def totals(event): return (event.campaign_id, event.payload["amount"])

        Guards, start and versions as `projector` (`ordered`, `idempotent`, `reset`, `start`,
        `version`, `promote`, `drop`). A failing
        statement fails the group without saying which event: the worker retries the halves
        until the event is alone (S6), as for a batch projector.
        """
        if not sql.strip():
            raise ConfigError(f"projector {name!r}: sql is empty")
        as_batch = self.projector(
            name,
            events=events,
            ordered=ordered,
            idempotent=idempotent,
            reset=reset,
            batch=True,
            start=start,
            version=version,
            promote=promote,
            drop=drop,
        )

        def register(fn: A) -> A:
            async def run(tx: db.Connection, batch: Sequence[StoredEvent]) -> None:
                rows = [args for event in batch if (args := fn(event)) is not None]
                if rows:
                    await tx.executemany(sql, rows)

            as_batch(run)
            return fn

        return register

    def sql_projector(
        self,
        name: str,
        *,
        events: Sequence[str],
        function: str,
        ordered: bool | None = None,
        idempotent: bool = False,
        reset: str | None = None,
        start: Start | None = None,
        version: int = 1,
        promote: Promotion = "manual",
        drop: str | None = None,
    ) -> None:
        """Register a projector that is a PostgreSQL function of yours, `function(events
        jsonb)` (`"app.apply_roster"`), called once per batch with the events it subscribes
        to that its guard lets through, as one JSON array of `{campaign_id, seq, type,
        payload, metadata, recorded_at}` in (campaign_id, seq) order, in the batch's
        transaction (docs/projections.md, "SQL projectors"). `reset` names its reset hook,
        a function `(campaign_id text)`; `drop` its drop hook, a function `()`. Guards, start
        and versions as `projector`; an event on which the function raises fails alone (S6).
        """
        functions = SqlFunctions(
            function_name(name, "function", function),
            None if reset is None else function_name(name, "reset", reset),
            None if drop is None else function_name(name, "drop", drop),
        )
        self._declare(
            name,
            events,
            functions.apply,
            ordered,
            idempotent,
            None if functions.reset is None else functions.reset_campaign,
            True,
            True,
            start,
            version,
            promote,
            None if functions.drop is None else functions.drop_model,
            False,
            functions,
        )

    def ignore(self, types: Sequence[str]) -> None:
        """Declare event types that need no projection: completed and counted as skipped."""
        self.registry.ignore(types)

    def upcaster(self, event_type: str, *, from_version: int) -> Callable[[U], U]:
        """Register `fn(payload) -> payload`, which turns `event_type`'s payload from
        `from_version` to the next version (docs/projections.md, "Events that evolve").
        Chains compose: every projector receives each event at the newest version the
        upcasters reach, on every path (live, inline, catch-up, builds, rebuilds, requeues,
        replays, lease mode), with `StoredEvent.version` saying which. A SQL projector of the
        type needs the same step as a SQL upcaster (`sql_upcaster`).

        @app.upcaster("clicked", from_version=1)
        def clicked_v2(payload): return {**payload, "source": payload.get("src", "web")}
        """

        def register(fn: U) -> U:
            self.registry.upcasters.add(Upcaster(event_type, from_version, fn=fn))
            return fn

        return register

    def sql_upcaster(self, event_type: str, *, from_version: int, function: str) -> None:
        """Register a SQL function (`schema.fn(jsonb) -> jsonb`) that turns `event_type`'s
        payload from `from_version` to the next, for SQL projectors: the server upcasts their
        events in the call. The worker refuses to start when the function is missing."""
        name = function_name(event_type, "an upcaster's function", function)
        self.registry.upcasters.add(Upcaster(event_type, from_version, function=name))

    def validate(self) -> None:
        self.registry.validate(self.settings)

    def failure_policy(self) -> FailurePolicy:
        """Attempts, backoff and death of a failed attempt, from this app's settings, with its
        random source (`rand`: tests inject a fixed one)."""
        return FailurePolicy.of(self.settings, self.rand)

    async def append(
        self,
        executor: Any,
        campaign_id: str,
        events: Sequence[Event],
        *,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
        raise_on_duplicate: bool = False,
        apply_inline: bool | None = None,
    ) -> AppendResult:
        """`outbox.append` (any driver it takes) with this app's settings, and the inline fast
        path (asyncpg only) when
        `apply_inline` (default: OUTBOX_INLINE_APPLY) and enqueueing are on (see
        `outbox.projection.inline`): the new events are applied inside the append's own
        transaction, or left to a worker when that cannot be done in order."""
        inline = self.settings.inline_apply if apply_inline is None else apply_inline
        leased = self.registry.leased_types()
        if leased and any(getattr(e, "type", None) in leased for e in events):
            inline = False
        if not (inline and self.settings.enabled):
            return await append(  # any driver `outbox.append` takes
                executor,
                campaign_id,
                events,
                expected_seq=expected_seq,
                idempotency_key=idempotency_key,
                raise_on_duplicate=raise_on_duplicate,
                settings=self.settings,
            )
        if not db.is_executor(executor):
            raise ConfigError(
                "inline apply runs the projectors on an asyncpg connection: pass an asyncpg pool "
                f"or connection, not {type(executor).__name__}, or turn OUTBOX_INLINE_APPLY off "
                "(a worker applies the events)"
            )
        with using_schema(self.settings.schema):
            return await append_inline(
                executor,
                campaign_id,
                events,
                registry=self.registry,
                settings=self.settings,
                policy=self.failure_policy(),
                pauses=self.pauses,
                superseded=self.superseded,
                expected_seq=expected_seq,
                idempotency_key=idempotency_key,
                raise_on_duplicate=raise_on_duplicate,
            )
