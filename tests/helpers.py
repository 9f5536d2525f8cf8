"""Small helpers shared by tests: DSN surgery and table counts read straight from the database."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio

from outbox import db

TABLES = (
    "event_journal",
    "campaign_heads",
    "projection_apply_outbox",
    "append_idempotency_keys",
)


def with_database(dsn: str, name: str) -> str:
    """The same server and credentials, another database."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path=f"/{name}"))
    return f"{dsn} dbname={name}"


async def counts(executor: db.Executor) -> dict[str, int]:
    """Row counts of the append path's tables."""
    async with db.acquire(executor) as conn:
        return {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES}


async def journal_seqs(executor: db.Executor, campaign_id: str) -> list[int]:
    async with db.acquire(executor) as conn:
        rows = await conn.fetch(
            "SELECT seq FROM event_journal WHERE campaign_id = $1 ORDER BY seq", campaign_id
        )
    return [r["seq"] for r in rows]


BIN = Path(sys.executable).parent


def run_cli(
    prog: str, *args: str, dsn: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """An installed console script as a subprocess, with no OUTBOX_* from the test's own
    environment (only OUTBOX_DSN when `dsn` is given, and `env`)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
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


async def wait_for(check: Callable[[], Awaitable[bool]], *, within: float = 30) -> None:
    """Poll `check` until it holds; fail after `within` seconds."""
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 - database state offers no event to await
            await anyio.sleep(0.02)
