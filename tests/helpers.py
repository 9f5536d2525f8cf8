"""What tests share: the repository's paths, DSN surgery, counts read straight from the
database, the CLIs as subprocesses, and the one polling helper.

Only `wait_for` polls, and only database state (which offers no event to await); a running
service is waited on through its signals (`service.signals`, `service.wait_listening()`).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio

from outbox import db
from outbox.buckets import DEFAULT_COUNT, bucket_of

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
BIN = Path(sys.executable).parent
# The demo domain and the examples (outside the package): the CLIs a test starts import them.
EXAMPLES = ROOT / "docs" / "examples"
# `outbox-worker` from the checkout, as the fault tier and the process tests start it.
WORKER = [sys.executable, str(ROOT / "cmd" / "outbox-worker.py")]
# The advisory lock a test holds to freeze a projector of `worker_apps` mid-batch.
FREEZE_LOCK = 4242
# A password in every form a DSN carries one; none may show in a log line, repr or error.
# Closed loopback port: a connection is refused at once.
CANARY = "CANARY-9f3e"
DSNS = {
    "userinfo": f"postgresql://app:{CANARY}@127.0.0.1:1/db",
    "at_sign": f"postgresql://app:pa@ss-{CANARY}@127.0.0.1:1/db",
    "query": f"postgresql://app@127.0.0.1:1/db?sslmode=disable&password={CANARY}",
    "query_first": f"postgresql://app@127.0.0.1:1/db?password={CANARY}&sslmode=disable",
    "percent_encoded": "postgresql://app:" + quote(f"p@ss/{CANARY}", safe="") + "@127.0.0.1:1/db",
}


class Clock:
    """An injected clock for the worker; starts at the real time and only moves when told."""

    def __init__(self) -> None:
        self.at = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def campaigns_in_one_bucket(n: int, prefix: str = "c") -> list[str]:
    """`n` campaign ids in one bucket (of the tests' schema, DEFAULT_COUNT buckets), in id order:
    what one batch can claim together (a batch claims in one bucket)."""
    wanted = bucket_of(f"{prefix}-0", DEFAULT_COUNT)
    names = (f"{prefix}-{i}" for i in itertools.count())
    return sorted(itertools.islice((c for c in names if bucket_of(c, DEFAULT_COUNT) == wanted), n))


# The tables 0.1.0's migrations (0001-0003) create, in the outbox's schema.
TABLES_0_1_0 = (
    "event_journal",
    "campaign_heads",
    "projection_apply_outbox",
    "projection_apply_campaigns",
    "projection_checkpoints",
    "processed_markers",
    "append_idempotency_keys",
    "consumer_claims",
    "outbox_workers",
    "outbox_requeue_audit",
)
TABLES = (
    "event_journal",
    "campaign_heads",
    "projection_apply_outbox",
    "append_idempotency_keys",
)


async def counts(executor: db.Executor) -> dict[str, int]:
    """Row counts of the append path's tables."""
    async with db.acquire(executor) as conn:
        return {t: await conn.fetchval(f"SELECT count(*) FROM outbox.{t}") for t in TABLES}


async def queue_count(
    executor: db.Executor, *, status: str | None = None, campaign_id: str | None = None
) -> int:
    """Work rows, of one status and one campaign when given."""
    async with db.acquire(executor) as conn:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM outbox.projection_apply_outbox "
            "WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR campaign_id = $2)",
            status,
            campaign_id,
        )
    return n


async def journal_seqs(executor: db.Executor, campaign_id: str) -> list[int]:
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(
            "SELECT seq FROM outbox.event_journal WHERE campaign_id = $1 ORDER BY seq", campaign_id
        )
    return [r["seq"] for r in rows]


def run_cli(
    prog: str, *args: str, dsn: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """An installed console script as a subprocess, with no OUTBOX_* from the test's own
    environment (only OUTBOX_DSN when `dsn` is given, and `env`)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    environ["PYTHONPATH"] = _with_examples(environ.get("PYTHONPATH"))
    if dsn:
        environ["OUTBOX_DSN"] = dsn
    environ.update(env or {})
    return subprocess.run(
        [str(BIN / prog), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=environ,
    )


def _with_examples(path: str | None) -> str:
    return os.pathsep.join([str(EXAMPLES), *([path] if path else [])])


def worker_env(dsn: str, **extra: str) -> dict[str, str]:
    """The environment of a worker subprocess: this one's, the DSN, info logs, the examples on
    the path, `extra`."""
    python_path = _with_examples(os.environ.get("PYTHONPATH"))
    return {
        **os.environ,
        "OUTBOX_DSN": dsn,
        "OUTBOX_LOG_LEVEL": "info",
        "PYTHONPATH": python_path,
        **extra,
    }


async def wait_for(
    check: Callable[[], Awaitable[bool]], *, within: float = 30, interval: float = 0.02
) -> None:
    """Poll database state until `check()` holds; TimeoutError after `within` seconds."""
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 - database state offers no event to await
            await anyio.sleep(interval)


async def session_id(conn: db.Connection, *, on_citus: bool) -> int:
    """What names `conn`'s session in lock waits: its backend pid, or (Citus, where the wait
    happens on the worker node that holds the row) its global pid."""
    sql = "SELECT citus_backend_gpid()" if on_citus else "SELECT pg_backend_pid()"
    session: int = await conn.fetchval(sql)
    return session


async def is_blocked(pool: db.Pool, session: int, *, on_citus: bool) -> bool:
    """Whether the session (`session_id`) waits for a lock now."""
    sql = (
        "SELECT EXISTS (SELECT 1 FROM citus_lock_waits WHERE waiting_gpid = $1)"
        if on_citus
        else "SELECT cardinality(pg_blocking_pids($1)) > 0"
    )
    blocked: bool = await pool.fetchval(sql, session)
    return blocked


async def wait_until_blocked(pool: db.Pool, session: int, *, on_citus: bool) -> None:
    """Until the session (`session_id`) waits for a lock."""
    await wait_for(lambda: is_blocked(pool, session, on_citus=on_citus))


async def blocked_then_released(
    pool: db.Pool,
    work: Callable[[db.Connection], Coroutine[Any, Any, None]],
    release: Callable[[], Awaitable[None]],
    *,
    on_citus: bool,
) -> None:
    """Run `work` on a connection of its own until it waits for a lock, then `release()` (what
    ends the lock it waits for: a commit), and wait for `work` to finish."""
    async with pool.acquire() as conn:
        session = await session_id(conn, on_citus=on_citus)
        async with anyio.create_task_group() as tg:
            tg.start_soon(work, conn)
            await wait_until_blocked(pool, session, on_citus=on_citus)
            await release()


@asynccontextmanager
async def frozen(pool: db.Pool) -> AsyncIterator[db.Connection]:
    """Hold the advisory lock the freezing projectors of `worker_apps` wait on."""
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", FREEZE_LOCK)
        try:
            yield conn
        finally:
            await conn.execute("SELECT pg_advisory_unlock_all()")


async def projector_is_waiting(pool: db.Pool) -> bool:
    """Whether a projector waits on an advisory lock (the test's `frozen` one)."""
    n = await pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    return bool(n)


async def queue_campaigns(executor: db.Executor) -> None:
    """Queue the campaigns of work rows a test inserted by hand, as `maintenance reconcile`
    does for rows written around the append (the append queues its own campaign)."""
    from outbox.queue.repair import list_unqueued_campaigns
    from outbox.queue.settle import refresh_campaigns

    async with db.acquire(executor) as conn:
        orphans = await list_unqueued_campaigns(conn, None)
        await refresh_campaigns(conn, orphans, park=True, removable=())


@asynccontextmanager
async def login_role(pool: db.Pool, dsn: str, *alter: str) -> AsyncIterator[tuple[str, str]]:
    """A throwaway login role with every right on the schema's tables, sequences and functions
    (create the app's own tables first), `ALTER ROLE`d by each of `alter` (`CONNECTION LIMIT 0`,
    `SET default_transaction_read_only = on`): yields its name and `dsn` as that role."""
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    role = f"outbox_role_{uuid.uuid4().hex[:8]}"
    grants = " ".join(
        f"GRANT ALL ON ALL {kind} IN SCHEMA {schema} TO {role};"
        for kind in ("TABLES", "SEQUENCES")
        for schema in ("public", "outbox")
    )
    await pool.execute(
        f"CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA outbox TO {role}; {grants} "
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA outbox TO {role};"
        + "".join(f"ALTER ROLE {role} {change};" for change in alter)
    )
    parts = urlsplit(dsn)
    as_role = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    try:
        yield role, as_role
    finally:
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )
        await pool.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


# A read model per projector for the tracks' tests (S24, S25): each event's `n` added to its
# campaign's sum under the projector's name; the tests' oracle is what they appended.
SUMS = (
    "CREATE TABLE sums (projector text, campaign_id text, n bigint, "
    "PRIMARY KEY (projector, campaign_id))"
)
ADD = (
    "INSERT INTO sums VALUES ($1, $2, $3) ON CONFLICT (projector, campaign_id) "
    "DO UPDATE SET n = sums.n + excluded.n"
)


async def sums(pool: db.Pool, projector: str) -> Counter[str]:
    """`projector`'s sums, per campaign (none for a zero)."""
    rows = await pool.fetch("SELECT campaign_id, n FROM sums WHERE projector = $1", projector)
    return Counter({r["campaign_id"]: r["n"] for r in rows if r["n"]})
