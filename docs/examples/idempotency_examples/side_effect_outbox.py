"""An outbox row for side effects: the handler only records what to send; a sender sends.

The handler inserts one `ex_mail_outbox` row per welcome mail, keyed by the message id, in the
projection's transaction (`ON CONFLICT DO NOTHING` absorbs duplicates). A separate sender
claims unsent rows with `FOR UPDATE SKIP LOCKED`, calls the service with the row's id as the
idempotency key and marks the row sent; several senders may run at once. No lock is held by
the handler across an external call, and the handler never fails because the service is
down. A sender that crashes after the call and before its commit calls again with the same
key (at-least-once towards the service; the key makes it once) (docs/idempotency.md, "the outbox
pattern").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from idempotency_examples import OPENED, Mailer, Message, Strategy, of_type, rows
from outbox.db import Connection, Pool

SENDERS = 3


class SideEffectOutbox(Strategy):
    name = "side_effect_outbox"
    tables = ("ex_mail_outbox",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_mail_outbox (
        message_id text PRIMARY KEY, recipient text NOT NULL, sent_at timestamptz
    );
    """

    def __init__(self) -> None:
        self.mailer = Mailer()

    async def deliver(self, pool: Pool, message: Message) -> None:
        if message.type == OPENED:
            await pool.execute(
                "INSERT INTO ex_mail_outbox (message_id, recipient) VALUES ($1, $2) "
                "ON CONFLICT DO NOTHING",
                message.id,
                message.data["email"],
            )

    async def finish(self, pool: Pool) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(SENDERS):
                tg.start_soon(self.send_pending, pool)

    async def send_pending(self, pool: Pool) -> None:
        """One sender: claim an unsent row, send it, mark it sent, until none is left."""
        while True:
            async with pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(
                    "SELECT message_id, recipient FROM ex_mail_outbox WHERE sent_at IS NULL "
                    "ORDER BY message_id LIMIT 1 FOR UPDATE SKIP LOCKED"
                )
                if row is None:
                    return
                await self.mailer.send(row["message_id"], row["recipient"])
                await conn.execute(
                    "UPDATE ex_mail_outbox SET sent_at = now() WHERE message_id = $1",
                    row["message_id"],
                )

    async def read_model(self, conn: Connection) -> Any:
        stored = rows(
            await conn.fetch("SELECT message_id, sent_at IS NOT NULL FROM ex_mail_outbox")
        )
        return stored, sorted(self.mailer.calls)

    def expected(self, stream: Sequence[Message]) -> Any:
        opened = list(of_type(stream, OPENED))
        return sorted((m.id, True) for m in opened), sorted((m.id, m.data["email"]) for m in opened)

    def forget(self) -> None:
        self.mailer = Mailer()


strategy = SideEffectOutbox()
