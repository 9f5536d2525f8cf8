"""A worker's catch-ups by the engine (S25, S30): an ordered projector that starts at the
beginning is brought to the journal's heads by the catch-up engine (`projection.build`), run
by the workers themselves, not by catch-up holds through their batches.

Each applying worker that runs such a projector, not yet caught up (its record's sweep not
done), tries to build it: the engine's lock on the whole build lets one worker at a time walk
it, the others find it held (`Conflict`) and look again every `RETRY` seconds, and take it
over (resumed from the checkpoints and the record) when its builder is gone. The engine yields
to the live path by itself (`LivePace`) and runs on a small pool of its own, so the claim loops
keep their connections. A build that walked every bucket marks the projector's sweep done;
a campaign it left where its checkpoint stands (a failing event) has a catch-up hold, which
the workers' batches take on (S24). A service runs this beside its claim loops; a drain too,
and waits for its end before it takes what it left and returns.

It owns when and where a worker runs the engine; the engine owns the walk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import monotonic
from typing import TYPE_CHECKING

import anyio

from outbox import db
from outbox.errors import Conflict
from outbox.obs import log
from outbox.projection.build import build
from outbox.projection.builds import Built
from outbox.queries import Queries
from outbox.retry import describe_error, leaves
from outbox.worker.groups import wait_older_appends
from outbox.worker.pools import open_pool

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from outbox.config.settings import Settings
    from outbox.projection.registry import Projector, Registry

__all__ = ["POOL_SIZE", "RETRY", "CatchUps"]

_logger = log.get_logger("outbox.worker")

# Seconds between looks at a catch-up another worker builds (or that failed here).
RETRY = 2.0
# The engine's own connections: its walker, and the two that hold and count the build.
POOL_SIZE = 3


class CatchUpQueries(Queries):
    list_unswept: str
    complete_sweep: str


Q = CatchUpQueries


@dataclass
class CatchUps:
    """The ordered projectors of a worker's app that start at the beginning, and those of them
    it knows to be caught up (`done`)."""

    settings: Settings
    projectors: dict[str, Projector]
    done: set[str] = field(default_factory=set)
    # The end of the run `launch` started (a drain waits for it); None: none started.
    _ended: anyio.Event | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, registry: Registry, settings: Settings, *, applies: bool) -> CatchUps:
        """The catch-ups of `registry` for a worker that `applies` with background work (a
        shadow worker, or one whose background share is `never`, builds none)."""
        mine = {
            p.name: p
            for p in registry.projectors.values()
            if p.sweeps and p.ordered and p.transactional
        }
        if not applies or settings.background == "never":
            mine = {}
        return cls(settings, mine)

    @property
    def pending(self) -> bool:
        return len(self.done) < len(self.projectors)

    @property
    def running(self) -> bool:
        """Whether the run `launch` started is under way."""
        return self._ended is not None and not self._ended.is_set()

    async def unswept(self, executor: db.Executor) -> list[Projector]:
        """Those to catch up now, as the record says: not caught up, not superseded (S29),
        not paused (a paused one waits for its resume)."""
        async with db.acquire(executor) as conn:
            rows = await conn.fetch(Q.list_unswept, sorted(self.projectors))
        self.done = set(self.projectors) - {r["projector"] for r in rows}
        return [self.projectors[r["projector"]] for r in rows if not r["paused"]]

    def launch(self, tasks: TaskGroup, pool: db.Pool, *, until_done: bool) -> None:
        """Run the catch-ups in `tasks` (`running` from now on)."""
        ended = self._ended = anyio.Event()

        async def run() -> None:
            try:
                await self.run(pool, until_done=until_done)
            finally:
                ended.set()

        tasks.start_soon(run)

    async def wait(self) -> None:
        """Until the run under way ends."""
        if self._ended is not None:
            await self._ended.wait()

    async def run(self, pool: db.Pool, *, until_done: bool) -> None:
        """Build each projector still to catch up, until none is left (a paused one is waited
        for; a drain, `until_done`, waits for none). A build another worker runs is looked at
        again every `RETRY` seconds; a failed one is logged and tried again, or, `until_done`,
        raised."""
        while True:
            todo = await self.unswept(pool)
            if not self.pending or (until_done and not todo):
                return
            for projector in todo:
                await self.one(projector, pool, until_done=until_done)
            if self.pending:
                await anyio.sleep(RETRY)

    async def one(self, projector: Projector, pool: db.Pool, *, until_done: bool) -> None:
        """One try at `projector`'s catch-up (logged when it completes)."""
        name = projector.name
        started = monotonic()
        try:
            built = await self.watched(projector, pool)
        except Conflict:
            return  # another worker builds it (or an in-place rebuild must end first)
        except Exception as exc:  # logged and tried again: the claim loops go on meanwhile
            if until_done:
                raise
            _logger.warning(
                "catch_up.failed",
                extra={"projector": name, "error": describe_error(exc), "retry_in": RETRY},
            )
            return
        if built is None or not built.complete:
            return
        async with db.acquire(pool) as conn:
            await conn.execute(Q.complete_sweep, name)
        self.done.add(name)
        got = built.progress
        _logger.info(
            "catch_up.done",
            extra={
                "projector": name,
                "events": got.events,
                "campaigns": got.campaigns,
                "skipped": got.skipped,
                "failed": got.failed,
                "seconds": round(monotonic() - started, 3),
            },
        )

    async def watched(self, projector: Projector, pool: db.Pool) -> Built | None:
        """The engine's catch-up of `projector`, on a pool of its own (the worker's `pool` when
        the settings name no server), leaving campaigns with work rows to the claim; stopped
        (None) once the record no longer owes it one: paused by an operator, superseded, or
        caught up by another worker, looked at every `RETRY` seconds."""
        owner = await open_pool(self.settings, max_size=POOL_SIZE) if self.settings.dsn else None
        built: Built | None = None
        try:
            async with anyio.create_task_group() as tasks:

                async def watch() -> None:  # the record, polled: no event says it changed
                    while True:
                        await anyio.sleep(RETRY)
                        if projector not in await self.unswept(pool):
                            tasks.cancel_scope.cancel()
                            return

                tasks.start_soon(watch)
                # A worker group's projector (S35) is owed nothing by the claim of work rows:
                # the engine walks every campaign for it.
                queued = not self.settings.grouped
                if not queued:
                    await wait_older_appends(owner or pool)
                built = await build(owner or pool, projector, leave_queued=queued)
                tasks.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the build's failure, as it was raised
            raise leaves(group)[0] from None
        finally:
            if owner is not None:
                with anyio.CancelScope(shield=True):
                    await owner.close()
        return built
