"""The hot functions make their plans once per session (plan_cache_mode force_generic_plan),
except on a database with Citus, which cannot distribute some of their generic plans and gets
the default back (`outbox_plans_for_citus`, at the migrate and at `maintenance distribute`)."""

from __future__ import annotations

import pytest

from outbox import db
from outbox.testing.localcitus import CitusCluster

pytestmark = pytest.mark.asyncio

GENERIC = """
SELECT p.proname::text FROM pg_proc p
WHERE p.pronamespace = 'outbox'::regnamespace
  AND 'plan_cache_mode=force_generic_plan' = ANY (p.proconfig)
ORDER BY 1
"""
HOT = {
    "outbox_try_append",
    "outbox_events_json",
    "outbox_claim",
    "outbox_settle",
    "outbox_refresh_campaigns",
    "outbox_lock_checkpoints",
    "outbox_checkpoints_of",
    "outbox_move_checkpoint",
}


async def test_the_hot_functions_make_their_plans_once_except_on_citus(
    pool: db.Pool, citus: CitusCluster | None
) -> None:
    generic = {r[0] for r in await pool.fetch(GENERIC)}
    if citus is None:
        assert generic >= HOT
    else:
        assert generic == set()
        # Once more, as `maintenance distribute` does: nothing left to change.
        assert await pool.fetchval("SELECT outbox.outbox_plans_for_citus()") == 0
