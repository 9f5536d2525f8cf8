"""What keeps the queue's dead row versions alive: the oldest snapshot the server holds for this
database (`horizon_holder`), named for the report and the console (docs/operations.md, "A
snapshot held elsewhere"). A read of the server's views; nothing here writes or waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import db
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Executor

__all__ = ["HorizonHolder", "horizon_holder"]


class HorizonQueries(Queries):
    get_horizon_holder: str


Q = HorizonQueries


@dataclass(frozen=True, slots=True)
class HorizonHolder:
    """The oldest snapshot vacuum must respect: what holds it (`kind`: session, replication
    slot or prepared transaction), its `pid` (None for a slot not in use or a prepared
    transaction), `name` (application_name, slot name or gid), `state`, its age in transactions
    and the seconds it has been held (None where the server does not say)."""

    kind: str
    pid: int | None
    name: str
    state: str | None
    xmin_age: int
    held_seconds: float | None

    @property
    def described(self) -> str:
        """The holder in one phrase, as the report and the console print it (each adds how
        long it has been held in its own units): `session nightly-dump (pid 42), idle in
        transaction, 3 transactions old`."""
        who = f" (pid {self.pid})" if self.pid is not None else ""
        return (
            f"{self.kind} {self.name or '(no application_name)'}{who}, "
            f"{self.state or 'state not shown'}, {self.xmin_age:,} transactions old"
        )


async def horizon_holder(executor: Executor) -> HorizonHolder | None:
    """The oldest snapshot holder, or None when no other session, slot or prepared transaction
    holds one."""
    async with db.acquire(executor) as conn:
        row = await conn.fetchrow(Q.get_horizon_holder)
    if row is None:
        return None
    return HorizonHolder(
        row["kind"], row["pid"], row["name"] or "", row["state"], row["xmin_age"],
        row["held_seconds"],
    )  # fmt: skip
