"""Append idempotency keys: a retried command appends its events once.

The command side's strategy. A client retries a deposit it did not hear back from (a
timeout, `outbox.AppendOutcomeUnknown`); the request carries a key the client chose once per
request, and the append stores it with the events in one transaction. A retry with the same
key gets the first append's result (`duplicate=True`) and writes nothing; a concurrent retry
waits for the first and gets the same answer; a retry with the same key but different events
is refused (`outbox.IdempotencyKeyConflict`). The key reaches every projector in
`event.metadata["idempotency_key"]`, to pass on to external systems. Keys are scoped to one
campaign and expire after OUTBOX_APPEND_KEY_TTL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency_examples import DEPOSITED, Message, Strategy, of_type, rows
from outbox import Event, Settings, append
from outbox.append.validate import KEY_METADATA
from outbox.db import Connection, Pool

SETTINGS = Settings()  # the defaults, whatever the environment says


async def deposit(pool: Pool, account: str, amount: int, request_id: str) -> int:
    """The command handler: append one deposit; returns its seq (the first one's, on retry)."""
    result = await append(
        pool,
        account,
        [Event(DEPOSITED, {"amount": amount})],
        idempotency_key=request_id,
        settings=SETTINGS,
    )
    return result.first_seq


class AppendKeys(Strategy):
    name = "append_keys"
    tables = ()
    schema = ""

    async def deliver(self, pool: Pool, message: Message) -> None:
        if message.type == DEPOSITED:
            await deposit(pool, message.account, message.data["amount"], message.id)

    async def read_model(self, conn: Connection) -> Any:
        return rows(
            await conn.fetch(
                "SELECT campaign_id, seq, (payload->>'amount')::int, metadata->>$1 "
                "FROM outbox.event_journal",
                KEY_METADATA,
            )
        )

    def expected(self, stream: Sequence[Message]) -> Any:
        seqs: dict[str, int] = {}
        out = []
        for m in of_type(stream, DEPOSITED):
            seqs[m.account] = seqs.get(m.account, 0) + 1
            out.append((m.account, seqs[m.account], m.data["amount"], m.id))
        return sorted(out)


strategy = AppendKeys()
