"""The consumer dedup guard (`outbox.dedup`), in both variants, for messages from elsewhere.

A consumer of a broker claims `(scope, message id, week of the event's time)` before acting:

- `dedup_in_transaction`: `claim_in_transaction` joins the transaction that books the deposit.
  The claim and the work commit or roll back together: a failure redelivers the message
  (at-least-once), so the broker needs a retry limit and a dead-letter destination, or a
  poison message comes back for ever.
- `dedup_own_transaction`: `claim_now` commits the claim before the work, here a welcome mail
  that is better lost than sent twice. A failure after the claim loses the mail
  (at-most-once) unless the handler calls `release`, as this one does when sending fails.

Claims outlive the end of their week by `maintenance cleanup --claims-retention-days` (14 by
default); a redelivery later than that is not caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency_examples import (
    DEPOSITED,
    OPENED,
    Mailer,
    Message,
    Strategy,
    deposit_totals,
    of_type,
    rows,
)
from outbox import dedup
from outbox.db import Connection, Pool


class DedupInTransaction(Strategy):
    name = "dedup_in_transaction"
    tables = ("ex_consumer_totals",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_consumer_totals (
        account text PRIMARY KEY, deposits integer NOT NULL, total bigint NOT NULL
    );
    """

    async def deliver(self, pool: Pool, message: Message) -> None:
        if message.type != DEPOSITED:
            return
        async with pool.acquire() as conn, conn.transaction():
            if not await dedup.claim_in_transaction(
                conn, "ledger-consumer", message.id, message.time, topic="accounts"
            ):
                return  # claimed before: a redelivery
            await conn.execute(
                "INSERT INTO ex_consumer_totals AS t VALUES ($1, 1, $2) ON CONFLICT (account) "
                "DO UPDATE SET deposits = t.deposits + 1, total = t.total + excluded.total",
                message.account,
                message.data["amount"],
            )

    async def read_model(self, conn: Connection) -> Any:
        return rows(await conn.fetch("SELECT account, deposits, total FROM ex_consumer_totals"))

    def expected(self, stream: Sequence[Message]) -> Any:
        return deposit_totals(stream)


class DedupOwnTransaction(Strategy):
    name = "dedup_own_transaction"
    tables = ()
    schema = ""

    def __init__(self) -> None:
        self.mailer = Mailer()

    async def deliver(self, pool: Pool, message: Message) -> None:
        if message.type != OPENED:
            return
        if not await dedup.claim_now(pool, "welcome-mailer", message.id, message.time):
            return  # claimed before: sent, or being sent, by another delivery
        try:
            await self.mailer.send(message.id, message.data["email"])
        except Exception:
            await dedup.release(pool, "welcome-mailer", message.id, message.time)
            raise

    async def read_model(self, conn: Connection) -> Any:
        return sorted(self.mailer.calls)

    def expected(self, stream: Sequence[Message]) -> Any:
        return sorted((m.id, m.data["email"]) for m in of_type(stream, OPENED))

    def forget(self) -> None:
        self.mailer = Mailer()


in_transaction = DedupInTransaction()
own_transaction = DedupOwnTransaction()
