"""Idempotent handler strategies, one runnable example each (docs/idempotency.md).

Every example handles the same stream of bank-account messages (`messages()`): an account is
opened, money is deposited, the e-mail address changes, the account is frozen and unfrozen. A
`Strategy` owns its read-model tables, handles one delivery of one message (`deliver`), and
reads its read model back (`read_model`); `expected` computes the same read model from the
messages alone, as an oracle.

`deliver_all` delivers a stream the way a redelivering broker or a replay does: account by
account in order, every message `copies` times at once. The tests (and `python -m
idempotency_examples`) check that two concurrent deliveries of everything leave each
read model equal to one delivery and to its oracle.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from outbox.db import Connection, Executor, Pool, acquire
from outbox.model import StoredEvent

__all__ = [
    "DEPOSITED",
    "EMAIL_CHANGED",
    "FROZEN",
    "OPENED",
    "UNFROZEN",
    "Mailer",
    "Message",
    "Strategy",
    "deliver_all",
    "delivered",
    "deposit_totals",
    "messages",
    "reset",
]

OPENED = "account.opened"
DEPOSITED = "money.deposited"
EMAIL_CHANGED = "email.changed"
FROZEN = "account.frozen"
UNFROZEN = "account.unfrozen"

# The outbox's own state that examples write (journal, keys, guards), emptied between runs.
OUTBOX_STATE = (
    "outbox.projection_apply_campaigns",
    "outbox.projection_apply_outbox",
    "outbox.event_journal",
    "outbox.campaign_head_keys",
    "outbox.append_idempotency_keys",
    "outbox.projection_checkpoint_keys",
    "outbox.projection_checkpoint_moves",
    "outbox.processed_markers",
    "outbox.consumer_claims",
)


@dataclass(frozen=True, slots=True)
class Message:
    """One message of an account's stream, as a broker (or the outbox) delivers it."""

    id: str  # unique per message: what a consumer deduplicates on
    account: str
    seq: int  # position in the account's stream, 1-based
    type: str
    time: datetime  # the event's own timestamp (never the consumer's clock)
    data: dict[str, Any]

    def stored(self) -> StoredEvent:
        """The message as the outbox's projectors see a journaled event."""
        return StoredEvent(
            self.account, self.seq, self.type, self.data, {"message_id": self.id}, self.time
        )


def messages(accounts: int = 6, per_account: int = 12, seed: int = 7) -> list[Message]:
    """A deterministic stream: each account is opened, then deposits, e-mail changes and
    freeze/unfreeze pairs follow in a seeded random order."""
    rng = random.Random(seed)  # noqa: S311 - reproducible example data, not secrets
    start = datetime(2026, 11, 16, 8, 0, tzinfo=UTC)
    out: list[Message] = []
    for a in range(accounts):
        account = f"acct-{a:03d}"
        frozen = False
        data: dict[str, Any]
        for seq in range(1, per_account + 1):
            at = start + timedelta(minutes=97 * a + 13 * seq)
            if seq == 1:
                kind, data = OPENED, {"owner": f"owner {a}", "email": f"a{a}@example.com"}
            else:
                roll = rng.random()
                if roll < 0.6:
                    kind, data = DEPOSITED, {"amount": rng.randint(1, 500)}
                elif roll < 0.8:
                    kind, data = EMAIL_CHANGED, {"email": f"a{a}.{seq}@example.com"}
                else:
                    kind, data = (UNFROZEN if frozen else FROZEN), {}
                    frozen = not frozen
            out.append(Message(f"m-{a:03d}-{seq:03d}", account, seq, kind, at, data))
    return out


@dataclass
class Mailer:
    """A stand-in for an external system the database cannot roll back (a mail service). It
    honours an idempotency key the way well-built APIs do, and records every call it got."""

    calls: list[tuple[str, str]] = field(default_factory=list)  # (key, recipient)
    delivered: dict[str, str] = field(default_factory=dict)  # key -> recipient

    async def send(self, key: str, recipient: str) -> None:
        self.calls.append((key, recipient))
        self.delivered.setdefault(key, recipient)


class Strategy:
    """One example: its tables, its handler of one delivery, its read model and oracle."""

    name: str = ""
    tables: tuple[str, ...] = ()
    schema: str = ""
    # Whether a redelivery after later events of the aggregate is caught too (not only a
    # duplicate that arrives before the aggregate's next event).
    late_redelivery_safe: bool = True

    async def install(self, executor: Executor) -> None:
        if not self.schema:
            return  # the strategy keeps its state in the outbox's own tables
        async with acquire(executor) as conn:
            await conn.execute(self.schema)

    async def deliver(self, pool: Pool, message: Message) -> None:
        """Handle one delivery of `message`, in transactions of its own: by default `handle`
        in one transaction; strategies with more than one step override this."""
        async with pool.acquire() as conn, conn.transaction():
            await self.handle(conn, message)

    @staticmethod
    async def handle(tx: Connection, m: Message) -> None:
        """One delivery inside `deliver`'s transaction."""
        raise NotImplementedError

    async def finish(self, pool: Pool) -> None:
        """Work that runs after the deliveries (a sender of queued side effects)."""

    async def read_model(self, conn: Connection) -> Any:
        raise NotImplementedError

    def expected(self, stream: Sequence[Message]) -> Any:
        raise NotImplementedError

    def forget(self) -> None:
        """Forget what lives outside the database (a fake external system)."""


async def reset(executor: Executor, strategy: Strategy) -> None:
    """Empty the strategy's tables and the outbox state it may have written."""
    async with acquire(executor) as conn:
        tables = ", ".join((*strategy.tables, *OUTBOX_STATE))
        await conn.execute(f"TRUNCATE {tables}")  # names are this package's constants
    strategy.forget()


async def delivered(
    pool: Pool, strategy: Strategy, stream: Sequence[Message], *, copies: int = 1
) -> Any:
    """From empty tables, deliver `stream` (`deliver_all`) and return the read model."""
    await reset(pool, strategy)
    await deliver_all(pool, strategy, stream, copies=copies)
    async with acquire(pool) as conn:
        return await strategy.read_model(conn)


async def deliver_all(
    pool: Pool, strategy: Strategy, stream: Sequence[Message], *, copies: int = 1
) -> None:
    """Deliver `stream`: accounts concurrently, each account's messages in order, and every
    message `copies` times at once (concurrent duplicates)."""
    by_account: dict[str, list[Message]] = {}
    for m in stream:
        by_account.setdefault(m.account, []).append(m)

    async def account(ms: list[Message]) -> None:
        for m in sorted(ms, key=lambda m: m.seq):
            async with anyio.create_task_group() as tg:
                for _ in range(copies):
                    tg.start_soon(strategy.deliver, pool, m)

    async with anyio.create_task_group() as tg:
        for ms in by_account.values():
            tg.start_soon(account, ms)
    await strategy.finish(pool)


def deposit_totals(stream: Sequence[Message]) -> list[tuple[str, int, int]]:
    """The oracle of the additive examples: (account, deposits, total) per account."""
    totals: dict[str, tuple[int, int]] = {}
    for m in of_type(stream, DEPOSITED):
        n, total = totals.get(m.account, (0, 0))
        totals[m.account] = (n + 1, total + m.data["amount"])
    return sorted((a, n, total) for a, (n, total) in totals.items())


def of_type(stream: Sequence[Message], *types: str) -> Iterator[Message]:
    return (m for m in stream if m.type in types)


def rows(records: Sequence[Any], convert: Callable[[Any], Any] = tuple) -> list[Any]:
    """Records as sorted plain tuples, comparable with an oracle."""
    return sorted(convert(r) for r in records)
