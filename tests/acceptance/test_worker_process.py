"""The worker as a process: --drain, bad input, SIGTERM, SIGKILL, NOTIFY wake-ups, LISTEN loss.

Waits are bounded waits on database state (a row gone, a lock waited on), never sleeps that
hope something happened.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import anyio
import orjson
import pytest
from anyio.abc import Process
from campaigns_demo.app import install

from helpers import (
    BIN,
    TESTS,
    WORKER,
    frozen,
    login_role,
    projector_is_waiting,
    queue_campaigns,
    queue_count,
    wait_for,
    worker_env,
)
from outbox import Event, Settings, append, db


async def rows(pool: db.Pool) -> list[tuple[str, int, str, int]]:
    return [
        (r["campaign_id"], r["seq"], r["status"], r["attempt_count"])
        for r in await pool.fetch(
            "SELECT campaign_id, seq, status, attempt_count "
            "FROM outbox.projection_apply_outbox ORDER BY 1, 2"
        )
    ]


async def test_drain_now_applies_what_is_due_and_prints_a_summary(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    await append(pool, "c", [Event("dice.rolled", {"value": 3})] * 5, settings=settings)
    await append(pool, "x", [Event("dice.cursed", {})], settings=settings)
    # The failed row's backoff outlasts the drain: with the default (0.5-1 s) a slow machine
    # lets it come due again before the last loop finds nothing, and drain-now rightly retries.
    env = worker_env(dsn, OUTBOX_BACKOFF_BASE="3600", OUTBOX_BACKOFF_CAP="3600")
    proc = await anyio.run_process(
        [*WORKER, "--app", "campaigns_demo.app:app", "--drain-now", "--concurrency", "3"],
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().strip() == "drained: applied=5 skipped=0 failed=1 dead=0"
    assert await rows(pool) == [("x", 1, "failed", 1)]


async def test_drain_waits_out_backoffs_and_says_what_it_left(pool: db.Pool, dsn: str) -> None:
    await pool.execute("CREATE TABLE applied (campaign_id text, seq bigint)")
    settings = Settings(dsn=dsn)
    await append(pool, "ok", [Event("tick", {}), Event("tick", {})], settings=settings)
    await append(pool, "bad", [Event("poison", {}), Event("tick", {})], settings=settings)
    env = worker_env(dsn, OUTBOX_BACKOFF_BASE="0.2", OUTBOX_BACKOFF_CAP="0.2")
    proc = await anyio.run_process(
        [*WORKER, "--app", "worker_apps:flaky", "--drain"], cwd=TESTS, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    # `ok`'s first event failed once: `flaky` was held on `ok` (S24), its second event left
    # in the hold, and after the backoff `flaky` applied the first and went on through the
    # journal. `bad`'s second event waits in `flaky`'s dead hold on `bad`, its row gone.
    assert lines[0] == "drained: applied=2 skipped=0 failed=1 dead=1 held=2"
    assert lines[1].startswith("left: dead=1 (dead rows wait for an operator")
    assert await pool.fetchval("SELECT array_agg(seq ORDER BY seq) FROM applied") == [1, 2]
    assert await rows(pool) == [("bad", 1, "dead", 1)]
    as_json = await anyio.run_process(
        [*WORKER, "--app", "worker_apps:flaky", "--drain", "--json"], cwd=TESTS, env=env
    )
    body = orjson.loads(as_json.stdout)
    assert (body["mode"], body["until"], body["counts"]["applied"]) == ("drain", "done", 0)
    assert body["left"] == {
        "pending": 0,
        "processing": 0,
        "failed": 0,
        "dead": 1,
        "blocked_campaigns": 0,
    }


async def test_every_worker_line_carries_its_worker_id_in_json_or_text(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    await append(pool, "c", [Event("dice.rolled", {"value": 3})], settings=settings)
    command = [*WORKER, "--app", "campaigns_demo.app:app", "--drain-now", "--log-level", "debug"]
    proc = await anyio.run_process(command, env=worker_env(dsn))
    lines = [orjson.loads(line) for line in proc.stderr.decode().splitlines()]
    assert {"worker.started", "batch.done"} <= {line["event"] for line in lines}
    ids = {line["worker_id"] for line in lines}
    assert len(ids) == 1
    assert ids.pop().count(":") == 2  # host:pid:random
    # At the default level (info) a batch logs nothing: batch.done is a debug line.
    await append(pool, "c", [Event("dice.rolled", {"value": 4})], settings=settings)
    info = command[:-2]
    text = await anyio.run_process([*info, "--log-format", "text"], env=worker_env(dsn))
    assert " batch.done " not in text.stderr.decode()
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    started = [ln for ln in text.stderr.decode().splitlines() if " worker.started " in ln]
    assert len(started) == 1
    assert " info    worker.started " in started[0]
    assert "worker_id=" in started[0]
    bad = await anyio.run_process(
        [*command, "--log-format", "xml"], env=worker_env(dsn), check=False
    )
    assert bad.returncode == 2
    assert bad.stderr.decode().count("\n") == 1
    assert "unknown log format 'xml'" in bad.stderr.decode()


async def test_every_stderr_line_is_json_with_its_event_and_no_password(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    """A run with a user logger and a shutdown that cancels the batch in flight: every line on
    stderr parses as JSON, carries `event` and `worker_id`, and the DSN's password (a canary:
    the test server trusts local connections) appears nowhere."""
    canary = "Canary-Pw-7731"
    parts = urlsplit(dsn)
    with_password = urlunsplit(
        parts._replace(netloc=f"{parts.username}:{canary}@{parts.hostname}:{parts.port}")
    )
    await append(pool, "c", [Event("tick", {})], settings=settings)
    async with frozen(pool):
        proc = await anyio.open_process(
            [*WORKER, "--app", "worker_apps:chatty", "--shutdown-timeout", "0.5"],
            cwd=TESTS,
            env=worker_env(with_password),
        )
        try:
            await wait_for(lambda: projector_is_waiting(pool))
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                code = await proc.wait()
            assert proc.stderr is not None
            stderr = (await proc.stderr.receive(1 << 20)).decode()
            while chunk := await _more(proc):
                stderr += chunk
        finally:
            if proc.returncode is None:
                proc.kill()
    assert code == 0
    assert canary not in stderr
    lines = [orjson.loads(line) for line in stderr.splitlines()]
    assert all("event" in line and "worker_id" in line for line in lines), lines
    events = [line["event"] for line in lines]
    assert "user.note" in events  # the application's own logger
    assert "worker.stopping" in events
    user = next(line for line in lines if line["event"] == "user.note")
    assert (user["logger"], user["seq"]) == ("myapp.projections", 1)


async def _more(proc: Process) -> str:
    assert proc.stderr is not None
    try:
        return (await proc.stderr.receive(1 << 20)).decode()
    except anyio.EndOfStream:
        return ""


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--app", "no_such_module:app"], 2, "cannot import 'no_such_module'"),
        (["--app", "worker_apps:not_an_app"], 2, "not an outbox.Outbox"),
        (["--app", "worker_apps"], 2, "expected module:attribute"),
        ([], 2, "no app given"),
        (["--app", "worker_apps:blocking", "--batch-size", "0"], 2, "OUTBOX_BATCH_SIZE"),
        (["--app", "worker_apps:blocking"], 2, "OUTBOX_ORDERING=none cannot serve ordered"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(
    dsn: str, args: list[str], code: int, message: str
) -> None:
    env = worker_env(
        dsn, **({"OUTBOX_ORDERING": "none"} if "OUTBOX_ORDERING=none" in message else {})
    )
    env.pop("OUTBOX_APP", None)
    proc = subprocess.run(
        [*WORKER, *args, "--drain"],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == code
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]


def test_missing_database_and_unmigrated_database_are_refused(fresh_db: str) -> None:
    for target, message in [
        ("postgresql://nobody@127.0.0.1:1/none", "cannot connect"),
        (fresh_db, "not migrated"),
    ]:
        proc = subprocess.run(
            [*WORKER, "--app", "worker_apps:blocking", "--drain"],
            cwd=TESTS,
            env=worker_env(target),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 1
        assert message in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


async def _start_blocked_worker(
    pool: db.Pool, dsn: str, settings: Settings, *, shutdown_timeout: float = 1
) -> Process:
    await pool.execute("CREATE TABLE applied (campaign_id text, seq bigint)")
    await append(pool, "c", [Event("tick", {}), Event("tick", {})], settings=settings)
    return await anyio.open_process(
        [*WORKER, "--app", "worker_apps:blocking", "--shutdown-timeout", str(shutdown_timeout)],
        cwd=TESTS,
        env=worker_env(dsn),
        stdin=None,
        stdout=None,
        stderr=None,
    )


async def _drain_again(dsn: str) -> None:
    proc = await anyio.run_process(
        [*WORKER, "--app", "worker_apps:blocking", "--drain"], cwd=TESTS, env=worker_env(dsn)
    )
    assert proc.returncode == 0


# What --shutdown-timeout promises, plus room for a loaded 2-core machine to tear down.
EXIT_MARGIN = 10.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_mid_batch_exits_0_within_the_timeout_and_loses_nothing(
    pool: db.Pool, dsn: str, settings: Settings, signum: signal.Signals
) -> None:
    async with frozen(pool):  # the batch never finishes: the deadline must cut it short
        proc = await _start_blocked_worker(pool, dsn, settings, shutdown_timeout=1)
        try:
            await wait_for(lambda: projector_is_waiting(pool))
            signalled = anyio.current_time()
            proc.send_signal(signum)
            with anyio.fail_after(60):
                code = await proc.wait()
            took = anyio.current_time() - signalled
        finally:
            if proc.returncode is None:
                proc.kill()
        assert code == 0
        assert took < 1 + EXIT_MARGIN, f"exit {took:.1f}s after the signal, timeout 1s"
        assert await rows(pool) == [("c", 1, "pending", 0), ("c", 2, "pending", 0)]
    await _drain_again(dsn)
    assert await pool.fetchval("SELECT array_agg(seq ORDER BY seq) FROM applied") == [1, 2]
    assert await rows(pool) == []


async def test_a_batch_that_finishes_before_the_deadline_commits(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    async with frozen(pool):
        proc = await _start_blocked_worker(pool, dsn, settings, shutdown_timeout=60)
        await wait_for(lambda: projector_is_waiting(pool))
        # The worker is stopping with its batch in flight; it waits for the projector.
        proc.send_signal(signal.SIGTERM)
    # The lock is released: the batch completes and commits before the worker exits.
    try:
        with anyio.fail_after(60):
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
    assert code == 0
    assert await pool.fetchval("SELECT array_agg(seq ORDER BY seq) FROM applied") == [1, 2]
    assert await rows(pool) == []


async def test_sigkill_mid_batch_applies_exactly_once_after_restart(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    async with frozen(pool):
        proc = await _start_blocked_worker(pool, dsn, settings)
        await wait_for(lambda: projector_is_waiting(pool))
        proc.kill()
        with anyio.fail_after(60):
            await proc.wait()
        assert await rows(pool) == [("c", 1, "pending", 0), ("c", 2, "pending", 0)]
    # The orphaned backend finds its client gone and rolls back; wait until it has left.
    await wait_for(lambda: _no_worker_sessions(pool))
    assert await rows(pool) == [("c", 1, "pending", 0), ("c", 2, "pending", 0)]
    await _drain_again(dsn)
    assert await pool.fetchval("SELECT array_agg(seq ORDER BY seq) FROM applied") == [1, 2]


async def _no_worker_sessions(pool: db.Pool) -> bool:
    n = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'outbox-%' "
        "AND datname = current_database()"
    )
    return bool(n == 0)


LISTENER = "SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-listener'"


@asynccontextmanager
async def running_worker(dsn: str, **env: str) -> AsyncIterator[None]:
    """The demo app's worker until SIGTERM, which must end it with exit 0."""
    proc = await anyio.open_process(
        [*WORKER, "--app", "campaigns_demo.app:app"],
        env=worker_env(dsn, **env),
        stdin=None,
        stdout=None,
        stderr=None,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(60):
            code = await proc.wait()
    assert code == 0


async def test_notify_wakes_a_worker_with_a_30s_poll_and_listen_comes_back(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await install(pool)
    async with running_worker(dsn, OUTBOX_POLL_INTERVAL="30"):
        await wait_for(lambda: _has(pool, LISTENER))
        # Applied well before the 30 s poll: the NOTIFY woke the worker.
        await append(pool, "c", [Event("dice.rolled", {"value": 1})], settings=settings)
        await wait_for(lambda: _queue_empty(pool), within=15)
        # Kill the LISTEN connection: it comes back as a new backend.
        old = await pool.fetchval(LISTENER)
        await pool.execute("SELECT pg_terminate_backend($1)", old)
        await wait_for(lambda: _has(pool, LISTENER + f" AND pid <> {int(old)}"), within=20)
        await append(pool, "c", [Event("dice.rolled", {"value": 2})], settings=settings)
        await wait_for(lambda: _queue_empty(pool), within=15)
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 3


async def test_poll_applies_rows_that_came_without_a_notify(pool: db.Pool, dsn: str) -> None:
    await install(pool)
    async with running_worker(dsn, OUTBOX_POLL_INTERVAL="0.2"):
        await wait_for(lambda: _has(pool, LISTENER))
        # Without NOTIFY (enqueued by SQL, no pg_notify), only the poll can find the row.
        await pool.execute(
            "INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload) "
            "VALUES (outbox.outbox_bucket('p'), 'p', 1, 'dice.rolled', '{\"value\": 4}');"
            "INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type) "
            "VALUES (outbox.outbox_bucket('p'), 'p', 1, 'dice.rolled')"
        )
        await queue_campaigns(pool)  # queued, as reconcile would: still no NOTIFY
        await wait_for(lambda: _queue_empty(pool), within=15)
    assert await pool.fetchval("SELECT total FROM demo_dice_totals") == 4


async def _has(pool: db.Pool, query: str) -> bool:
    return await pool.fetchval(query) is not None


async def _queue_empty(pool: db.Pool) -> bool:
    n = await queue_count(pool)
    return bool(n == 0)


# A role's start-up condition, what a drain's one line says, and what lifts the condition.
STARVED = {
    # No free connection (SQLSTATE 53300, what a full connection table gives).
    "no_free_connection": ("CONNECTION LIMIT 0", "TooManyConnectionsError", "CONNECTION LIMIT -1"),
    # Sessions that cannot write (a standby answers the same way, 25006, until promoted).
    "read_only": (
        "SET default_transaction_read_only = on",
        "cannot take writes: the session is read-only",
        "RESET default_transaction_read_only",
    ),
}


@pytest.mark.parametrize("condition", sorted(STARVED))
async def test_a_starting_worker_waits_for_a_usable_database_then_applies(
    pool: db.Pool, dsn: str, settings: Settings, condition: str
) -> None:
    """The worker's role may not open one more connection, or its sessions cannot write: the
    starting worker logs one line and waits instead of exiting, and applies an event appended
    meanwhile once the condition lifts. A drain still fails at once, in one line."""
    impose, drain_says, lift = STARVED[condition]
    await install(pool)  # the demo's tables first: the role's grants cover them
    async with login_role(pool, dsn, impose) as (role, starved):
        drain = await anyio.run_process(
            [*WORKER, "--app", "campaigns_demo.app:app", "--drain-now"],
            env=worker_env(starved),
            check=False,
        )
        assert drain.returncode == 1
        assert drain_says in drain.stderr.decode()
        async with await anyio.open_process(
            [*WORKER, "--app", "campaigns_demo.app:app", "--poll-interval", "0.1"],
            env=worker_env(starved),
        ) as proc:
            try:
                assert proc.stderr is not None
                seen = ""
                with anyio.fail_after(60):
                    while '"database.waiting"' not in seen:
                        seen += (await proc.stderr.receive()).decode()
                await append(pool, "c", [Event("dice.rolled", {"value": 2})], settings=settings)
                await pool.execute(f"ALTER ROLE {role} {lift}")

                async def applied() -> bool:
                    return await queue_count(pool, campaign_id="c") == 0

                await wait_for(applied, within=60)
                proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(60):
                    async for chunk in proc.stderr:
                        seen += chunk.decode()
                assert await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
        events = [orjson.loads(line)["event"] for line in seen.splitlines()]
        assert events.count("database.waiting") == 1  # one line per transition, not per try
        assert events.index("database.available") < events.index("worker.started")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_at_any_instant_of_start_up_ends_the_worker_cleanly(
    dsn: str, signum: signal.Signals
) -> None:
    """A supervisor that starts and stops workers quickly signals them while they import (the
    first half second and more), connect, check the schema or serve: at every instant the
    installed `outbox-worker` ends with no traceback, a SIGTERM with exit 0, a SIGINT with 0
    once serving (it finishes its batch) or 130 before. The instants are the
    faults injected, chosen by a seeded generator from 0.1 s (the interpreter itself starts in
    about 15 ms, before any of the program runs: the operating system's default action, as for
    any program) to well past start-up."""
    rng = random.Random(61 + signum)
    instants = [0.1, 0.2, 0.3, *(rng.uniform(0.1, 1.5) for _ in range(5))]
    for instant in instants:
        proc = subprocess.Popen(
            [str(BIN / "outbox-worker"), "--app", "worker_apps:shop"],
            cwd=TESTS,
            env=worker_env(dsn),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(instant)  # the fault's instant (not a wait for the process: see above)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        allowed = {0} if signum == signal.SIGTERM else {0, 130}
        assert proc.returncode in allowed, (instant, proc.returncode, err.decode())
        assert b"Traceback" not in err, (instant, err.decode())
        if proc.returncode == 130:  # one line, as docs/cli.md promises (typer's was silent)
            lines = err.decode().strip().splitlines()
            assert lines[-1:] == ["outbox-worker: error: interrupted"], (instant, lines)
