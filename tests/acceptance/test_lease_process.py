"""Lease mode (S13) with real worker processes: SIGKILL mid-projector, SIGTERM hands back.

The app is `worker_apps:leasing`: its non-transactional projector records the delivery, then
waits on an advisory lock the test holds, so the worker dies (or stops) after the side effect
and before the completion. Waits are bounded waits on database state.
"""

from __future__ import annotations

import signal

import anyio

from helpers import TESTS, WORKER, frozen, projector_is_waiting, wait_for, worker_env
from outbox import Event, Settings, append, db

TABLES = "CREATE TABLE applied (campaign_id text, seq bigint); " + (
    "CREATE TABLE deliveries (campaign_id text, seq bigint)"
)


async def queue(pool: db.Pool) -> list[tuple[int, str, int, int | None]]:
    rows = await pool.fetch(
        "SELECT seq, status, attempt_count, claim_epoch FROM outbox.projection_apply_outbox "
        "ORDER BY seq"
    )
    return [(r["seq"], r["status"], r["attempt_count"], r["claim_epoch"]) for r in rows]


async def seqs(pool: db.Pool, table: str) -> list[int]:
    rows = await pool.fetch(f"SELECT seq FROM {table} ORDER BY seq")  # a constant of this file
    return [r["seq"] for r in rows]


async def start(dsn: str, **env: str) -> anyio.abc.Process:
    return await anyio.open_process(
        [*WORKER, "--app", "worker_apps:leasing", "--shutdown-timeout", "1"],
        cwd=TESTS,
        env=worker_env(dsn, **env),
    )


async def test_sigkill_mid_projector_reclaims_after_the_lease_and_applies_again(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await pool.execute(TABLES)
    await append(pool, "c", [Event("tick", {}), Event("tick", {})], settings=settings)
    async with frozen(pool):
        proc = await start(dsn, OUTBOX_LEASE_SECONDS="2")
        try:
            await wait_for(lambda: projector_is_waiting(pool))
            owner = await pool.fetchval(
                "SELECT lease_owner FROM outbox.projection_apply_outbox WHERE seq = 1"
            )
            assert owner.split(":")[1] == str(proc.pid)
            assert await queue(pool) == [(1, "processing", 0, 1), (2, "pending", 0, None)]
            proc.kill()
            with anyio.fail_after(60):
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    assert await seqs(pool, "deliveries") == [1]  # the side effect happened before the kill

    async def lease_expired() -> bool:
        expired: bool = await pool.fetchval(
            "SELECT lease_expires_at < clock_timestamp() FROM outbox.projection_apply_outbox "
            "WHERE seq = 1"
        )
        return expired

    await wait_for(lease_expired)
    drained = await anyio.run_process(
        [*WORKER, "--app", "worker_apps:leasing", "--drain"], cwd=TESTS, env=worker_env(dsn)
    )
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.decode().split() == [
        "drained:",
        "applied=2",
        "skipped=0",
        "failed=0",
        "dead=0",
        "leased=2",
        "reclaimed=1",
    ]
    # Nothing lost; the non-transactional projector ran seq 1 again (at-least-once), the
    # transactional one applied each event once, in order.
    assert await queue(pool) == []
    assert await seqs(pool, "deliveries") == [1, 1, 2]
    assert await seqs(pool, "applied") == [1, 2]


async def test_sigterm_mid_projector_hands_the_lease_back_without_an_attempt(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await pool.execute(TABLES)
    await append(pool, "c", [Event("tick", {})], settings=settings)
    async with frozen(pool):
        proc = await start(dsn)  # the default lease: two minutes
        try:
            await wait_for(lambda: projector_is_waiting(pool))
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    assert code == 0
    # Released at once, not left to expire: pending again, no attempt counted, due now.
    assert await queue(pool) == [(1, "pending", 0, 1)]
    assert await pool.fetchval(
        "SELECT due_at <= clock_timestamp() FROM outbox.projection_apply_campaigns"
    )
    drained = await anyio.run_process(
        [*WORKER, "--app", "worker_apps:leasing", "--drain"], cwd=TESTS, env=worker_env(dsn)
    )
    assert drained.returncode == 0, drained.stderr
    assert await queue(pool) == []
    assert await seqs(pool, "applied") == [1]
