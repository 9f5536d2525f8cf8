"""Failures an operator can act on: the projector's name in last_error, the traceback in the
dead-letter's log line, failures first in the report."""

from __future__ import annotations

import logging

import pytest
from factories import make_dead

from outbox import Event, Settings, db
from outbox.model import StoredEvent
from outbox.ops.report import outbox_report
from outbox.projection.app import Outbox
from outbox.worker.batch import Worker


def bank(dsn: str, *, max_attempts: int = 8) -> Outbox:
    app = Outbox(Settings(dsn=dsn, max_attempts=max_attempts, backoff_base=0.01))

    @app.projector("balances", events=["deposited", "memo.added"])
    async def balances(tx: db.Connection, event: StoredEvent) -> None:
        return None

    @app.projector("alerts", events=["memo.added"], ordered=False)
    async def alerts(tx: db.Connection, event: StoredEvent) -> None:
        fields: dict[str, str] = {}
        fields[event.payload["memo_key"]] = fields["memo"]  # KeyError: 'memo'

    return app


async def test_last_error_names_the_projector(pool: db.Pool, dsn: str) -> None:
    app = bank(dsn)
    await app.append(pool, "acct", [Event("deposited", {}), Event("memo.added", {"memo_key": "x"})])
    counts = await Worker(app, pool).run_once()
    # The memo applied to `balances`; `alerts` failed on it and holds only itself (S24).
    assert (counts.applied, counts.failed) == (2, 1)
    error = await pool.fetchval("SELECT last_error FROM outbox.projection_apply_outbox")
    assert error == "projector 'alerts': KeyError: 'memo'"


async def test_the_dead_letter_logs_its_traceback_at_warning(
    pool: db.Pool, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = bank(dsn, max_attempts=2)
    await app.append(pool, "acct", [Event("memo.added", {"memo_key": "x"})])
    worker = Worker(app, pool)
    with caplog.at_level(logging.DEBUG, logger="outbox"):
        await worker.run_once()  # attempt 1: debug
        await pool.execute("UPDATE outbox.projection_apply_outbox SET next_attempt_at = now()")
        await pool.execute("UPDATE outbox.projection_apply_campaigns SET due_at = now()")
        await worker.run_once()  # attempt 2: dead, warning
    lines = [r for r in caplog.records if getattr(r, "event", "") in ("apply.failed", "apply.dead")]
    assert [(r.__dict__["event"], r.levelno) for r in lines] == [
        ("apply.failed", logging.DEBUG),
        ("apply.dead", logging.WARNING),
    ]
    dead = lines[1].__dict__
    assert dead["error"] == "projector 'alerts': KeyError: 'memo'"
    assert (dead["campaign_id"], dead["seq"], dead["projector"]) == ("acct", 1, "alerts")
    # Whatever format the application logs with, the line itself says what failed and where.
    assert lines[1].getMessage() == (
        "apply.dead campaign_id='acct' seq=1 projector='alerts' attempt=2 "
        "error=projector 'alerts': KeyError: 'memo'"
    )
    assert dead["traceback"].startswith("Traceback (most recent call last):")
    assert "fields[event.payload" in dead["traceback"]
    assert dead["traceback"].endswith("KeyError: 'memo'")


async def test_the_report_lists_failures_first(pool: db.Pool, dsn: str) -> None:
    app = bank(dsn)
    # Many healthy rows queued before the one that fails: the failure still comes first.
    for n in range(5):
        await app.append(pool, f"ok-{n}", [Event("deposited", {})])
    await app.append(pool, "bad", [Event("memo.added", {"memo_key": "x"})])
    worker = Worker(app, pool)
    # A long backoff: by claim order alone, the failed row would come after every pending one.
    app.settings = app.settings.replace(batch_size=1, backoff_base=60)
    for _ in range(10):
        if (await worker.run_once()).failed:
            break
    for n in range(5, 8):
        await app.append(pool, f"ok-{n}", [Event("deposited", {})])
    report = await outbox_report(pool, limit=3)
    assert report.rows[0].campaign_id == "bad"
    assert (report.rows[0].last_error or "").startswith("projector 'alerts'")
    filtered = await outbox_report(pool, status="pending", limit=3)
    assert [r.status for r in filtered.rows] == ["pending"] * 3


async def test_nothing_is_claimable_while_a_campaigns_rows_wait_behind_its_dead_head(
    pool: db.Pool, dsn: str
) -> None:
    """docs/cli.md: `oldest_claimable` is null when no row can be claimed now, though rows
    are pending: they wait behind a dead head, and `blocked_campaigns` says so."""
    app = bank(dsn)
    await app.append(pool, "c", [Event("deposited", {})] * 2)
    await make_dead(pool, "c", 1)
    report = await outbox_report(pool)
    assert (report.summary.counts.pending, report.summary.counts.dead) == (1, 1)
    assert report.summary.oldest_claimable is None
    assert [b.campaign_id for b in report.summary.blocked_campaigns] == ["c"]
    # Under park, a dead row blocks nothing: the row behind it is claimable.
    parked = await outbox_report(pool, park=True)
    assert parked.summary.oldest_claimable is not None
    assert (parked.summary.oldest_claimable.campaign_id, parked.summary.oldest_claimable.seq) == (
        "c",
        2,
    )


# --- error groups (maintenance outbox-failures, outbox-requeue-dead --error) ----------------


def poisoned(dsn: str) -> Outbox:
    """`totals` raises on negative amounts (the message carries the amount and the order id);
    `mailer` times out on every `order.placed` with a PermanentError (dead at once)."""
    from outbox.errors import PermanentError

    app = Outbox(Settings(dsn=dsn, max_attempts=1, backoff_base=0.01, dead_policy="park"))

    @app.projector("totals", events=["order.placed"], ordered=False)
    async def totals(tx: db.Connection, event: StoredEvent) -> None:
        amount = event.payload["amount"]
        if amount < 0:
            raise ValueError(f"bad amount {amount} in order '{event.campaign_id}'")

    @app.projector("mailer", events=["order.shipped"], ordered=False)
    async def mailer(tx: db.Connection, event: StoredEvent) -> None:
        raise PermanentError(f"smtp timed out after {event.seq * 10} s")

    return app


async def test_failures_group_by_projector_and_error_shape(pool: db.Pool, dsn: str) -> None:
    from outbox.ops.report import failures
    from outbox.ops.requeue import requeue_dead

    app = poisoned(dsn)
    for i in range(6):  # 4 bad amounts, 2 timeouts, 6 good events
        await app.append(
            pool,
            f"o-{i}",
            [
                Event("order.placed", {"amount": -i - 1 if i < 4 else i}),
                Event("order.placed", {"amount": 5}),
                *([Event("order.shipped", {})] if i >= 4 else []),
            ],
        )
    await Worker(app, pool).drain()
    result = await failures(pool)
    assert result.scanned == 6
    groups = [(g.status, g.projector, g.shape, g.rows) for g in result.groups]
    assert groups == [
        ("dead", "totals", "ValueError: bad amount ? in order ?", 4),
        ("dead", "mailer", "PermanentError: smtp timed out after ? s", 2),
    ]
    bad = result.groups[0]
    assert bad.event_types == ["order.placed"]
    assert (bad.latest_error or "").startswith("projector 'totals': ")
    # A bound on the rows read: the counts are of those, and the result says so.
    small = await failures(pool, scan=3)
    assert (small.scanned, sum(g.rows for g in small.groups)) == (3, 3)
    assert [g.rows for g in (await failures(pool, status="failed")).groups] == []
    # The group's fingerprint selects exactly its rows: a dry run lists them, a requeue moves them.
    dry = await requeue_dead(pool, limit=100, fingerprint=bad.fingerprint, dry_run=True)
    assert sorted(r.campaign_id for r in dry.rows) == ["o-0", "o-1", "o-2", "o-3"]
    done = await requeue_dead(pool, limit=100, fingerprint=bad.fingerprint, reason="fixed")
    assert done.requeued == 4
    left = await failures(pool)
    assert [(g.projector, g.rows) for g in left.groups] == [("mailer", 2)]
