"""Status flag for an external side effect: record it, then send once and mark it sent.

Opening an account sends a welcome mail through an external service, which no database
transaction can roll back. The handler records a notification keyed by the message id, locks
it, and sends only while its status is `pending`; the status turns `sent` in the same
transaction. A concurrent second delivery waits on the lock and then finds `sent`. The row
lock is held across the call, so keep the call short (or use side_effect_outbox.py). A crash
after the send and before the commit sends again: pass the notification id as the external
service's idempotency key, so the service absorbs it (docs/idempotency.md, "status flags").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency_examples import OPENED, Mailer, Message, Strategy, of_type, rows
from outbox.db import Connection, Pool


class StatusFlag(Strategy):
    name = "status_flag"
    tables = ("ex_notifications",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_notifications (
        source_message_id text PRIMARY KEY, recipient text NOT NULL,
        status text NOT NULL CHECK (status IN ('pending', 'sent'))
    );
    """

    def __init__(self) -> None:
        self.mailer = Mailer()

    async def deliver(self, pool: Pool, message: Message) -> None:
        if message.type != OPENED:
            return
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO ex_notifications VALUES ($1, $2, 'pending') ON CONFLICT DO NOTHING",
                message.id,
                message.data["email"],
            )
            status = await conn.fetchval(
                "SELECT status FROM ex_notifications WHERE source_message_id = $1 FOR UPDATE",
                message.id,
            )
            if status == "sent":
                return  # a redelivery: the mail went out
            await self.mailer.send(message.id, message.data["email"])
            await conn.execute(
                "UPDATE ex_notifications SET status = 'sent' WHERE source_message_id = $1",
                message.id,
            )

    async def read_model(self, conn: Connection) -> Any:
        stored = rows(await conn.fetch("SELECT source_message_id, status FROM ex_notifications"))
        return stored, sorted(self.mailer.calls)

    def expected(self, stream: Sequence[Message]) -> Any:
        opened = list(of_type(stream, OPENED))
        return sorted((m.id, "sent") for m in opened), sorted(
            (m.id, m.data["email"]) for m in opened
        )

    def forget(self) -> None:
        self.mailer = Mailer()


strategy = StatusFlag()
