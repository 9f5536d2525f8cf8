"""A batch of SQL projectors in one call: claim, the projectors' functions and the settle,
server-side (`outbox_apply_sql_batch`), one round trip per batch in autocommit.

A worker whose projectors in force are all SQL projectors (S32) tries each batch this way first,
while none of them is paused and the database knows no projector its code lacks (a rolling
deploy leaves that one's share in holds, which only the worker's own path writes). The
function takes the common batch alone and undoes everything else, whatever the reason: the
worker then runs that batch its own way (`Worker._batch`), which isolates a failing event and
records its failure, so the guarantees are the worker's (S6, S17, S24) and only the round
trips differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from outbox.model import BatchCounts
from outbox.obs import log
from outbox.queries import Queries
from outbox.queue.settle import applied_channel

if TYPE_CHECKING:
    from outbox.db import Connection, Record
    from outbox.projection.registry import Registry

__all__ = ["OneCall", "Result"]


class SqlBatchQueries(Queries):
    apply_sql_batch: str
    apply_sql_holds: str


Q = SqlBatchQueries
_logger = log.get_logger("outbox.worker")


@dataclass(frozen=True, slots=True)
class Result:
    """A batch the function took: its counts, how deep its campaigns were, the projectors'
    events, and the seconds its rows waited."""

    counts: BatchCounts
    campaigns: int
    depth_rows: int
    per_projector: dict[str, int]
    ages: list[float]


@dataclass(frozen=True, slots=True)
class OneCall:
    """The plan of a registry whose projectors can all run in the one call."""

    registry: Registry
    projectors: tuple[dict[str, Any], ...]
    ignored: tuple[str, ...]

    @classmethod
    def of(cls, registry: Registry) -> OneCall | None:
        """The plan, or None when some projector cannot run in the one call."""
        projectors = list(registry.projectors.values())
        if not projectors:
            return None
        for p in projectors:
            if p.sql is None or not p.transactional:
                return None
        return cls(
            registry,
            tuple(
                {
                    "name": p.name,
                    "function": f"{p.sql.function}(jsonb)",
                    "types": sorted(p.events),
                    "ordered": p.ordered,
                    "markers": not p.ordered and p.idempotent,
                    "start": p.start,
                    "upcasters": registry.upcasters.sql_chains(p.events) or None,
                }
                for p in sorted(projectors, key=lambda p: p.name)
                if p.sql is not None
            ),
            tuple(sorted(registry.ignored)),
        )

    def plan(self, now: datetime | None, take: str, group: str | None = None) -> str:
        """The function's `p_plan` (JSON): the projectors, the types ignored, the projectors
        the batch knows, the instant, the claim's take, the applied channel and the worker
        group (S35)."""
        plan = {
            "projectors": self.projectors,
            "ignored": self.ignored,
            "known": sorted(self.registry.projectors),
            "now": now,
            "take": take,
            "channel": applied_channel(),
            "group": group,
        }
        return orjson.dumps(plan).decode()

    async def run(
        self,
        conn: Connection,
        *,
        bucket: int,
        campaigns: int,
        budget: int,
        now: datetime | None,
        take: str,
    ) -> Result | None:
        """One batch in `bucket` (autocommit: `conn` in no transaction), or None when the
        function left it to the worker's own path (nothing of it written)."""
        row = await conn.fetchrow(
            Q.apply_sql_batch, bucket, campaigns, budget, self.plan(now, take)
        )
        return _result(row)

    async def run_holds(
        self, conn: Connection, *, group: str, limit: int, budget: int, now: datetime | None
    ) -> Result | None:
        """A worker group's batch (S35): up to `limit` due holds per projector, at most
        `budget` journal events each, in one call (autocommit); None when the function left
        it to the worker's own path (nothing of it written)."""
        plan = self.plan(now, "holds", group)
        return _result(await conn.fetchrow(Q.apply_sql_holds, limit, budget, plan))


def _result(row: Record | None) -> Result | None:
    """What the one call did: a Result, or None when it left the batch to the worker."""
    if row is None or not row["handled"]:
        _logger.debug("batch.one_call_declined", extra={"reason": row and row["reason"]})
        return None
    counts = BatchCounts(
        claimed=row["claimed"],
        applied=row["applied"],
        skipped=row["skipped"],
        more_due=row["due"],
    )
    return Result(
        counts,
        row["campaigns"],
        row["depth_rows"],
        orjson.loads(row["per_projector"]),
        list(row["ages"] or ()),
    )
