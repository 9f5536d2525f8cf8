"""SQL projectors: a projector that is a PostgreSQL function of the application's.

`app.sql_projector("roster", events=[...], function="app.apply_roster")` (or a projectors
file, `projectors_file`) registers a batch projector whose every call is one statement: the
server function `outbox_run_sql_projector` reads the batch's events from the journal by key
and calls `app.apply_roster(events jsonb)` with them as one JSON array of `{campaign_id, seq,
type, payload, metadata, recorded_at}` in (campaign_id, seq) order, in the batch's own
transaction. So everything a Python batch projector has, it has: the guards (checkpoints or
markers), its own track (S24), the halving that fails a raising event alone (S6), pause,
catch-up, versions, builds and rebuilds. Its reset hook is a function `fn(campaign_id text)`,
its drop hook a function `fn()`.

A function is named `name` or `schema.name` (plain identifiers: PostgreSQL folds them to lower
case); a name without its schema is found through the worker session's search_path. The
function itself runs with the outbox's path (`outbox, pg_temp`), so it names its tables with
their schema or sets its own path. `check_functions` refuses, in one line, a function the
database does not have.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox.errors import ConfigError
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection, Executor
    from outbox.model import EventBatch

__all__ = ["SqlFunctions", "check_functions", "function_name"]

# `name` or `schema.name`, each a plain SQL identifier.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?")


class SqlProjectorQueries(Queries):
    apply_sql_projector: str
    apply_sql_hook: str
    list_missing_functions: str


Q = SqlProjectorQueries


def function_name(projector: str, role: str, value: object) -> str:
    """`value` as a function's name (`schema.name` or `name`), lower-cased as PostgreSQL reads
    a plain identifier; a ConfigError naming the projector and the role otherwise."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ConfigError(
            f"projector {projector!r}: {role} must name a function as schema.name or name "
            f"(plain identifiers), got {value!r}"
        )
    return value.lower()


@dataclass(frozen=True)
class SqlFunctions:
    """A SQL projector's functions: the projector's own, and its reset and drop hooks."""

    function: str
    reset: str | None = None
    drop: str | None = None

    @property
    def signatures(self) -> list[str]:
        """Each function with the arguments it is called with, as `to_regprocedure` reads it."""
        found = [f"{self.function}(jsonb)"]
        if self.reset is not None:
            found.append(f"{self.reset}(text)")
        if self.drop is not None:
            found.append(f"{self.drop}()")
        return found

    async def apply(
        self,
        conn: Connection,
        batch: EventBatch,
        upcasters: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """The projector's function on `batch` (the events its guard let through), each
        event upcast by the server through `upcasters` ({type: {from version: function}})."""
        await conn.execute(
            Q.apply_sql_projector,
            f"{self.function}(jsonb)",
            batch.campaign_ids,
            batch.seqs,
            upcasters or None,
        )

    async def reset_campaign(self, conn: Connection, campaign_id: str) -> None:
        assert self.reset is not None  # registered only with a reset function
        await conn.execute(Q.apply_sql_hook, f"{self.reset}(text)", campaign_id)

    async def drop_model(self, conn: Connection) -> None:
        assert self.drop is not None  # registered only with a drop function
        await conn.execute(Q.apply_sql_hook, f"{self.drop}()", None)


async def check_functions(executor: Executor, wanted: Mapping[str, str]) -> None:
    """Refuse (ConfigError, one line) functions the database lacks, before any work is
    claimed: `wanted` maps each signature (`schema.fn(jsonb)`) to the projector calling it
    (`Registry.sql_signatures`)."""
    if not wanted:
        return
    missing: Sequence[str] = [
        r["signature"] for r in await executor.fetch(Q.list_missing_functions, list(wanted))
    ]
    if missing:
        shown = ", ".join(f"{s} (projector {wanted[s]!r})" for s in missing)
        raise ConfigError(f"no such function in the database: {shown}")
