"""Upsert: create the projection's record or update it, in one statement.

Each deposit becomes a row of `ex_deposit_history` keyed by the deposit's id; a second
delivery finds the row and writes the same values again. `INSERT ... ON CONFLICT DO UPDATE`
is atomic under concurrency: the second of two concurrent inserts waits for the first, then
updates (a "check if it exists, then insert" in two statements would race and fail or
duplicate). Totals are read from the rows, never kept as a running sum (docs/idempotency.md,
"upsert").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency_examples import DEPOSITED, Message, Strategy, deposit_totals, rows
from outbox.db import Connection, Pool


class Upsert(Strategy):
    name = "upsert"
    tables = ("ex_deposit_history",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_deposit_history (
        deposit_id text PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL,
        deposited_at timestamptz NOT NULL
    );
    """

    async def deliver(self, pool: Pool, message: Message) -> None:
        if message.type != DEPOSITED:
            return
        await pool.execute(
            "INSERT INTO ex_deposit_history VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (deposit_id) DO UPDATE "
            "SET account = excluded.account, amount = excluded.amount, "
            "deposited_at = excluded.deposited_at",
            message.id,
            message.account,
            message.data["amount"],
            message.time,  # the event's time: a replay writes the same value
        )

    async def read_model(self, conn: Connection) -> Any:
        return rows(
            await conn.fetch(
                "SELECT account, count(*), sum(amount) FROM ex_deposit_history GROUP BY account"
            )
        )

    def expected(self, stream: Sequence[Message]) -> Any:
        return deposit_totals(stream)


strategy = Upsert()
