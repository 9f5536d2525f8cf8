"""`maintenance` report and requeue commands as subprocesses against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

import orjson
import pytest
from campaigns_demo.app import install
from factories import make_dead, make_failed

from helpers import BIN, queue_count, run_cli
from outbox import Event, Settings, append, db


def cli(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("maintenance", *args, dsn=dsn)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return orjson.loads(proc.stdout)


async def seed(pool: db.Pool, settings: Settings) -> None:
    """c-a: 3 rows (head dead); c-b: 2 rows (head failed); c-c: 1 pending; c-d: 1 dead."""
    for campaign, n in [("c-a", 3), ("c-b", 2), ("c-c", 1), ("c-d", 1)]:
        await append(pool, campaign, [Event("t", {})] * n, settings=settings)
    await make_dead(pool, "c-a", 1, error="Boom: c-a", hours_ago=1)
    await make_dead(pool, "c-d", 1, error="Boom: c-d", hours_ago=2)
    await make_failed(pool, "c-b", 1, due_in=60)


async def test_report_json_contract(pool: db.Pool, dsn: str, settings: Settings) -> None:
    await seed(pool, settings)
    body = as_json(cli("outbox-report", "--json", "--limit", "4", dsn=dsn))
    assert set(body) == {"schema_version", "mode", "status", "limit", "summary", "rows"}
    assert (body["schema_version"], body["mode"], body["status"], body["limit"]) == (
        1,
        "outbox",
        None,
        4,
    )
    summary = body["summary"]
    assert summary["counts"] == {"pending": 4, "processing": 0, "failed": 1, "dead": 2}
    assert summary["total"] == 7
    oldest = summary["oldest_claimable"]
    assert set(oldest) == {"campaign_id", "seq", "enqueued_at", "age_seconds"}
    # c-a's rows wait behind its dead head, c-d's head is dead: the oldest claimable row is
    # c-b's failed head (seq 1), not c-a seq 2, which is older but not claimable.
    assert (oldest["campaign_id"], oldest["seq"]) == ("c-b", 1)
    assert isinstance(oldest["age_seconds"], float)
    assert isinstance(summary["earliest_next_attempt_at"], str)
    blocked = {b["campaign_id"]: b for b in summary["blocked_campaigns"]}
    assert set(blocked) == {"c-a", "c-b", "c-d"}
    assert (
        blocked["c-a"]["blocking_seq"],
        blocked["c-a"]["status"],
        blocked["c-a"]["waiting"],
    ) == (1, "dead", 2)
    assert (blocked["c-b"]["status"], blocked["c-b"]["waiting"]) == ("failed", 1)
    assert summary["parked_rows"] == []
    assert summary["workers"] == []
    assert summary["resolved_mode"] == "apply"
    assert summary["shadow"] == {"rows_seen": 0, "sightings": 0, "max_lag_seconds": None}
    assert len(body["rows"]) == 4
    row = body["rows"][0]
    assert set(row) == {
        "campaign_id",
        "seq",
        "event_type",
        "status",
        "attempt_count",
        "next_attempt_at",
        "enqueued_at",
        "updated_at",
        "last_error",
        "payload",
    }
    assert row["payload"] is None  # only with --payload
    # Failed and dead rows first, then claim order (next_attempt_at, seq): c-d before c-a.
    assert [(r["campaign_id"], r["seq"]) for r in body["rows"][:2]] == [("c-d", 1), ("c-a", 1)]


async def test_report_filters_and_aliases(pool: db.Pool, dsn: str, settings: Settings) -> None:
    await seed(pool, settings)
    dead = as_json(
        cli("outbox-report", "--outbox-status", "dead", "--outbox-limit", "100", "--json", dsn=dsn)
    )
    assert {(r["campaign_id"], r["status"]) for r in dead["rows"]} == {
        ("c-a", "dead"),
        ("c-d", "dead"),
    }
    one = as_json(cli("outbox-report", "--campaign-id", "c-b", "--json", dsn=dsn))
    assert one["summary"]["counts"] == {"pending": 1, "processing": 0, "failed": 1, "dead": 0}
    assert {r["campaign_id"] for r in one["rows"]} == {"c-b"}


async def test_report_table_shows_the_counts(pool: db.Pool, dsn: str, settings: Settings) -> None:
    await seed(pool, settings)
    proc = cli("outbox-report", dsn=dsn)
    assert proc.returncode == 0, proc.stderr
    lines = {ln.strip("│┃ ").split("│")[0].strip(): ln for ln in proc.stdout.splitlines()}
    for status, n in [("pending", 4), ("failed", 1), ("dead", 2), ("total", 7)]:
        assert f" {n} " in lines[status], lines.get(status)
    assert "blocked campaigns" in proc.stdout


@pytest.mark.parametrize(
    "value", ["x' OR '1'='1", "%", "_", "c-%", "'; DROP TABLE outbox.projection_apply_outbox; --"]
)
async def test_filters_are_bound_parameters(
    pool: db.Pool, dsn: str, settings: Settings, value: str
) -> None:
    await seed(pool, settings)
    body = as_json(cli("outbox-report", "--campaign-id", value, "--json", dsn=dsn))
    assert body["rows"] == []
    assert body["summary"]["total"] == 0
    missing = cli("outbox-requeue", "--campaign-id", value, "--seq", "1", dsn=dsn)
    assert missing.returncode == 1
    assert "no queued row" in missing.stderr
    dry = as_json(
        cli(
            "outbox-requeue-dead",
            "--limit",
            "10",
            "--campaign-id",
            value,
            "--event-type",
            value,
            "--dry-run",
            "--json",
            dsn=dsn,
        )
    )
    assert dry["rows"] == []
    assert await queue_count(pool) == 7


@pytest.mark.parametrize(
    "args",
    [
        ("outbox-report", "--status", "done"),
        ("outbox-report", "--limit", "0"),
        ("outbox-report", "--limit", "10001"),
        ("outbox-requeue", "--campaign-id", "c"),
        ("outbox-requeue", "--campaign-id", "c", "--seq", "0"),
        ("outbox-requeue-dead",),
        ("outbox-requeue-dead", "--limit", "0"),
    ],
)
def test_bad_usage_exits_2_with_one_line_without_connecting(args: tuple[str, ...]) -> None:
    # The DSN points nowhere: a connection attempt would end in exit 1, not 2.
    proc = cli(*args, dsn="postgresql://op:CANARY@127.0.0.1:1/none")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "CANARY" not in proc.stderr


def test_unreachable_database_exits_1_with_one_redacted_line() -> None:
    proc = cli("outbox-report", "--json", dsn="postgresql://op:CANARY@127.0.0.1:1/none")
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "CANARY" not in proc.stderr
    assert proc.stdout == ""


async def test_requeue_one_keeps_history_and_writes_the_audit(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await seed(pool, settings)
    body = as_json(
        cli(
            "outbox-requeue",
            "--campaign-id",
            "c-a",
            "--seq",
            "1",
            "--reason",
            "fixed projector",
            "--json",
            dsn=dsn,
        )
    )
    assert body == {
        "schema_version": 1,
        "mode": "outbox-requeue",
        "campaign_id": "c-a",
        "seq": 1,
        "requeued": True,
    }
    row = await pool.fetchrow(
        "SELECT status, attempt_count, next_attempt_at <= clock_timestamp() "
        "AS due FROM outbox.projection_apply_outbox WHERE campaign_id = 'c-a' AND seq = 1"
    )
    assert row is not None
    assert (row["status"], row["attempt_count"], row["due"]) == ("pending", 0, True)
    audit = await pool.fetchrow("SELECT * FROM outbox.outbox_requeue_audit")
    assert audit is not None
    assert (
        audit["campaign_id"],
        audit["seq"],
        audit["previous_status"],
        audit["previous_attempt_count"],
        audit["previous_last_error"],
        audit["reason"],
    ) == ("c-a", 1, "dead", 8, "Boom: c-a", "fixed projector")
    assert audit["actor"]
    # Not dead any more, or not there: exit 1 with a clear line.
    again = cli("outbox-requeue", "--campaign-id", "c-a", "--seq", "1", dsn=dsn)
    assert again.returncode == 1
    assert "is pending, not dead" in again.stderr
    missing = cli(
        "outbox-requeue",
        "--outbox-requeue-campaign-id",
        "nope",
        "--outbox-requeue-seq",
        "9",
        dsn=dsn,
    )
    assert missing.returncode == 1
    assert "no queued row 'nope' seq 9" in missing.stderr


async def test_requeue_refuses_a_row_held_by_a_running_batch(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await seed(pool, settings)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT 1 FROM outbox.projection_apply_outbox WHERE campaign_id = 'c-d' FOR UPDATE"
        )
        proc = await asyncio.to_thread(
            cli, "outbox-requeue", "--campaign-id", "c-d", "--seq", "1", dsn=dsn
        )
    assert proc.returncode == 1
    assert "held by a running batch" in proc.stderr
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 0


async def test_requeue_dead_oldest_first_with_limit_and_audit(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await seed(pool, settings)
    dry = as_json(cli("outbox-requeue-dead", "--limit", "5", "--dry-run", "--json", dsn=dsn))
    assert (dry["dry_run"], dry["matched"], dry["requeued"]) == (True, 2, 0)
    assert [(r["campaign_id"], r["seq"]) for r in dry["rows"]] == [("c-d", 1), ("c-a", 1)]
    # A preview needs no --limit: it shows what a requeue would take, up to the report's cap.
    unbounded = as_json(cli("outbox-requeue-dead", "--dry-run", "--json", dsn=dsn))
    assert (unbounded["limit"], unbounded["rows"]) == (10_000, dry["rows"])
    quiet = as_json(
        cli("outbox-requeue-dead", "--limit", "5", "--dry-run", "--quiet", "--json", dsn=dsn)
    )
    assert quiet == {k: v for k, v in dry.items() if k != "rows"}
    table = cli("outbox-requeue-dead", "--limit", "5", "--dry-run", "-q", dsn=dsn)
    assert table.returncode == 0
    assert table.stdout == ""
    assert "2 row(s) would be requeued" in table.stderr
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 0
    first = as_json(
        cli("outbox-requeue-dead", "--outbox-requeue-dead-limit", "1", "--json", dsn=dsn)
    )
    assert (first["mode"], first["limit"], first["requeued"]) == ("outbox-requeue-dead", 1, 1)
    assert set(first) == {
        "schema_version",
        "mode",
        "limit",
        "dry_run",
        "matched",
        "requeued",
        "rows",
    }
    assert set(first["rows"][0]) == {
        "campaign_id",
        "seq",
        "event_type",
        "attempt_count",
        "last_error",
        "next_attempt_at",
    }
    assert [(r["campaign_id"], r["seq"]) for r in first["rows"]] == [("c-d", 1)]
    rest = as_json(cli("outbox-requeue-dead", "--limit", "10", "--json", dsn=dsn))
    assert [(r["campaign_id"], r["seq"]) for r in rest["rows"]] == [("c-a", 1)]
    assert await queue_count(pool, status="dead") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 2
    # `maintenance audit` lists them newest first, with the rows as they were.
    audit = as_json(cli("audit", "--json", dsn=dsn))
    assert (audit["mode"], audit["campaign_id"], audit["limit"]) == ("audit", None, 50)
    entries = [(e["action"], e["campaign_id"], e["seq"]) for e in audit["entries"]]
    assert entries == [("requeue", "c-a", 1), ("requeue", "c-d", 1)]
    assert audit["entries"][0]["previous_status"] == "dead"
    assert audit["entries"][0]["previous_last_error"] == "Boom: c-a"
    one = as_json(cli("audit", "--campaign-id", "c-d", "--limit", "1", "--json", dsn=dsn))
    assert [e["campaign_id"] for e in one["entries"]] == ["c-d"]
    table = cli("audit", dsn=dsn)
    assert table.returncode == 0, table.stderr
    assert "Boom: c-a" in table.stdout


async def test_cleanup_honours_retention_and_batch_size(pool: db.Pool, dsn: str) -> None:
    await pool.execute(
        "INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload) "
        "SELECT outbox.outbox_bucket('c'), 'c', g, 't', '{}' FROM generate_series(1, 30) g;"
        # 25 markers 10 days old, 5 fresh.
        "INSERT INTO outbox.processed_markers (bucket, campaign_id, seq, handler, applied_at) "
        "SELECT outbox.outbox_bucket('c'), 'c', g, 'h', clock_timestamp() - CASE WHEN g <= 25 "
        "THEN interval '10 days' ELSE interval '10 minutes' END FROM generate_series(1, 30) g;"
        "INSERT INTO outbox.append_idempotency_keys (bucket, campaign_id, idem_key, "
        "expires_at) VALUES "
        "(outbox.outbox_bucket('c'), 'c', 'old', clock_timestamp() - interval '1 s'),"
        "(outbox.outbox_bucket('c'), 'c', 'live', clock_timestamp() + interval '1 day');"
        "INSERT INTO outbox.consumer_claims (scope, event_id, bucket, event_time) VALUES "
        "('s', 'old', current_date - 30, now() - interval '30 days'),"
        "('s', 'new', current_date, now());"
        "INSERT INTO outbox.outbox_workers (worker_id, host, pid, mode, heartbeat_at, "
        "stopped_at) VALUES "
        "('gone', 'h', 1, 'apply', now() - interval '30 days', now() - interval '30 days'),"
        "('live', 'h', 2, 'apply', now(), NULL)"
    )
    body = as_json(cli("cleanup", "--batch-size", "7", "--json", dsn=dsn))
    assert body == {
        "schema_version": 1,
        "mode": "cleanup",
        "removed": {
            "processed_markers": 25,
            "append_idempotency_keys": 1,
            "consumer_claims": 1,
            "outbox_workers": 1,
        },
    }
    assert await pool.fetchval("SELECT count(*) FROM outbox.processed_markers") == 5
    # Ten-minute-old markers outlive a one-hour retention; the keys, claims, workers left are live.
    body = as_json(cli("cleanup", "--markers-retention-hours", "1", "--json", dsn=dsn))
    assert body["removed"]["processed_markers"] == 0
    assert await pool.fetchval("SELECT idem_key FROM outbox.append_idempotency_keys") == "live"
    assert await pool.fetchval("SELECT event_id FROM outbox.consumer_claims") == "new"
    assert await pool.fetchval("SELECT worker_id FROM outbox.outbox_workers") == "live"


async def test_health_exit_codes(
    pool: db.Pool, dsn: str, fresh_db: str, settings: Settings
) -> None:
    ok = cli("health", "--json", dsn=dsn)
    body = as_json(ok)
    assert (body["mode"], body["healthy"], body["migrations"]) == ("health", True, "current")
    await append(pool, "c", [Event("t", {})], settings=settings)
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox SET enqueued_at = now() - interval '1 hour'"
    )
    assert cli("health", "--max-oldest-age", "7200", dsn=dsn).returncode == 0
    old = cli("health", "--max-oldest-age", "60", dsn=dsn)
    assert old.returncode == 1
    assert "oldest claimable row 'c' seq 1 is" in old.stderr
    assert "s old, over 60s" in old.stderr
    unmigrated = cli("health", dsn=fresh_db)
    assert unmigrated.returncode == 1
    assert "maintenance migrate" in unmigrated.stderr
    down = cli("health", dsn="postgresql://op@127.0.0.1:1/none")
    assert down.returncode == 1
    assert "cannot connect" in down.stderr


def test_every_command_says_an_unmigrated_database_in_the_same_line(fresh_db: str) -> None:
    """Not the driver's UndefinedTableError: the line health and the worker print."""
    line = (
        "maintenance: error: the database is not migrated (no outbox in schema 'outbox'): "
        "run `maintenance migrate`"
    )
    for command in [
        ["outbox-report", "--json"],
        ["outbox-failures"],
        ["outbox-requeue-dead", "--limit", "5"],
        ["outbox-requeue", "--campaign-id", "c", "--seq", "1"],
        ["cleanup"],
        ["projectors"],
        ["projector-pause", "--projector", "p"],
        ["projector-pauses"],
        ["audit"],
    ]:
        proc = cli(*command, dsn=fresh_db)
        assert (proc.returncode, proc.stderr.strip().splitlines()) == (1, [line]), command


async def test_health_fails_on_dead_rows_and_blocked_campaigns_until_repaired(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    rolls = [Event("dice.rolled", {"value": 3}), Event("dice.rolled", {"value": 4})]
    await append(pool, "c", rolls, settings=settings)
    await make_dead(pool, "c", 1, error="boom")  # its campaign blocked behind it
    sick = cli("health", "--json", dsn=dsn)
    assert sick.returncode == 1
    body = orjson.loads(sick.stdout)  # the JSON is printed, then the exit says unhealthy
    assert (body["dead_rows"], body["blocked_campaigns"]) == (1, 1)
    # Seq 2 waits behind the dead head: nothing is claimable, so no oldest claimable age.
    assert body["oldest_claimable_age_seconds"] is None
    assert "1 dead row(s), over 0" in sick.stderr
    assert "1 blocked campaign(s), over 0 (oldest: 'c' at seq 1)" in sick.stderr
    allowed = cli("health", "--max-dead", "1", "--max-blocked", "1", dsn=dsn)
    assert allowed.returncode == 0, allowed.stderr
    # The repair: requeue, drain, healthy again.
    assert cli("outbox-requeue", "--campaign-id", "c", "--seq", "1", dsn=dsn).returncode == 0
    drained = run_cli("outbox-worker", "--app", "campaigns_demo.app:app", "--drain", dsn=dsn)
    assert drained.returncode == 0, drained.stderr
    report = as_json(cli("outbox-report", "--json", dsn=dsn))
    assert report["summary"]["counts"]["dead"] == 0
    healthy = cli("health", dsn=dsn)
    assert healthy.returncode == 0, healthy.stderr


async def test_global_dsn_option_reaches_the_command(dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    command = [str(BIN / "maintenance"), "--dsn", dsn, "outbox-report", "--json"]
    proc = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert as_json(proc)["summary"]["total"] == 0


async def test_the_report_reads_at_80_columns_without_cutting_ids(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    long_id = "tenant-0042/account-" + "9" * 40  # longer than any column at 80
    await append(pool, long_id, [Event("account.opened.with.a.long.type", {})], settings=settings)
    await make_dead(pool, long_id, error="x")
    narrow = run_cli("maintenance", "outbox-report", dsn=dsn, env={"COLUMNS": "80"})
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    # Folded, never cut: the id's characters all appear, in order, across the cells' lines.
    cells = "".join(
        line.split("│")[1].strip() for line in lines if line.startswith("│") and "│" in line[1:]
    )
    assert long_id in cells
    assert "…" not in narrow.stdout
    assert "80 columns: the rows' next attempt and enqueued times are left out" in narrow.stderr
    wide = run_cli("maintenance", "outbox-report", dsn=dsn, env={"COLUMNS": "200"})
    assert "enqueued" in wide.stdout
    assert "left out" not in wide.stderr


async def test_the_report_shows_the_shadow_workers_sightings_and_lag(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    await append(pool, "c", [Event("dice.rolled", {"value": 2})] * 2, settings=settings)
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox SET enqueued_at = now() - interval '30 s'"
    )
    shadow = run_cli(
        "outbox-worker",
        "--app",
        "campaigns_demo.app:app",
        "--mode",
        "shadow",
        "--drain-now",
        dsn=dsn,
    )
    assert shadow.returncode == 0, shadow.stderr
    body = as_json(cli("outbox-report", "--json", dsn=dsn))
    seen = body["summary"]["shadow"]
    assert (seen["rows_seen"], seen["sightings"]) == (2, 2)
    assert seen["max_lag_seconds"] >= 30  # S14: enqueue to first sighting, recorded
    table = cli("outbox-report", dsn=dsn)
    assert "shadow worker: 2 row(s) seen, 2 sighting(s), longest enqueue-to-sighting lag" in (
        table.stdout
    )


async def test_the_report_shows_payloads_and_prints_data_as_it_is(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    """`--payload` puts each listed row's event payload beside it; text from the data that
    looks like rich markup ("[red]", an unmatched "[/x]") is printed as it is."""
    note = {"note": "[/x] [red]not red[/red] <b>", "n": [1, 2]}
    await append(pool, "c-[/x]", [Event("t", note)], settings=settings)
    await make_dead(pool, "c-[/x]", error="Boom: [/oops] [bold]")
    body = as_json(cli("outbox-report", "--status", "dead", "--payload", "--json", dsn=dsn))
    assert [r["payload"] for r in body["rows"]] == [note]
    plain = as_json(cli("outbox-report", "--status", "dead", "--json", dsn=dsn))
    assert [r["payload"] for r in plain["rows"]] == [None]
    wide = {"COLUMNS": "400"}  # every cell on one line
    table = run_cli(
        "maintenance", "outbox-report", "--status", "dead", "--payload", dsn=dsn, env=wide
    )
    assert table.returncode == 0, table.stderr
    payload = '{"n":[1,2],"note":"[/x] [red]not red[/red] <b>"}'
    for text in ("c-[/x]", "[/oops] [bold]", payload):
        assert text in table.stdout, table.stdout


async def test_outbox_retry_makes_failed_rows_due_now_and_refuses_what_it_cannot(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await append(pool, "r1", [Event("t", {}), Event("t", {})], settings=settings)
    await append(pool, "r2", [Event("t", {})], settings=settings)
    await make_failed(pool, "r1", 1, due_in=300)  # waiting out a 300 s backoff
    await make_failed(pool, "r2", 1, due_in=300)
    await make_dead(pool, "r1", 2)
    due = "SELECT next_attempt_at <= clock_timestamp() FROM outbox.projection_apply_outbox "
    for args, message in [
        (["--campaign-id", "r1"], "--limit is required to retry a batch"),
        (["--seq", "1"], "--seq names a row with --campaign-id"),
        (["--campaign-id", "r1", "--seq", "1", "--limit", "5"], "--seq retries one row"),
    ]:
        refused = cli("outbox-retry", *args, dsn=dsn)
        assert refused.returncode == 2, refused.stderr
        assert message in refused.stderr
    dead = cli("outbox-retry", "--campaign-id", "r1", "--seq", "2", dsn=dsn)
    assert dead.returncode == 1
    assert "is dead, not failed (maintenance outbox-requeue gives it fresh attempts)" in (
        dead.stderr
    )
    one = as_json(cli("outbox-retry", "--campaign-id", "r1", "--seq", "1", "--json", dsn=dsn))
    assert (one["mode"], one["retried"]) == ("outbox-retry", True)
    assert await pool.fetchval(due + "WHERE campaign_id = 'r1' AND seq = 1")
    assert not await pool.fetchval(due + "WHERE campaign_id = 'r2'")
    batch = as_json(cli("outbox-retry", "--limit", "10", "--reason", "fixed", "--json", dsn=dsn))
    assert (batch["matched"], batch["retried"]) == (2, 2)  # every failed row, oldest first
    assert [(r["campaign_id"], r["attempt_count"]) for r in batch["rows"]] == [
        ("r1", 2),
        ("r2", 2),
    ]
    assert await pool.fetchval(due + "WHERE campaign_id = 'r2'")
    attempts = await pool.fetch(
        "SELECT attempt_count FROM outbox.projection_apply_outbox WHERE status = 'failed'"
    )
    assert [r[0] for r in attempts] == [2, 2]  # kept: a retry refills no budget
    actions = await pool.fetch(
        "SELECT action, reason FROM outbox.outbox_requeue_audit ORDER BY audit_id"
    )
    assert [tuple(r) for r in actions] == [("retry", None), ("retry", "fixed"), ("retry", "fixed")]
