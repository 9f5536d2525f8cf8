"""State-machine guard: a transition happens only from the state it starts in.

Freezing counts towards `freezes` (an additive effect), but only an open account can be
frozen and only a frozen one unfrozen. The guard is the `WHERE state = ...` of the UPDATE:
PostgreSQL re-checks it on the row's newest version after waiting for a concurrent writer,
so two concurrent deliveries of one freeze make one transition (docs/idempotency.md, "state machine
guard"). The guard knows states, not events: a freeze redelivered after the account was
unfrozen again would freeze it again. Use it where duplicates arrive before the next event of
the aggregate (in-order redelivery), or pair it with a stream position (stream_position.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idempotency_examples import FROZEN, OPENED, UNFROZEN, Message, Strategy, rows
from outbox.db import Connection

# event type -> (from state, to state)
TRANSITIONS = {FROZEN: ("open", "frozen"), UNFROZEN: ("frozen", "open")}


class StateMachine(Strategy):
    name = "state_machine"
    late_redelivery_safe = False  # a freeze redelivered after the unfreeze freezes again
    tables = ("ex_account_states",)
    schema = """
    CREATE TABLE IF NOT EXISTS ex_account_states (
        account text PRIMARY KEY, state text NOT NULL, freezes integer NOT NULL
    );
    """

    async def read_model(self, conn: Connection) -> Any:
        return rows(await conn.fetch("SELECT account, state, freezes FROM ex_account_states"))

    def expected(self, stream: Sequence[Message]) -> Any:
        states: dict[str, tuple[str, int]] = {}
        for m in stream:
            if m.type == OPENED:
                states[m.account] = ("open", 0)
            elif m.type in TRANSITIONS:
                _, freezes = states[m.account]
                states[m.account] = (TRANSITIONS[m.type][1], freezes + (m.type == FROZEN))
        return sorted((a, s, n) for a, (s, n) in states.items())

    @staticmethod
    async def handle(tx: Connection, m: Message) -> None:
        """One delivery, inside the transaction `deliver` opens."""
        if m.type == OPENED:
            await tx.execute(
                "INSERT INTO ex_account_states VALUES ($1, 'open', 0) ON CONFLICT DO NOTHING",
                m.account,
            )
        elif m.type in TRANSITIONS:
            source, target = TRANSITIONS[m.type]
            await tx.execute(
                "UPDATE ex_account_states SET state = $3, freezes = freezes + $4::int "
                "WHERE account = $1 AND state = $2",
                m.account,
                source,
                target,
                int(m.type == FROZEN),
            )


strategy = StateMachine()
