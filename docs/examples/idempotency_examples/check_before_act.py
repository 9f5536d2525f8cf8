"""Check-before-act on the aggregate's own records: an additive change remembers its source.

A deposit adds to the balance, which is not idempotent. The account keeps the ids of the
deposits it has booked (`ex_ledger_entries`, part of the aggregate): the handler locks the
account row, checks whether this deposit is booked, and books it only if not. The lock makes
the check and the act one step: without `FOR UPDATE`, two concurrent deliveries both see
"not booked" and both add (docs/idempotency.md, "check-before-act").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from idempotency_examples import DEPOSITED, OPENED, Message, Strategy, of_type, rows
from outbox.db import Connection


class CheckBeforeAct(Strategy):
    name = "check_before_act"
    tables = ("ex_ledger_entries", "ex_balances")
    schema = """
    CREATE TABLE IF NOT EXISTS ex_balances (account text PRIMARY KEY, balance bigint NOT NULL);
    CREATE TABLE IF NOT EXISTS ex_ledger_entries (
        account text NOT NULL REFERENCES ex_balances, deposit_id text NOT NULL,
        amount bigint NOT NULL, PRIMARY KEY (account, deposit_id)
    );
    """

    async def read_model(self, conn: Connection) -> Any:
        return rows(await conn.fetch("SELECT account, balance FROM ex_balances"))

    def expected(self, stream: Sequence[Message]) -> Any:
        balances: Counter[str] = Counter({m.account: 0 for m in of_type(stream, OPENED)})
        for m in of_type(stream, DEPOSITED):
            balances[m.account] += m.data["amount"]
        return sorted(balances.items())

    @staticmethod
    async def handle(tx: Connection, m: Message) -> None:
        """One delivery, inside the transaction `deliver` opens."""
        if m.type == OPENED:
            await tx.execute(
                "INSERT INTO ex_balances VALUES ($1, 0) ON CONFLICT DO NOTHING", m.account
            )
            return
        if m.type != DEPOSITED:
            return
        # Lock the aggregate, then look at its own records.
        await tx.execute("SELECT 1 FROM ex_balances WHERE account = $1 FOR UPDATE", m.account)
        booked = await tx.fetchval(
            "SELECT true FROM ex_ledger_entries WHERE account = $1 AND deposit_id = $2",
            m.account,
            m.id,
        )
        if booked:
            return  # this deposit was booked before: a redelivery
        await tx.execute(
            "INSERT INTO ex_ledger_entries VALUES ($1, $2, $3)", m.account, m.id, m.data["amount"]
        )
        await tx.execute(
            "UPDATE ex_balances SET balance = balance + $2 WHERE account = $1",
            m.account,
            m.data["amount"],
        )


strategy = CheckBeforeAct()
