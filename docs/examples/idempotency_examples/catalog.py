"""Every strategy example, in the order docs/idempotency.md presents them."""

from __future__ import annotations

from idempotency_examples import (
    Strategy,
    append_keys,
    check_before_act,
    dedup_guard,
    processed_ids,
    set_based,
    side_effect_outbox,
    state_machine,
    status_flag,
    stream_position,
    upsert,
)

__all__ = ["STRATEGIES", "by_name"]

STRATEGIES: tuple[Strategy, ...] = (
    set_based.strategy,
    check_before_act.strategy,
    state_machine.strategy,
    processed_ids.strategy,
    stream_position.strategy,
    upsert.strategy,
    status_flag.strategy,
    side_effect_outbox.strategy,
    append_keys.strategy,
    dedup_guard.in_transaction,
    dedup_guard.own_transaction,
)


def by_name() -> dict[str, Strategy]:
    return {s.name: s for s in STRATEGIES}
