"""Set-based handler: write the state the event states, never add to it.

`email.changed` sets the address, `account.opened` inserts the profile only if it is missing.
Running either twice leaves the same row, so no guard is needed. Prefer this whenever the
read model can be stated as "the value is X" rather than "add X" (docs/idempotency.md, set-based).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency_examples import EMAIL_CHANGED, OPENED, Message, Strategy, rows
from outbox.db import Connection


class SetBased(Strategy):
    name = "set_based"
    tables = ("ex_profiles",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_profiles (
        account text PRIMARY KEY, owner text NOT NULL, email text NOT NULL
    );
    """

    async def read_model(self, conn: Connection) -> Any:
        return rows(await conn.fetch("SELECT account, owner, email FROM ex_profiles"))

    def expected(self, stream: Sequence[Message]) -> Any:
        profiles: dict[str, tuple[str, str, str]] = {}
        for m in stream:
            if m.type == OPENED:
                profiles[m.account] = (m.account, m.data["owner"], m.data["email"])
            elif m.type == EMAIL_CHANGED:
                profiles[m.account] = (*profiles[m.account][:2], m.data["email"])
        return sorted(profiles.values())

    @staticmethod
    async def handle(tx: Connection, m: Message) -> None:
        """One delivery, inside the transaction `deliver` opens."""
        if m.type == OPENED:
            await tx.execute(
                "INSERT INTO ex_profiles (account, owner, email) VALUES ($1, $2, $3) "
                "ON CONFLICT (account) DO NOTHING",
                m.account,
                m.data["owner"],
                m.data["email"],
            )
        elif m.type == EMAIL_CHANGED:
            await tx.execute(
                "UPDATE ex_profiles SET email = $2 WHERE account = $1", m.account, m.data["email"]
            )


strategy = SetBased()
