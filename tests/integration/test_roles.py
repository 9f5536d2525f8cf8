"""The least-privilege roles of docs/operations.md, run as written: each role can do its job
and nothing it should not."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from campaigns_demo.app import install
from factories import make_dead, make_failed

from helpers import ROOT, run_cli
from outbox import Event, Settings, append, db, dedup
from outbox.console import create_app

ROLES = (
    "outbox_owner",
    "outbox_worker",
    "outbox_report",
    "outbox_operator",
    "outbox_appender",
    "outbox_consumer",
)


def roles_sql() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    match = re.search(r"```sql\n(-- outbox roles\n.*?)```", text, re.S)
    assert match, "docs/operations.md lost its roles block"
    return match.group(1)


def as_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@pytest.fixture
async def roles(dsn: str) -> AsyncIterator[dict[str, str]]:
    """The documented roles (suffixed: roles are cluster-wide), and a DSN for each."""
    suffix = uuid.uuid4().hex[:6]
    names = {r: f"{r}_{suffix}" for r in ROLES}
    sql = roles_sql()
    for role, name in names.items():
        sql = re.sub(rf"\b{role}\b", name, sql)
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(sql)
        yield {role: as_user(dsn, name) for role, name in names.items()}
    finally:
        for name in names.values():
            await admin.execute(f'DROP OWNED BY "{name}"')
            await admin.execute(f'DROP ROLE "{name}"')
        await admin.close()


async def test_each_role_does_its_job_and_no_more(
    pool: db.Pool, roles: dict[str, str], settings: Settings
) -> None:
    await install(pool)
    worker_role = urlsplit(roles["outbox_worker"]).username
    await pool.execute(
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON demo_roster, demo_event_counts, "
        f'demo_dice_totals TO "{worker_role}"'
    )
    # The application appends with its own role.
    appender = await db.connect(roles["outbox_appender"])
    try:
        await append(
            appender,
            "c",
            [Event("dice.rolled", {"value": 5}), Event("dice.cursed", {})],
            idempotency_key="k",
            settings=settings,
        )
    finally:
        await appender.close()
    # The worker rotates the queue: with the clock put back 0, 10 and 20 s, each slot is the
    # oldest once, so the one its rows are in is emptied into another.
    worker = await asyncpg.connect(roles["outbox_worker"])
    try:
        outcomes = []
        for back in (0, 10, 20):
            async with worker.transaction():
                outcomes.append(
                    await worker.fetchval(
                        "SELECT outcome FROM outbox.outbox_rotate(10000, 1000,"
                        " clock_timestamp() - make_interval(secs => $1))",
                        back,
                    )
                )
    finally:
        await worker.close()
    assert "rotated" in outcomes, outcomes
    # The worker applies (and records the cursed failure).
    drained = run_cli(
        "outbox-worker",
        "--app",
        "campaigns_demo.app:app",
        "--drain-now",
        dsn=roles["outbox_worker"],
    )
    assert drained.returncode == 0, drained.stderr
    assert "applied=1" in drained.stdout
    # The worker's role rebuilds in place on the catch-up engine (its record included).
    rebuilt = run_cli(
        "maintenance",
        "projections-rebuild",
        "--app",
        "campaigns_demo.app:app",
        "--yes",
        dsn=roles["outbox_worker"],
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    await make_dead(pool, "c", 2)
    # The report role reads but cannot requeue.
    report = run_cli("maintenance", "outbox-report", "--json", dsn=roles["outbox_report"])
    assert report.returncode == 0, report.stderr
    denied = run_cli(
        "maintenance",
        "outbox-requeue",
        "--campaign-id",
        "c",
        "--seq",
        "2",
        dsn=roles["outbox_report"],
    )
    assert denied.returncode == 1
    assert "permission denied" in denied.stderr
    # The operator requeues, with an audit it cannot rewrite.
    requeued = run_cli(
        "maintenance",
        "outbox-requeue",
        "--campaign-id",
        "c",
        "--seq",
        "2",
        "--reason",
        "test",
        dsn=roles["outbox_operator"],
    )
    assert requeued.returncode == 0, requeued.stderr
    # ... retries a failed row now (its attempts kept) ...
    await make_failed(pool, "c", 2, due_in=300)
    retried = run_cli(
        "maintenance", "outbox-retry", "--campaign-id", "c", "--seq", "2", "--reason", "fixed",
        dsn=roles["outbox_operator"],
    )  # fmt: skip
    assert retried.returncode == 0, retried.stderr
    # ... and discards a dead row, moving the ordered checkpoints past it.
    await make_dead(pool, "c", 2)
    discarded = run_cli(
        "maintenance",
        "outbox-discard",
        "--app",
        "campaigns_demo.app:app",
        "--campaign-id",
        "c",
        "--seq",
        "2",
        "--reason",
        "cursed for good",
        dsn=roles["outbox_operator"],
    )
    assert discarded.returncode == 0, discarded.stderr
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    assert await pool.fetchval("SELECT min(applied_seq) FROM outbox.projection_checkpoints") == 2
    assert run_cli("maintenance", "cleanup", dsn=roles["outbox_operator"]).returncode == 0
    # ... and records a projector's definition in place (S33), audited.
    redefined = run_cli(
        "maintenance", "projector-redefine", "roster", "--app", "campaigns_demo.app:app",
        "--reason", "reviewed", dsn=roles["outbox_operator"],
    )  # fmt: skip
    assert redefined.returncode == 0, redefined.stderr
    operator = await asyncpg.connect(roles["outbox_operator"])
    try:
        for forbidden in (
            "UPDATE outbox.outbox_requeue_audit SET reason = 'rewritten'",
            "DELETE FROM outbox.outbox_requeue_audit",
            "DELETE FROM outbox.event_journal",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await operator.execute(forbidden)
    finally:
        await operator.close()
    reasons = await pool.fetch("SELECT action, reason FROM outbox.outbox_requeue_audit ORDER BY at")
    assert [tuple(r) for r in reasons] == [
        ("requeue", "test"),
        ("retry", "fixed"),
        ("discard", "cursed for good"),
    ]


async def test_the_console_reads_as_the_report_role(
    pool: db.Pool, roles: dict[str, str], settings: Settings
) -> None:
    await append(pool, "c", [Event("t", {})] * 2, settings=settings)
    report = await db.create_pool(roles["outbox_report"], min_size=1, max_size=1)
    try:
        transport = httpx.ASGITransport(app=create_app(report, settings=settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as console:
            body = (await console.get("/api/overview")).json()
            pages = {
                path: await console.get(path)
                for path in (
                    "/api/failures",
                    "/api/blocked",
                    "/api/campaign?id=c",
                    "/api/workers",
                    "/api/system",
                    "/api/projectors",
                )
            }
            # A dry run is a read (the requeue locks its rows only when it writes, bucket by
            # bucket): the report role may preview what a requeue would take.
            preview = await console.get("/api/failures/requeue?fingerprint=0123456789ab")
    finally:
        await report.close()
    assert body["error"] is None
    assert body["data"]["overview"]["counts"]["pending"] == 2
    for path, response in pages.items():
        assert response.status_code == 200, (path, response.text)
    assert len(pages["/api/campaign?id=c"].json()["data"]["rows"]) == 2
    assert preview.status_code == 200, preview.text
    assert "error" not in preview.json() or preview.json()["error"] is None


async def test_the_consumer_role_claims_and_releases_and_no_more(
    pool: db.Pool, roles: dict[str, str]
) -> None:
    at = datetime(2026, 11, 18, 9, 30, tzinfo=UTC)
    consumer = await db.connect(roles["outbox_consumer"])
    try:
        async with consumer.transaction():
            assert await dedup.claim_in_transaction(consumer, "billing", "m-1", at)
        assert not await dedup.claim_now(consumer, "billing", "m-1", at)
        assert await dedup.release(consumer, "billing", "m-1", at)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await consumer.execute("DELETE FROM outbox.event_journal")
    finally:
        await consumer.close()
