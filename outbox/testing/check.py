"""A projector checked for what the outbox's guarantees assume of it, before it ships.

Exactly once, order per campaign, rebuilds, versions and catch-ups hold only for a projector
whose read model depends on its events alone: not on how the worker batched them, not on a
retry of a transaction it already ran once, not on the clock, and whose reset hook clears all
it wrote. The usual bugs break exactly that and pass unit tests: a batch projector that takes
`events.seqs[-1]` as every campaign's last seq, a reset hook that forgets a table, a `now()` in
the read model, a cache outside the transaction.

`check_projector` runs one projector of an app over the same events in several ways, on an
outbox installed for the check in a schema of its own (removed after), and compares the read
model each leaves with the one that one event per batch leaves:

- all the events in one batch;
- random batchings (seeded): appends arriving in chunks, batches of random sizes between;
- a failure injected after its statements in a batch, the batch retried (a transient error:
  the transaction rolled back, then claimed again);
- a rebuild in place through its reset hook, after the events applied (with a reset hook);
- a catch-up as a new projector, deployed after the events were appended (a guarded one).

The first scenario whose read model differs raises `ProjectorCheckFailed` with both sides.
`projector_scenario` is the given/when/then form for plain tests. docs/projections.md,
"Checking a projector", shows both on the three classic bugs.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from outbox import db
from outbox.append.api import append
from outbox.config import Settings
from outbox.errors import ConfigError, TransientBatchError
from outbox.model import Event
from outbox.projection.app import Outbox
from outbox.projection.build import build
from outbox.projection.known import record
from outbox.projection.rebuild import rebuild
from outbox.projection.registry import Projector
from outbox.queries import using_schema
from outbox.schema import migrate
from outbox.worker.batch import Worker

__all__ = [
    "CheckRun",
    "ProjectorCheckFailed",
    "ProjectorScenario",
    "check_projector",
    "projector_scenario",
]

T = TypeVar("T")
Setup = Callable[[db.Connection], Awaitable[None]]
Read = Callable[[db.Connection], Awaitable[T]]
# The scenario every other is compared with.
REFERENCE = "one event per batch"
# The check's failure after a projector's statements, raised by the server: a serialization
# failure is transient, so the batch is rolled back and claimed again, no attempt charged.
_INJECTED = """
DO $$ BEGIN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = 'injected by check_projector after the projector''s statements';
END $$
"""
# Tables of the check's install a scenario keeps: what the migrate recorded.
_KEPT = ("outbox_schema_migrations", "outbox_schema_definitions")
_TABLES = """
SELECT format('%I.%I', n.nspname, c.relname)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname <> ALL ($2::text[])
"""


class ProjectorCheckFailed(AssertionError):
    """A scenario left a read model that differs from one event per batch's."""

    def __init__(self, projector: str, scenario: str, expected: object, got: object) -> None:
        self.projector, self.scenario, self.expected, self.got = projector, scenario, expected, got
        super().__init__(
            f"projector {projector!r}: {scenario} left a read model that differs from "
            f"{REFERENCE}'s\n  {REFERENCE}: {expected!r}\n  {scenario}: {got!r}"
        )


@dataclass(frozen=True, slots=True)
class CheckRun:
    """What `check_projector` ran: each scenario in order (the reference first), those it
    could not run and why, and the reference's read model."""

    projector: str
    scenarios: list[str]
    skipped: dict[str, str]
    read_model: object


@dataclass
class _Install:
    """The outbox installed for a check: a schema of its own on `dsn`."""

    pool: db.Pool
    schema: str
    projector: Projector
    types: frozenset[str]

    def app(self, batch_size: int, projector: Projector | None = None) -> Outbox:
        """An app running the projector alone (or `projector`, a variant of it), the other
        types of the events ignored."""
        settings = Settings(schema=self.schema, batch_size=max(1, min(batch_size, 10_000)))
        app = Outbox(settings)
        chosen = projector or self.projector
        app.registry.add(chosen)
        app.registry.ignore(self.types - chosen.events)
        return app

    async def fresh(self, setup: Setup) -> None:
        """Every table of the install emptied, then the read model's (`setup`)."""
        tables = [r[0] for r in await self.pool.fetch(_TABLES, self.schema, list(_KEPT))]
        async with self.pool.acquire() as conn:
            await conn.execute(f"TRUNCATE {', '.join(tables)}")
            await setup(conn)

    async def append(self, events: Sequence[tuple[str, Event]]) -> None:
        settings = Settings(schema=self.schema)
        for campaign_id, event in events:
            await append(self.pool, campaign_id, [event], settings=settings)

    async def drain(self, app: Outbox) -> None:
        """Batches until nothing is due (and a catch-up by the engine to its end, S25); a
        transient failure (the check's own) tried again."""
        with using_schema(self.schema):
            await record(self.pool, app.registry, "check")
            worker = Worker(app, self.pool)
            while True:
                try:
                    await worker.drain()
                except TransientBatchError:
                    continue
                return

    def bystander(self) -> Outbox:
        """An app that runs no projector: it completes the events (the history a projector
        deployed later finds in the journal alone)."""
        app = Outbox(Settings(schema=self.schema, batch_size=1000))
        app.registry.ignore(self.types)
        return app

    async def read(self, read: Read[T]) -> T:
        async with self.pool.acquire() as conn:
            return await read(conn)


@asynccontextmanager
async def _installed(
    dsn: str, projector: Projector, types: frozenset[str]
) -> AsyncIterator[_Install]:
    schema = f"outbox_check_{uuid.uuid4().hex[:12]}"
    pool = await db.create_pool(dsn, min_size=1, max_size=4)
    try:
        with using_schema(schema):
            async with pool.acquire() as conn:
                await migrate(conn, schema=schema, buckets=4)
            try:
                yield _Install(pool, schema, projector, types)
            finally:
                await pool.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await pool.close()


def _chosen(app: Outbox, name: str) -> Projector:
    projector = app.registry.projectors.get(name)
    if projector is None:
        known = ", ".join(sorted(app.registry.projectors)) or "none"
        raise ConfigError(f"the app registers no projector {name!r} (it registers: {known})")
    if not projector.transactional:
        raise ConfigError(
            f"projector {name!r} runs in lease mode: its effects are outside the database, "
            "where the check cannot read them"
        )
    return projector


def _failing_once(projector: Projector) -> Projector:
    """The projector, failing transiently after its statements in its first call."""
    calls = 0

    async def fn(tx: db.Connection, events: Any) -> None:
        nonlocal calls
        await projector.fn(tx, events)
        calls += 1
        if calls == 1:
            await tx.execute(_INJECTED)

    return dataclasses.replace(projector, fn=fn)


async def check_projector(
    app: Outbox,
    name: str,
    events: Sequence[tuple[str, Event]],
    *,
    setup: Setup,
    read: Read[Any],
    dsn: str,
    seed: int = 0,
    batchings: int = 3,
) -> CheckRun:
    """Run projector `name` of `app` over `events` ((campaign_id, Event), appended in that
    order) in every scenario of the module docstring, on an outbox installed on `dsn` in a
    schema of its own and removed after. `setup(conn)` makes the read model's tables empty
    (before each scenario); `read(conn)` returns the read model as a comparable value.
    Raises ProjectorCheckFailed naming the first scenario whose read model differs from one
    event per batch's; returns what it ran."""
    projector = _chosen(app, name)
    types = frozenset(e.type for _, e in events) | projector.events
    rng = random.Random(seed)  # noqa: S311 (batchings to try, not secrets)
    ran: list[str] = []
    skipped: dict[str, str] = {}
    async with _installed(dsn, projector, types) as install:

        async def scenario(title: str, run: Callable[[], Awaitable[None]]) -> object:
            await install.fresh(setup)
            await run()
            ran.append(title)
            return await install.read(read)

        async def one_by_one() -> None:
            await install.append(events)
            await install.drain(install.app(1))

        reference = await scenario(REFERENCE, one_by_one)

        async def compare(title: str, run: Callable[[], Awaitable[None]]) -> None:
            got = await scenario(title, run)
            if got != reference:
                raise ProjectorCheckFailed(name, title, reference, got)

        async def all_at_once() -> None:
            await install.append(events)
            await install.drain(install.app(len(events)))

        await compare("all in one batch", all_at_once)
        for i in range(batchings):
            chunks = _chunks(events, rng)
            plan = [(chunk, rng.randint(1, max(1, len(events)))) for chunk in chunks]

            async def batched(plan: list[tuple[list[tuple[str, Event]], int]] = plan) -> None:
                for chunk, size in plan:
                    await install.append(chunk)
                    await install.drain(install.app(size))

            await compare(f"random batching {i + 1} (seed {seed})", batched)

        async def retried() -> None:
            await install.append(events)
            await install.drain(install.app(len(events), _failing_once(projector)))

        await compare("a failure after its statements, retried", retried)
        if projector.reset is None:
            skipped["rebuilt through its reset hook"] = "it has no reset hook"
        else:

            async def rebuilt() -> None:
                await one_by_one()
                with using_schema(install.schema):
                    if projector.ordered:
                        await build(install.pool, projector, in_place=True)
                    else:
                        registry = install.app(1).registry
                        await rebuild(install.pool, registry, projectors=[name], apply=True)

            await compare("rebuilt through its reset hook", rebuilt)
        if not (projector.ordered or projector.idempotent):
            skipped["caught up as a new projector"] = (
                "it has no guard (ordered, or idempotent markers) to catch up under"
            )
        else:
            late = dataclasses.replace(projector, start="beginning")

            async def caught_up() -> None:
                await install.append(events)
                await install.drain(install.bystander())  # the history, applied elsewhere
                await install.drain(install.app(len(events), late))

            await compare("caught up as a new projector", caught_up)
    return CheckRun(name, ran, skipped, reference)


def _chunks(
    events: Sequence[tuple[str, Event]], rng: random.Random
) -> list[list[tuple[str, Event]]]:
    """`events` in order, cut at random places into 1 to 5 chunks."""
    if not events:
        return [[]]
    cuts = sorted(rng.sample(range(1, len(events)), min(len(events) - 1, rng.randint(0, 4))))
    bounds = [0, *cuts, len(events)]
    return [list(events[a:b]) for a, b in itertools.pairwise(bounds)]


@dataclass
class ProjectorScenario(Generic[T]):
    """Given events applied, when more are applied, then the read model (`projector_scenario`)."""

    install: _Install
    app: Outbox

    async def given(self, *events: tuple[str, Event]) -> None:
        """History: appended and applied."""
        await self.install.append(events)
        await self.install.drain(self.app)

    async def when(self, *events: tuple[str, Event]) -> None:
        """What happens now: appended and applied, as history was."""
        await self.given(*events)

    async def then(self, read: Read[T]) -> T:
        """The read model, for the test to assert on."""
        return await self.install.read(read)


@asynccontextmanager
async def projector_scenario(
    app: Outbox, name: str, *, setup: Setup, dsn: str
) -> AsyncIterator[ProjectorScenario[Any]]:
    """Projector `name` of `app` alone on an outbox installed on `dsn` for the test (a schema
    of its own, removed after), its read model made empty by `setup`:

        async with projector_scenario(app, "totals", setup=setup, dsn=dsn) as s:
            await s.given(("c1", Event("added", {"n": 2})))
            await s.when(("c1", Event("added", {"n": 3})))
            assert await s.then(read_totals) == {"c1": 5}
    """
    projector = _chosen(app, name)
    async with _installed(dsn, projector, projector.events) as install:
        await install.fresh(setup)
        yield ProjectorScenario(install, install.app(100))
