"""Stream position: the outbox's per-campaign checkpoint (`ordered=True`, the default).

An ordered projector keeps `applied_seq` per campaign in the projection's own transaction:
seq = applied_seq + 1 applies, anything at or below it is a duplicate and skipped, anything
beyond is a gap and fails. One integer per campaign catches every duplicate for ever, and
the order is part of the guarantee; the price is that events of a campaign apply one after
another (docs/idempotency.md, "use event sequence numbers"). Renaming the projector starts a new
checkpoint at 0: the rename re-applies the whole journal (docs/idempotency.md, hazards).

Here a running balance (additive) counts every event it applied; a delivery is one
application of the journaled event, as the worker, a replay or a repeated rebuild runs it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from idempotency_examples import DEPOSITED, OPENED, Message, Strategy, rows
from outbox.db import Connection
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.dispatch import apply_event

app = Outbox()


@app.projector(
    "ex_running_balances",
    events=[OPENED, DEPOSITED, "email.changed", "account.frozen", "account.unfrozen"],
)
async def running_balances(tx: Connection, event: StoredEvent) -> None:
    amount = event.payload["amount"] if event.type == DEPOSITED else 0
    await tx.execute(
        "INSERT INTO ex_running_balances AS b VALUES ($1, 1, $2) ON CONFLICT (account) "
        "DO UPDATE SET events = b.events + 1, balance = b.balance + excluded.balance",
        event.campaign_id,
        amount,
    )


class StreamPosition(Strategy):
    name = "stream_position"
    tables = ("ex_running_balances",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_running_balances (
        account text PRIMARY KEY, events integer NOT NULL, balance bigint NOT NULL
    );
    """

    @staticmethod
    async def handle(tx: Connection, m: Message) -> None:
        """One application of the journaled event, as the worker or a replay runs it."""
        await apply_event(tx, app.registry, m.stored())

    async def read_model(self, conn: Connection) -> Any:
        return rows(await conn.fetch("SELECT account, events, balance FROM ex_running_balances"))

    def expected(self, stream: Sequence[Message]) -> Any:
        events: Counter[str] = Counter()
        balances: Counter[str] = Counter()
        for m in stream:
            events[m.account] += 1
            balances[m.account] += m.data["amount"] if m.type == DEPOSITED else 0
        return sorted((a, events[a], balances[a]) for a in events)


strategy = StreamPosition()
