"""Which live workers run each recorded projector (S33): what the report, the console and
`maintenance health` say of a projector no live worker runs, or that a live worker runs under
another definition than the recorded one.

Each apply worker registers the projectors it runs with their fingerprints, and drops from that
list, at its next heartbeat, a projector an operator redefined since it started. A worker of a
release before definitions registers none: what it runs is unknown, and a projector is then
never said to have no worker. `served` does no I/O; `unserved_projectors` reads the record,
the workers and whether each projector is owed work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from outbox import db
from outbox.projection.known import list_known
from outbox.queue.holds import projector_owed
from outbox.worker.registration import listed_workers

if TYPE_CHECKING:
    from collections.abc import Sequence

    from outbox.db import Executor
    from outbox.projection.known import KnownProjector
    from outbox.worker.registration import ListedWorker

__all__ = ["ProjectorService", "served", "unserved_projectors"]


@dataclass(frozen=True, slots=True)
class ProjectorService:
    """A recorded projector (not superseded) and the live apply workers that run it: `workers`
    run its recorded definition (`fingerprint`); `other_definitions` lists each live worker
    that runs it under another (`worker_id fingerprint`); `unknown_workers` are live workers of
    an earlier release, whose projectors are not registered."""

    projector: str
    fingerprint: str | None
    paused: bool
    workers: int
    unknown_workers: int
    other_definitions: list[str] = field(default_factory=list)
    group: str = "default"  # the worker group that serves it (S35)

    @property
    def unserved(self) -> bool:
        """No live worker is known to run it."""
        return self.workers == 0 and self.unknown_workers == 0

    def problems(self) -> list[str]:
        """What an operator should look at, one line each (empty: nothing)."""
        found = []
        if self.unserved:
            grouped = "" if self.group == "default" else f" --group {self.group}"
            found.append(
                f"projector {self.projector!r}: no live worker runs it (recorded definition "
                f"{self.fingerprint or 'not recorded'}); start a worker with it{grouped}, or "
                "retire it"
            )
        if self.other_definitions:
            found.append(
                f"projector {self.projector!r}: live worker(s) run another definition than "
                f"the recorded {self.fingerprint}: {', '.join(self.other_definitions)}"
            )
        return found


def served(
    known: Sequence[KnownProjector], workers: Sequence[ListedWorker]
) -> list[ProjectorService]:
    """Each recorded projector that is owed work (superseded versions aside) with the live
    apply workers that run it, by name."""
    live = [w for w in workers if w.live and w.mode == "apply"]
    unknown = sum(1 for w in live if w.projectors is None)
    found = []
    for k in known:
        if k.state == "superseded":
            continue
        running = [
            (w.worker_id, w.projectors[k.projector])
            for w in live
            if w.projectors and k.projector in w.projectors
        ]
        same = sum(1 for _, f in running if k.fingerprint is None or f == k.fingerprint)
        other = [f"{w} {f}" for w, f in running if k.fingerprint is not None and f != k.fingerprint]
        found.append(
            ProjectorService(k.projector, k.fingerprint, k.paused, same, unknown, other, k.group)
        )
    return found


async def unserved_projectors(
    executor: Executor, reasons: list[str], projector: str | None = None
) -> list[str]:
    """The projectors owed work (a hold, a work row of their types) that no live worker runs,
    or that one runs under another definition than the recorded one, each with its reason
    added to `reasons`; an idle store, or a projector paused, raises no alarm. `projector`:
    that one alone is judged (the others are not its health)."""
    found: list[str] = []
    async with db.acquire(executor) as conn:
        known = {k.projector: k for k in await list_known(conn)}
        for service in served(list(known.values()), await listed_workers(conn)):
            problems = service.problems()
            if not problems or service.paused or projector not in (None, service.projector):
                continue
            if not await projector_owed(conn, service.projector, known[service.projector].events):
                continue
            found.append(service.projector)
            reasons.extend(problems)
    return found
