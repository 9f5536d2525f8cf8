"""Every strategy of docs/idempotency.md, delivered twice and concurrently, equals one delivery.

The oracle of each read model is computed from the generated messages alone
(`Strategy.expected`), never from what the handlers saw.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from idempotency_examples import (
    DEPOSITED,
    Message,
    Strategy,
    deliver_all,
    delivered,
    messages,
    of_type,
    rows,
)
from idempotency_examples.catalog import STRATEGIES

from helpers import EXAMPLES
from outbox.db import Connection, Pool

STREAM = messages()


async def read(pool: Pool, strategy: Strategy) -> Any:
    async with pool.acquire() as conn:
        return await strategy.read_model(conn)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=[s.name for s in STRATEGIES])
async def test_two_concurrent_deliveries_equal_one(pool: Pool, strategy: Strategy) -> None:
    await strategy.install(pool)
    once = await delivered(pool, strategy, STREAM, copies=1)
    assert once == strategy.expected(STREAM)
    assert await delivered(pool, strategy, STREAM, copies=2) == once
    # Once more on top of everything: a late redelivery of the whole stream changes nothing,
    # except where the strategy says (and docs/idempotency.md warns) it cannot tell.
    await deliver_all(pool, strategy, STREAM, copies=2)
    assert (await read(pool, strategy) == once) is strategy.late_redelivery_safe


class Naive(Strategy):
    """An additive handler with no guard: what the harness must catch."""

    name = "naive"
    tables = ("ex_naive_totals",)
    schema = "CREATE TABLE IF NOT EXISTS ex_naive_totals (account text PRIMARY KEY, total bigint)"

    async def deliver(self, pool: Pool, message: Message) -> None:
        if message.type == DEPOSITED:
            await pool.execute(
                "INSERT INTO ex_naive_totals AS t VALUES ($1, $2) ON CONFLICT (account) "
                "DO UPDATE SET total = t.total + excluded.total",
                message.account,
                message.data["amount"],
            )

    async def read_model(self, conn: Connection) -> Any:
        return rows(await conn.fetch("SELECT account, total FROM ex_naive_totals"))

    def expected(self, stream: Sequence[Message]) -> Any:
        totals: Counter[str] = Counter()
        for m in of_type(stream, DEPOSITED):
            totals[m.account] += m.data["amount"]
        return sorted(totals.items())


async def test_the_harness_catches_a_handler_that_is_not_idempotent(pool: Pool) -> None:
    naive = Naive()
    await naive.install(pool)
    once = await delivered(pool, naive, STREAM, copies=1)
    assert once == naive.expected(STREAM)
    twice = await delivered(pool, naive, STREAM, copies=2)
    assert twice == [(a, 2 * total) for a, total in once]


def test_the_examples_run_from_the_command_line(pg_server: str) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    environ |= {"OUTBOX_DSN": pg_server, "PYTHONPATH": str(EXAMPLES)}
    done = subprocess.run(
        [sys.executable, "-m", "idempotency_examples", "--copies", "3", "upsert"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=environ,
    )
    assert done.returncode == 0, done.stderr
    assert "upsert" in done.stdout
    assert "NO" not in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "idempotency_examples", "no_such_strategy"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=environ,
    )
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "unknown strategy 'no_such_strategy'" in bad.stderr
