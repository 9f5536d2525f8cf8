"""Which live workers run each recorded projector (S33): what the report, the console and
`maintenance health` say of a projector no live worker runs, or that a live worker runs under
another definition than the recorded one.

Each apply worker registers the projectors it runs with their fingerprints, and drops from that
list, at its next heartbeat, a projector an operator redefined since it started. A worker of a
release before definitions registers none: what it runs is unknown, and a projector is then
never said to have no worker. No I/O happens here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from outbox.projection.known import KnownProjector
    from outbox.worker.registration import ListedWorker

__all__ = ["ProjectorService", "served"]


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

    @property
    def unserved(self) -> bool:
        """No live worker is known to run it."""
        return self.workers == 0 and self.unknown_workers == 0

    def problems(self) -> list[str]:
        """What an operator should look at, one line each (empty: nothing)."""
        found = []
        if self.unserved:
            found.append(
                f"projector {self.projector!r}: no live worker runs it (recorded definition "
                f"{self.fingerprint or 'not recorded'}); start a worker with it, or retire it"
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
        found.append(ProjectorService(k.projector, k.fingerprint, k.paused, same, unknown, other))
    return found
