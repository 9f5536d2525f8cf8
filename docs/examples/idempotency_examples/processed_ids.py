"""Processed event ids: the outbox's processed markers (`ordered=False, idempotent=True`).

An unordered projector that adds deposits opts into a marker per event: before it runs, the
worker reserves `(projector, campaign_id, seq)` in the projection's own transaction, and a
reservation that already exists skips the projector. A concurrent second application waits
for the first transaction and then skips. The markers are pruned after
`maintenance cleanup --markers-retention-hours` (168 by default): a duplicate older than that
is not caught (docs/idempotency.md, "track processed event ids").

Here a delivery is one application of the journaled event
(`outbox.projection.dispatch.apply_event`), as the worker, a replay or a repeated rebuild would
run it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency_examples import DEPOSITED, Message, Strategy, deposit_totals, rows
from outbox.db import Connection
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.dispatch import apply_event

app = Outbox()


@app.projector("ex_deposit_totals", events=[DEPOSITED], ordered=False, idempotent=True)
async def add_deposit(tx: Connection, event: StoredEvent) -> None:
    await tx.execute(
        "INSERT INTO ex_deposit_totals AS t VALUES ($1, 1, $2) ON CONFLICT (account) "
        "DO UPDATE SET deposits = t.deposits + 1, total = t.total + excluded.total",
        event.campaign_id,
        event.payload["amount"],
    )


app.ignore(["account.opened", "email.changed", "account.frozen", "account.unfrozen"])


class ProcessedIds(Strategy):
    name = "processed_ids"
    tables = ("ex_deposit_totals",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_deposit_totals (
        account text PRIMARY KEY, deposits integer NOT NULL, total bigint NOT NULL
    );
    """

    @staticmethod
    async def handle(tx: Connection, m: Message) -> None:
        """One application of the journaled event, as the worker or a replay runs it."""
        await apply_event(tx, app.registry, m.stored())

    async def read_model(self, conn: Connection) -> Any:
        return rows(await conn.fetch("SELECT account, deposits, total FROM ex_deposit_totals"))

    def expected(self, stream: Sequence[Message]) -> Any:
        return deposit_totals(stream)


strategy = ProcessedIds()
